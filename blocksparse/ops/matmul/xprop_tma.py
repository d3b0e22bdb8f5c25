"""fprop and bprop with tensor-memory-accelerator (TMA) loads: Hopper and newer.

Same work split and table walk as :mod:`.xprop`, but tiles move through tensor descriptors: no
per-element address registers, and out-of-range rows (the last token tile) or a missing weight
block (block id ``-1``, a negative row) are zero-filled by the copy engine.  Each of the ``G``
output blocks of a program has its own ``[BM, BS]`` accumulator (``G`` in 1, 2, 4).

Each entry's reduction of ``BS`` features runs in ``BS // BK`` steps of ``BK``: smaller pipeline
stages, so more of them fit in shared memory.  Each output block may be split into ``BS // BN``
slices of ``BN`` features, one program each: more programs when tokens are few (memory-bound
calls), without the atomics a split reduction needs.

Descriptors (built by the launcher): ``x_desc`` over the activations in storage order, block
``[BM, BK]`` for (N, F) or ``[BK, BM]`` for (F, N) (``X_T``); ``w_desc`` over the packed weight
viewed as ``(blocks * BS // PACK, PACK * BS)`` (:mod:`.packing`), block ``[BK, BN]`` (``[BN, BK]``
with ``TRANS_W``); ``y_desc``
over the output, block ``[BM, BN]`` (``[BN, BM]``)
(``Y`` with its strides serves the float32 atomics of split groups instead).  ``BIAS`` /
``has_bias``: as in :mod:`.xprop`, added before the store; ``ATOMIC`` / ``TICKET`` split reductions
(``WS``, ``COUNTERS``, ``OFFSETS``) as there, one ticket per output block.

``PREFETCH``: walk the table one step ahead -- each step loads the entry of the next step, and its
tile loads use the entry loaded by the step before.  Triton's pipeliner gives a tile load whose
address waits on a table load of the same step ``(num_stages - 1) // 2`` steps of lead (one
buffer in flight at ``num_stages`` 2-4); with the entry carried in registers it gives
``num_stages - 1`` (checked by compiling for sm_90: ``num_stages`` buffers of each tile).
"""
import triton
import triton.language as tl

from .packing import block_origin
from .ticket import add_part
from .xprop import ticket_index


@triton.jit
def _x_tile(x_desc, i_m, col, BM: tl.constexpr, X_T: tl.constexpr):
    """The [BM, BK] tile of activations at feature ``col``."""
    if X_T:
        t = x_desc.load([col, i_m * BM]).T            # [BK, BM] -> [BM, BK]
    else:
        t = x_desc.load([i_m * BM, col])
    return t


@triton.jit
def _w_tile(w_desc, blk, h, i_n, BS: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
            TRANS_W: tl.constexpr, PACK: tl.constexpr):
    """Rows ``h*BK ..`` x columns ``i_n*BN ..`` of block ``blk`` (or of its transpose): [BK, BN]."""
    row, col = block_origin(blk, BS, PACK)
    if TRANS_W:
        b = w_desc.load([row + i_n * BN, col + h * BK]).T   # [BN, BK] -> [BK, BN]
    else:
        b = w_desc.load([row + h * BK, col + i_n * BN])     # a missing block (-1) reads as zeros
    return b


@triton.jit
def _entry(ENTRIES, e, valid, G: tl.constexpr):
    """(input block row, weight blocks 0-3) of table entry ``e`` (the unused blocks past ``G``: 0;
    nothing is read where not ``valid``)."""
    entry = ENTRIES + e * (1 + G)
    row = tl.load(entry, mask=valid, other=0)
    b0 = tl.load(entry + 1, mask=valid, other=0)
    b1, b2, b3 = b0, b0, b0  # (used only where G says)
    if G > 1:
        b1 = tl.load(entry + 2, mask=valid, other=0)
    if G > 2:
        b2 = tl.load(entry + 3, mask=valid, other=0)
        b3 = tl.load(entry + 4, mask=valid, other=0)
    return row, b0, b1, b2, b3


@triton.jit
def _dots(b_x, w_desc, b0, b1, b2, b3, h, i_n, acc0, acc1, acc2, acc3, BS: tl.constexpr, G: tl.constexpr,
          BK: tl.constexpr, BN: tl.constexpr, TRANS_W: tl.constexpr, PRECISION: tl.constexpr, PACK: tl.constexpr):
    """``acc_j += b_x @ (step h of weight block b_j)`` for the group's ``G`` output blocks."""
    acc0 = tl.dot(b_x, _w_tile(w_desc, b0, h, i_n, BS, BK, BN, TRANS_W, PACK), acc0, input_precision=PRECISION)
    if G > 1:
        acc1 = tl.dot(b_x, _w_tile(w_desc, b1, h, i_n, BS, BK, BN, TRANS_W, PACK), acc1, input_precision=PRECISION)
    if G > 2:
        acc2 = tl.dot(b_x, _w_tile(w_desc, b2, h, i_n, BS, BK, BN, TRANS_W, PACK), acc2, input_precision=PRECISION)
        acc3 = tl.dot(b_x, _w_tile(w_desc, b3, h, i_n, BS, BK, BN, TRANS_W, PACK), acc3, input_precision=PRECISION)
    return acc0, acc1, acc2, acc3


@triton.jit
def _put(y_desc, Y, acc, i_m, f0, N, OUT_FEATURES, stride_yn, stride_yf, BIAS, has_bias, WS, COUNTERS, ticket, parts,
         BM: tl.constexpr, BN: tl.constexpr, X_T: tl.constexpr, ATOMIC: tl.constexpr, TICKET: tl.constexpr):
    """Write the [BM, BN] tile ``acc`` at token tile ``i_m``, output feature ``f0`` (plus the bias
    where ``has_bias``); with ``TICKET``, once the ``parts`` programs of the tile are in (counter
    ``ticket`` of ``COUNTERS``)."""
    o_f = f0 + tl.arange(0, BN)
    o_m = i_m * BM + tl.arange(0, BM)
    mask = (o_m[:, None] < N) & (o_f[None, :] < OUT_FEATURES)
    if ATOMIC:  # several segments share the group: Y is a zeroed float32 buffer
        p_y = Y + o_m[:, None].to(tl.int64) * stride_yn + o_f[None, :] * stride_yf
        tl.atomic_add(p_y, acc, mask=mask, sem="relaxed")
    else:
        last = True
        if TICKET:  # several segments may share it: the last to finish writes Y (see .ticket)
            p_ws = WS + o_m[:, None].to(tl.int64) * stride_yn + o_f[None, :] * stride_yf
            last, acc = add_part(acc, p_ws, mask, COUNTERS + ticket, parts)
        if last:
            if has_bias:
                acc += tl.load(BIAS + o_f, mask=o_f < OUT_FEATURES, other=0.0).to(tl.float32)[None, :]
            if X_T:
                y_desc.store([f0, i_m * BM], acc.T.to(y_desc.dtype))
            else:
                y_desc.store([i_m * BM, f0], acc.to(y_desc.dtype))


@triton.jit
def xprop_tma_kernel(
    x_desc, w_desc, y_desc, Y, HEADERS, ENTRIES, num_segments, N, OUT_FEATURES, stride_yn, stride_yf,
    BIAS, has_bias, WS, COUNTERS, OFFSETS,
    BS: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
    X_T: tl.constexpr,
    TRANS_W: tl.constexpr, ATOMIC: tl.constexpr, PRECISION: tl.constexpr,
    UNROLL: tl.constexpr = 1, TICKET: tl.constexpr = False, PREFETCH: tl.constexpr = False,
    PACK: tl.constexpr = 1,
):
    # segments vary fastest, then output slices: programs running together share a token tile
    NS: tl.constexpr = BS // BN
    i_s = tl.program_id(0) % num_segments
    i_n = (tl.program_id(0) // num_segments) % NS
    i_m = tl.program_id(0) // (num_segments * NS)
    header = HEADERS + i_s * 4
    group = tl.load(header)
    start = tl.load(header + 1)
    count = tl.load(header + 2)

    acc0 = tl.zeros((BM, BN), dtype=tl.float32)
    if G > 1:
        acc1 = tl.zeros((BM, BN), dtype=tl.float32)
    if G > 2:
        acc2 = tl.zeros((BM, BN), dtype=tl.float32)
        acc3 = tl.zeros((BM, BN), dtype=tl.float32)
    # each entry's reduction is walked in BS // BK steps, so that pipeline stages stay small
    KS: tl.constexpr = BS // BK
    if PREFETCH:
        lo, hi = start * KS, (start + count) * KS
        e_row, e_b0, e_b1, e_b2, e_b3 = _entry(ENTRIES, start, count > 0, G)  # (none read if empty)
        if G < 2:  # stand-ins for the accumulators the group lacks (never updated)
            acc1 = acc0
        if G < 4:
            acc2, acc3 = acc0, acc0
        for t in tl.range(lo, hi, loop_unroll_factor=UNROLL):
            # this step's entry came with the last step; load the next one's
            row, b0, b1, b2, b3 = e_row, e_b0, e_b1, e_b2, e_b3
            e_row, e_b0, e_b1, e_b2, e_b3 = _entry(ENTRIES, (t + 1) // KS, t + 1 < hi, G)
            acc0, acc1, acc2, acc3 = _dots(_x_tile(x_desc, i_m, row * BS + (t % KS) * BK, BM, X_T), w_desc,
                                           b0, b1, b2, b3, t % KS, i_n, acc0, acc1, acc2, acc3,
                                           BS, G, BK, BN, TRANS_W, PRECISION, PACK)
    else:  # the table loads where used: the tiles get (num_stages - 1) // 2 steps of lead
        for t in tl.range(start * KS, (start + count) * KS, loop_unroll_factor=UNROLL):
            entry = ENTRIES + (t // KS) * (1 + G)
            h = t % KS
            b_x = _x_tile(x_desc, i_m, tl.load(entry) * BS + h * BK, BM, X_T)
            # [BM, BK] @ [BK, BN] -> [BM, BN], once per output block of the group
            acc0 = tl.dot(b_x, _w_tile(w_desc, tl.load(entry + 1), h, i_n, BS, BK, BN, TRANS_W, PACK), acc0,
                          input_precision=PRECISION)
            if G > 1:
                acc1 = tl.dot(b_x, _w_tile(w_desc, tl.load(entry + 2), h, i_n, BS, BK, BN, TRANS_W, PACK), acc1,
                              input_precision=PRECISION)
            if G > 2:
                acc2 = tl.dot(b_x, _w_tile(w_desc, tl.load(entry + 3), h, i_n, BS, BK, BN, TRANS_W, PACK), acc2,
                              input_precision=PRECISION)
                acc3 = tl.dot(b_x, _w_tile(w_desc, tl.load(entry + 4), h, i_n, BS, BK, BN, TRANS_W, PACK), acc3,
                              input_precision=PRECISION)

    # columns past the last output block are clipped by the descriptor's shape
    parts = 1
    if TICKET:
        parts = tl.load(OFFSETS + group + 1) - tl.load(OFFSETS + group)
    _put(y_desc, Y, acc0, i_m, (group * G) * BS + i_n * BN, N, OUT_FEATURES, stride_yn, stride_yf, BIAS, has_bias,
         WS, COUNTERS, ticket_index(i_m, group, 0, i_n, OUT_FEATURES, BS, G, NS), parts, BM, BN, X_T, ATOMIC, TICKET)
    if G > 1:
        _put(y_desc, Y, acc1, i_m, (group * G + 1) * BS + i_n * BN, N, OUT_FEATURES, stride_yn, stride_yf, BIAS,
             has_bias, WS, COUNTERS, ticket_index(i_m, group, 1, i_n, OUT_FEATURES, BS, G, NS), parts, BM, BN, X_T,
             ATOMIC, TICKET)
    if G > 2:
        _put(y_desc, Y, acc2, i_m, (group * G + 2) * BS + i_n * BN, N, OUT_FEATURES, stride_yn, stride_yf, BIAS,
             has_bias, WS, COUNTERS, ticket_index(i_m, group, 2, i_n, OUT_FEATURES, BS, G, NS), parts, BM, BN, X_T,
             ATOMIC, TICKET)
        _put(y_desc, Y, acc3, i_m, (group * G + 3) * BS + i_n * BN, N, OUT_FEATURES, stride_yn, stride_yf, BIAS,
             has_bias, WS, COUNTERS, ticket_index(i_m, group, 3, i_n, OUT_FEATURES, BS, G, NS), parts, BM, BN, X_T,
             ATOMIC, TICKET)
