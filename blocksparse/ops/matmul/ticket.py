"""Split reductions finished inside the kernel ("tickets").

Where several programs share one output tile (a long fprop / bprop reduction cut into segments, an
updat's token slices), each adds its float32 partial sums into a workspace laid out like the output,
then takes a ticket from the tile's counter; the program that takes the last ticket reads the whole
sum back, resets the workspace tile and the counter to zero, and writes the output itself, in the
output's dtype, with the bias where there is one.  No zero fill before the kernel and no cast after
it: one launch.  The workspace and counters must be zero when a launch starts; each launch leaves
them so (the callers keep one zeroed pair per device and stream, grown as needed).

Ordering: every thread's atomic adds come before the CTA barrier, which comes before thread 0's
acquire-release increment of the counter (gpu scope); the last program reads the sums with atomics
(at the L2, after its own acquire), then stores zeros over them.
"""
import triton
import triton.language as tl


@triton.jit
def add_part(acc, p_ws, mask, counter, parts):
    """Add this program's partial sums ``acc`` (at workspace pointers ``p_ws``, where ``mask``) to
    those of the other ``parts - 1`` programs of its tile, whose ticket counter is ``counter``.
    Returns ``(last, total)``: whether this program finishes the tile, and then the whole sum."""
    last = parts <= 1
    total = acc
    if parts > 1:
        tl.atomic_add(p_ws, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()  # every thread's sums are in before the ticket is taken
        ticket = tl.atomic_add(counter, 1, sem="acq_rel")
        last = ticket == parts - 1
        if last:  # read the sums at the L2 (an atomic add of zero returns them), then reset
            total = tl.atomic_add(p_ws, tl.zeros_like(acc), mask=mask, sem="relaxed")
            tl.store(p_ws, tl.zeros_like(acc), mask=mask)
            tl.atomic_xchg(counter, 0, sem="relaxed")
    return last, total
