"""fprop and bprop: ``y = x @ W`` and ``dx = dy @ W.T`` with block-sparse ``W``.

One program computes a tile ``[BM tokens, G*BS features]`` of the output: the output group of one
segment of the layout core's xprop table (see :mod:`blocksparse.layout`), for one tile of tokens.
It walks the segment's entries; each entry names one input block ``inp`` and up to ``G`` weight
blocks, so the ``[BM, BS]`` input tile it loads feeds ``G`` output blocks at once.

Both activation layouts are served by strides: token ``n``, feature ``f`` lives at
``n * stride_n + f * stride_f``  ((N, C): ``stride_f == 1``; (C, N): ``stride_n == 1``).
The weight is packed ``(blocks, BS, BS)``; ``TRANS_W`` multiplies by each block's transpose (bprop).
Where ``has_bias`` (fprop into a non-atomic output), ``BIAS`` (per output feature, in the
activations' dtype) is added to the float32 sums before they are rounded and stored: no separate
pass over the output.
"""
import triton
import triton.language as tl


@triton.jit
def _weight_slab(W, entry, offs_r, BS: tl.constexpr, G: tl.constexpr, TRANS_W: tl.constexpr):
    """Load the ``[BS, G*BS]`` slab of weight blocks named by one table entry (zeros for -1)."""
    if G == 1:
        blk = tl.load(entry + 1).to(tl.int64)
        offs_c = tl.arange(0, BS)
        if TRANS_W:
            ptrs = W + blk * BS * BS + offs_c[None, :] * BS + offs_r[:, None]
        else:
            ptrs = W + blk * BS * BS + offs_r[:, None] * BS + offs_c[None, :]
        slab = tl.load(ptrs)
    else:
        offs_o = tl.arange(0, G * BS)
        blk = tl.load(entry + 1 + offs_o // BS).to(tl.int64)  # [G*BS]: block of each column
        col = offs_o % BS
        # hints: each block's columns form a run of BS, starting at a multiple of BS
        if TRANS_W:
            base = tl.multiple_of(blk * BS * BS + col * BS, BS)
            ptrs = W + base[None, :] + offs_r[:, None]
        else:
            base = tl.max_contiguous(tl.multiple_of(blk * BS * BS + col, BS), BS)
            ptrs = W + base[None, :] + offs_r[:, None] * BS
        slab = tl.load(ptrs, mask=blk[None, :] >= 0, other=0.0)
    return slab


@triton.jit
def xprop_kernel(
    X, W, Y, HEADERS, ENTRIES,
    N, OUT_FEATURES, num_segments,
    stride_xn, stride_xf, stride_yn, stride_yf, BIAS, has_bias,
    BS: tl.constexpr, G: tl.constexpr, BM: tl.constexpr,
    TRANS_W: tl.constexpr, ATOMIC: tl.constexpr, PRECISION: tl.constexpr,
):
    # segments vary fastest: programs running together share one token tile of x (L2 reuse)
    i_s = tl.program_id(0) % num_segments
    i_m = tl.program_id(0) // num_segments
    header = HEADERS + i_s * 4
    group = tl.load(header)
    start = tl.load(header + 1)
    count = tl.load(header + 2)

    o_m = i_m * BM + tl.arange(0, BM)
    o_r = tl.arange(0, BS)
    m_m = o_m < N
    p_x = X + o_m[:, None].to(tl.int64) * stride_xn + o_r[None, :] * stride_xf

    acc = tl.zeros((BM, G * BS), dtype=tl.float32)
    for e in range(start, start + count):
        entry = ENTRIES + e * (1 + G)
        inp = tl.load(entry).to(tl.int64)
        b_x = tl.load(p_x + inp * BS * stride_xf, mask=m_m[:, None], other=0.0)
        b_w = _weight_slab(W, entry, o_r, BS, G, TRANS_W)
        # [BM, BS] @ [BS, G*BS] -> [BM, G*BS]
        acc = tl.dot(b_x, b_w, acc, input_precision=PRECISION)

    o_f = group * (G * BS) + tl.arange(0, G * BS)
    p_y = Y + o_m[:, None].to(tl.int64) * stride_yn + o_f[None, :] * stride_yf
    m_y = m_m[:, None] & (o_f[None, :] < OUT_FEATURES)
    if ATOMIC:  # several segments share this output group: Y is a zeroed float32 buffer
        tl.atomic_add(p_y, acc, mask=m_y, sem="relaxed")
    else:
        if has_bias:
            acc += tl.load(BIAS + o_f, mask=o_f < OUT_FEATURES, other=0.0).to(tl.float32)[None, :]
        tl.store(p_y, acc.to(Y.dtype.element_ty), mask=m_y)
