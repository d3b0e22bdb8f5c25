"""updat with tensor-memory-accelerator (TMA) loads: Hopper and newer.

Same work split as :mod:`.updat` (one run of ``updat_groups(G)`` x one token slice per program),
with the ``[BK, BS]`` tiles of ``x`` and ``dy`` moved by tensor descriptors; each of the ``G``
blocks has its own ``[BS, BS]`` accumulator (``G`` in 1, 2, 4).  A padding entry (``k = -1``)
reads zeros and is never stored.  ``PACK``: the weight's packing (:mod:`.packing`): where ``dw`` is
written.

Descriptors: ``x_desc`` / ``dy_desc`` over the activations in storage order, block ``[BK, BS]``
for (N, F) or ``[BS, BK]`` for (F, N) (``X_T``).  The gradient is written through pointers;
token slices are reduced as in :mod:`.updat` (``TICKET``: one ticket per block, ``G`` per row).
"""
import triton
import triton.language as tl

from .packing import block_offset
from .ticket import add_part


@triton.jit
def _tile(desc, n0, f, BK: tl.constexpr, BS: tl.constexpr, X_T: tl.constexpr):
    if X_T:
        t = desc.load([f * BS, n0]).T                   # [BS, BK] -> [BK, BS]
    else:
        t = desc.load([n0, f * BS])
    return t


@triton.jit
def _put(DW, acc, blk, WS, COUNTERS, ticket, BS: tl.constexpr, ATOMIC: tl.constexpr, TICKET: tl.constexpr,
         PACK: tl.constexpr):
    o = tl.arange(0, BS)
    offsets = block_offset(blk.to(tl.int64), BS, PACK) + o[:, None] * (PACK * BS) + o[None, :]
    if blk >= 0:
        if ATOMIC:
            tl.atomic_add(DW + offsets, acc, sem="relaxed")
        else:
            last = True
            if TICKET:  # the last slice to finish writes dW (see .ticket)
                full = tl.full((BS, BS), 1, tl.int1)
                last, acc = add_part(acc, WS + offsets, full, COUNTERS + ticket, tl.num_programs(1))
            if last:
                tl.store(DW + offsets, acc.to(DW.dtype.element_ty))


@triton.jit
def updat_tma_kernel(
    x_desc, dy_desc, DW, GROUPS, tokens_per_split, N, WS, COUNTERS,
    BS: tl.constexpr, G: tl.constexpr, BK: tl.constexpr, X_T: tl.constexpr,
    ATOMIC: tl.constexpr, PRECISION: tl.constexpr, TICKET: tl.constexpr = False, PACK: tl.constexpr = 1,
):
    i_g = tl.program_id(0)
    i_s = tl.program_id(1)
    row = GROUPS + i_g * (1 + 2 * G)
    c = tl.load(row)
    k0 = tl.load(row + 1)
    if G > 1:
        k1 = tl.load(row + 2)
    if G > 2:
        k2 = tl.load(row + 3)
        k3 = tl.load(row + 4)

    n_lo = i_s * tokens_per_split
    n_hi = tl.minimum(n_lo + tokens_per_split, N)   # slices are multiples of BK; N clips the last
    acc0 = tl.zeros((BS, BS), dtype=tl.float32)
    if G > 1:
        acc1 = tl.zeros((BS, BS), dtype=tl.float32)
    if G > 2:
        acc2 = tl.zeros((BS, BS), dtype=tl.float32)
        acc3 = tl.zeros((BS, BS), dtype=tl.float32)
    for n0 in range(n_lo, n_hi, BK):
        b_xt = _tile(x_desc, n0, c, BK, BS, X_T).T
        # [BS, BK] @ [BK, BS] -> [BS, BS], once per block of the run
        acc0 = tl.dot(b_xt, _tile(dy_desc, n0, k0, BK, BS, X_T), acc0, input_precision=PRECISION)
        if G > 1:
            acc1 = tl.dot(b_xt, _tile(dy_desc, n0, k1, BK, BS, X_T), acc1, input_precision=PRECISION)
        if G > 2:
            acc2 = tl.dot(b_xt, _tile(dy_desc, n0, k2, BK, BS, X_T), acc2, input_precision=PRECISION)
            acc3 = tl.dot(b_xt, _tile(dy_desc, n0, k3, BK, BS, X_T), acc3, input_precision=PRECISION)

    # one ticket per block of the run (a padding block takes none)
    _put(DW, acc0, tl.load(row + 1 + G), WS, COUNTERS, i_g * G, BS, ATOMIC, TICKET, PACK)
    if G > 1:
        _put(DW, acc1, tl.load(row + 2 + G), WS, COUNTERS, i_g * G + 1, BS, ATOMIC, TICKET, PACK)
    if G > 2:
        _put(DW, acc2, tl.load(row + 3 + G), WS, COUNTERS, i_g * G + 2, BS, ATOMIC, TICKET, PACK)
        _put(DW, acc3, tl.load(row + 4 + G), WS, COUNTERS, i_g * G + 3, BS, ATOMIC, TICKET, PACK)

