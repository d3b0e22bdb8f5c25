"""fprop and bprop: ``y = x @ W`` and ``dx = dy @ W.T`` with block-sparse ``W``.

One program computes a tile ``[BM tokens, G*BS features]`` of the output (or a ``BN``-wide slice of
one block): the output group of one segment of the layout core's xprop table (see
:mod:`blocksparse.layout`), for one tile of tokens.
It walks the segment's entries; each entry names one input block ``inp`` and up to ``G`` weight
blocks, so the ``[BM, BS]`` input tile it loads feeds ``G`` output blocks at once.

Both activation layouts are served by strides: token ``n``, feature ``f`` lives at
``n * stride_n + f * stride_f``  ((N, C): ``stride_f == 1``; (C, N): ``stride_n == 1``).
The weight is packed ``(blocks, BS, BS)`` (or ``PACK x PACK`` blocks a stored block:
:mod:`.packing`); ``TRANS_W`` multiplies by each block's transpose (bprop).
Where ``has_bias`` (fprop into a non-atomic output), ``BIAS`` (per output feature, in the
activations' dtype) is added to the float32 sums before they are rounded and stored: no separate
pass over the output.

Split reductions: ``ATOMIC`` adds the segments' sums into a zeroed float32 ``Y`` (cast afterwards);
``TICKET`` reduces them in the kernel through ``WS`` / ``COUNTERS`` (:mod:`.ticket`; ``OFFSETS``, the
table's CSR over headers, gives each group's segment count) and writes ``Y`` in its own dtype.

Few tokens (memory bound): ``KB`` entries per step (``G == 1``) -- one ``[BM, KB*BS]`` gather of
activations times one ``[KB*BS, BN]`` gather of weight rows -- so that a program has ``KB`` blocks'
bytes in flight per dependent table load instead of one; and each output block may be split into
``BS // BN`` slices of ``BN`` features, one program each (more programs, no atomics).
"""
import triton
import triton.language as tl

from .packing import block_offset
from .ticket import add_part


@triton.jit
def _weight_slab(W, entry, offs_r, i_n, BS: tl.constexpr, BN: tl.constexpr, G: tl.constexpr,
                 TRANS_W: tl.constexpr, PACK: tl.constexpr):
    """Load the ``[BS, G*BN]`` slab of weight blocks named by one table entry (zeros for -1):
    columns ``i_n*BN ..`` of its one block (``G == 1``), or its ``G`` whole blocks."""
    RS: tl.constexpr = PACK * BS  # elements between a block's rows
    if G == 1:
        blk = tl.load(entry + 1).to(tl.int64)
        offs_c = i_n * BN + tl.arange(0, BN)
        if TRANS_W:
            ptrs = W + block_offset(blk, BS, PACK) + offs_c[None, :] * RS + offs_r[:, None]
        else:
            ptrs = W + block_offset(blk, BS, PACK) + offs_r[:, None] * RS + offs_c[None, :]
        slab = tl.load(ptrs)
    else:
        offs_o = tl.arange(0, G * BS)
        blk = tl.load(entry + 1 + offs_o // BS).to(tl.int64)  # [G*BS]: block of each column
        col = offs_o % BS
        # hints: each block's columns form a run of BS, starting at a multiple of BS
        if TRANS_W:
            base = tl.multiple_of(block_offset(blk, BS, PACK) + col * RS, BS)
            ptrs = W + base[None, :] + offs_r[:, None]
        else:
            base = tl.max_contiguous(tl.multiple_of(block_offset(blk, BS, PACK) + col, BS), BS)
            ptrs = W + base[None, :] + offs_r[:, None] * RS
        slab = tl.load(ptrs, mask=blk[None, :] >= 0, other=0.0)
    return slab


@triton.jit
def _wide_step(X, W, ENTRIES, e0, end, o_m, m_m, o_c, stride_xn, stride_xf,
               BS: tl.constexpr, KB: tl.constexpr, TRANS_W: tl.constexpr, PACK: tl.constexpr):
    """The ``[BM, KB*BS]`` activations and ``[KB*BS, BN]`` weight rows of entries ``e0 .. e0+KB``
    (``G == 1``; entries past ``end`` read as zeros)."""
    o_k = tl.arange(0, KB * BS)
    r = o_k % BS
    e = e0 + o_k // BS
    valid = e < end
    inp = tl.load(ENTRIES + e * 2, mask=valid, other=0).to(tl.int64)
    blk = tl.load(ENTRIES + e * 2 + 1, mask=valid, other=-1).to(tl.int64)
    feat = tl.max_contiguous(tl.multiple_of(inp * BS + r, BS), BS)
    b_x = tl.load(X + o_m[:, None].to(tl.int64) * stride_xn + feat[None, :] * stride_xf,
                  mask=m_m[:, None] & valid[None, :], other=0.0)
    RS: tl.constexpr = PACK * BS  # elements between a block's rows
    if TRANS_W:
        rows = tl.max_contiguous(tl.multiple_of(block_offset(blk, BS, PACK) + r, BS), BS)
        ptrs = W + rows[:, None] + o_c[None, :] * RS
    else:
        ptrs = W + (block_offset(blk, BS, PACK) + r * RS)[:, None] + o_c[None, :]
    b_w = tl.load(ptrs, mask=(blk >= 0)[:, None], other=0.0)
    return b_x, b_w


@triton.jit
def xprop_kernel(
    X, W, Y, HEADERS, ENTRIES,
    N, OUT_FEATURES, num_segments,
    stride_xn, stride_xf, stride_yn, stride_yf, BIAS, has_bias, WS, COUNTERS, OFFSETS,
    BS: tl.constexpr, G: tl.constexpr, BM: tl.constexpr,
    TRANS_W: tl.constexpr, ATOMIC: tl.constexpr, PRECISION: tl.constexpr,
    KB: tl.constexpr, BN: tl.constexpr, TICKET: tl.constexpr = False, PACK: tl.constexpr = 1,
):
    # segments vary fastest, then output slices: programs running together share a token tile of x
    NS: tl.constexpr = BS // BN
    tl.static_assert(NS == 1 or G == 1, "output slices (BN < BS) take G = 1")
    tl.static_assert(KB == 1 or G == 1, "several entries a step (KB > 1) take G = 1")
    i_s = tl.program_id(0) % num_segments
    i_n = (tl.program_id(0) // num_segments) % NS
    i_m = tl.program_id(0) // (num_segments * NS)
    header = HEADERS + i_s * 4
    group = tl.load(header)
    start = tl.load(header + 1)
    count = tl.load(header + 2)

    o_m = i_m * BM + tl.arange(0, BM)
    o_r = tl.arange(0, BS)
    m_m = o_m < N

    acc = tl.zeros((BM, G * BN), dtype=tl.float32)
    if KB > 1:
        o_c = i_n * BN + tl.arange(0, BN)
        for e0 in range(start, start + count, KB):
            b_x, b_w = _wide_step(X, W, ENTRIES, e0, start + count, o_m, m_m, o_c, stride_xn, stride_xf,
                                  BS, KB, TRANS_W, PACK)
            # [BM, KB*BS] @ [KB*BS, BN] -> [BM, BN]
            acc = tl.dot(b_x, b_w, acc, input_precision=PRECISION)
    else:
        p_x = X + o_m[:, None].to(tl.int64) * stride_xn + o_r[None, :] * stride_xf
        for e in range(start, start + count):
            entry = ENTRIES + e * (1 + G)
            inp = tl.load(entry).to(tl.int64)
            b_x = tl.load(p_x + inp * BS * stride_xf, mask=m_m[:, None], other=0.0)
            b_w = _weight_slab(W, entry, o_r, i_n, BS, BN, G, TRANS_W, PACK)
            # [BM, BS] @ [BS, G*BN] -> [BM, G*BN]
            acc = tl.dot(b_x, b_w, acc, input_precision=PRECISION)

    if NS == 1:
        o_f = group * (G * BS) + tl.arange(0, G * BS)
    else:
        o_f = group * BS + i_n * BN + tl.arange(0, BN)
    p_y = Y + o_m[:, None].to(tl.int64) * stride_yn + o_f[None, :] * stride_yf
    m_y = m_m[:, None] & (o_f[None, :] < OUT_FEATURES)
    if ATOMIC:  # several segments share this output group: Y is a zeroed float32 buffer
        tl.atomic_add(p_y, acc, mask=m_y, sem="relaxed")
    else:
        last = True
        if TICKET:  # several segments may share it: the last to finish writes Y (see .ticket)
            parts = tl.load(OFFSETS + group + 1) - tl.load(OFFSETS + group)
            p_ws = WS + o_m[:, None].to(tl.int64) * stride_yn + o_f[None, :] * stride_yf
            last, acc = add_part(acc, p_ws, m_y, COUNTERS + ticket_index(i_m, group, 0, i_n, OUT_FEATURES, BS, G, NS),
                                 parts)
        if last:
            if has_bias:
                acc += tl.load(BIAS + o_f, mask=o_f < OUT_FEATURES, other=0.0).to(tl.float32)[None, :]
            tl.store(p_y, acc.to(Y.dtype.element_ty), mask=m_y)


@triton.jit
def ticket_index(i_m, group, j, i_n, OUT_FEATURES, BS: tl.constexpr, G: tl.constexpr, NS: tl.constexpr):
    """The ticket counter of output block ``j`` of ``group``, slice ``i_n``, token tile ``i_m``:
    ``ticket_counters`` of them per call."""
    groups = tl.cdiv(OUT_FEATURES // BS, G)
    return ((i_m * groups + group) * G + j) * NS + i_n
