"""The order in which the split layer-norm kernels (:mod:`.split_fwd`, :mod:`.split_bwd`) visit a grid
of (token tiles, feature slices, segments) and walk each slice ``R`` features at a time.

Both split forms read their activations twice: a first launch for per-slice statistics, a second for
the output.  When the first launch ends, the L2 still holds what it read last: the ends of the slices
of the programs that ran last.  ``REVERSE`` makes the second launch the first one played backwards --
programs in reverse launch order, each walking its slice from the end -- so that its first reads are
those still in the L2 rather than the ones evicted first.
"""
import triton
import triton.language as tl


@triton.jit
def slice_program(REVERSE: tl.constexpr):
    """``(token tile, slice, segment)`` of this program: in launch order, or the last one first."""
    i_n, i_p, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if REVERSE:
        i_n = tl.num_programs(0) - 1 - i_n
        i_p = tl.num_programs(1) - 1 - i_p
        i_s = tl.num_programs(2) - 1 - i_s
    return i_n, i_p, i_s


@triton.jit
def step_feature(j, lo, hi, R: tl.constexpr, REVERSE: tl.constexpr):
    """First feature of step ``j`` of the walk over ``[lo, hi)``: from ``lo`` up, or from the last
    step down (``j`` one past the walk gives a step wholly outside it, which loads nothing)."""
    if REVERSE:
        return lo + (tl.cdiv(hi - lo, R) - 1 - j) * R
    return lo + j * R
