"""updat with tensor-memory-accelerator (TMA) loads: Hopper and newer.

Same work split as :mod:`.updat` (one run of ``updat_groups(G)`` x one token slice per program),
with the ``[BK, BS]`` tiles of ``x`` and ``dy`` moved by tensor descriptors; each of the ``G``
blocks has its own ``[BS, BS]`` accumulator (``G`` in 1, 2, 4).  A padding entry (``k = -1``)
reads zeros and is never stored.  ``PACK``: the weight's packing (:mod:`.packing`): where ``dw`` is
written.

Descriptors: ``x_desc`` / ``dy_desc`` over the activations in storage order, block ``[BK, BS]``
for (N, F) or ``[BS, BK]`` for (F, N) (``X_T``).  The gradient is written through pointers;
token slices are reduced as in :mod:`.updat` (``TICKET``: one ticket per block, ``G`` per row).

``BIAS_GRAD``: the bias gradient (``dy``'s column sums) comes with it.  ``DB_FIRST`` (int32, one
per block of the table, ``G`` a row) marks one block of every output block column; the program of
a marked block also sums the ``dy`` tiles it loads anyway over its token slice and writes the
``BS`` float32 sums to row ``slice`` of ``DB`` (``(slices, out_features)``: every element written
by exactly one program; the rows are summed after).  ``dy`` is read from HBM no extra time.
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
def _column_sum(db, marked, b_dy, BIAS_GRAD: tl.constexpr):
    """``db`` plus the token sums of the ``[BK, BS]`` tile ``b_dy`` where this block is ``marked``."""
    if BIAS_GRAD:
        if marked:
            db += tl.sum(b_dy.to(tl.float32), 0)
    return db


@triton.jit
def _put_bias(DB, db, marked, k, i_s, out_features, BS: tl.constexpr, BIAS_GRAD: tl.constexpr):
    if BIAS_GRAD:
        if marked:
            tl.store(DB + i_s.to(tl.int64) * out_features + k * BS + tl.arange(0, BS), db)


@triton.jit
def updat_tma_kernel(
    x_desc, dy_desc, DW, GROUPS, tokens_per_split, N, WS, COUNTERS, DB, DB_FIRST, out_features,
    BS: tl.constexpr, G: tl.constexpr, BK: tl.constexpr, X_T: tl.constexpr,
    ATOMIC: tl.constexpr, PRECISION: tl.constexpr, TICKET: tl.constexpr = False, PACK: tl.constexpr = 1,
    BIAS_GRAD: tl.constexpr = False,
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
    # the bias gradient's column sums (BIAS_GRAD: blocks marked in DB_FIRST)
    m0, m1, m2, m3 = 0, 0, 0, 0
    if BIAS_GRAD:
        m0 = tl.load(DB_FIRST + i_g * G)
        if G > 1:
            m1 = tl.load(DB_FIRST + i_g * G + 1)
        if G > 2:
            m2 = tl.load(DB_FIRST + i_g * G + 2)
            m3 = tl.load(DB_FIRST + i_g * G + 3)
    db0 = tl.zeros((BS,), dtype=tl.float32)
    db1, db2, db3 = db0, db0, db0
    for n0 in range(n_lo, n_hi, BK):
        b_xt = _tile(x_desc, n0, c, BK, BS, X_T).T
        # [BS, BK] @ [BK, BS] -> [BS, BS], once per block of the run
        b_dy = _tile(dy_desc, n0, k0, BK, BS, X_T)
        acc0 = tl.dot(b_xt, b_dy, acc0, input_precision=PRECISION)
        db0 = _column_sum(db0, m0, b_dy, BIAS_GRAD)
        if G > 1:
            b_dy = _tile(dy_desc, n0, k1, BK, BS, X_T)
            acc1 = tl.dot(b_xt, b_dy, acc1, input_precision=PRECISION)
            db1 = _column_sum(db1, m1, b_dy, BIAS_GRAD)
        if G > 2:
            b_dy = _tile(dy_desc, n0, k2, BK, BS, X_T)
            acc2 = tl.dot(b_xt, b_dy, acc2, input_precision=PRECISION)
            db2 = _column_sum(db2, m2, b_dy, BIAS_GRAD)
            b_dy = _tile(dy_desc, n0, k3, BK, BS, X_T)
            acc3 = tl.dot(b_xt, b_dy, acc3, input_precision=PRECISION)
            db3 = _column_sum(db3, m3, b_dy, BIAS_GRAD)

    # one ticket per block of the run (a padding block takes none)
    _put(DW, acc0, tl.load(row + 1 + G), WS, COUNTERS, i_g * G, BS, ATOMIC, TICKET, PACK)
    if G > 1:
        _put(DW, acc1, tl.load(row + 2 + G), WS, COUNTERS, i_g * G + 1, BS, ATOMIC, TICKET, PACK)
    if G > 2:
        _put(DW, acc2, tl.load(row + 3 + G), WS, COUNTERS, i_g * G + 2, BS, ATOMIC, TICKET, PACK)
        _put(DW, acc3, tl.load(row + 4 + G), WS, COUNTERS, i_g * G + 3, BS, ATOMIC, TICKET, PACK)
    _put_bias(DB, db0, m0, k0, i_s, out_features, BS, BIAS_GRAD)
    if G > 1:
        _put_bias(DB, db1, m1, k1, i_s, out_features, BS, BIAS_GRAD)
    if G > 2:
        _put_bias(DB, db2, m2, k2, i_s, out_features, BS, BIAS_GRAD)
        _put_bias(DB, db3, m3, k3, i_s, out_features, BS, BIAS_GRAD)

