"""The three block-sparse products of attention, on the tables of :mod:`.lut`.

``nt``  scores ``c[n, h, b] = a[n, rows of q_b, h] @ b[n, rows of k_b, h].T`` for every block ``b``
        (sampled dense x dense: only the layout's blocks are computed), one program per block.
``nn``  ``y[n, rows of q, h] = sum over the blocks b of query row q: w[n, h, b] @ v[n, rows of k_b, h]``,
        one program per query block (the row walk, ``row_offsets``).
``tn``  ``y[n, rows of k, h] = sum over the blocks b of key column k: w[n, h, b].T @ x[n, rows of q_b, h]``,
        one program per key block (the column walk, ``col_offsets`` / ``col_blocks``).

Activations are ``(batch, ctx, heads * head_dim)`` with unit stride along features: position ``t``,
feature ``f`` of batch ``n`` lives at ``n * stride_n + t * stride_t + f``.  Packed scores are
contiguous ``(batch, heads, blocks, BS, BS)``.  Head ``h`` reads the tables of lut head
``h % lut_heads``.  The head dimension is walked in slices of ``BD`` (a power of two >= 16, masked
at the edge), so any head dimension works.
"""
import triton
import triton.language as tl


@triton.jit
def walk(OFFSETS, i_o, i_nh, heads, lut_heads, out_blocks):
    """``(lut_h, start, end)``: the lut head of program row ``i_nh`` (batch * heads + head) and the
    range of output block ``i_o``'s entries in a CSR table (``row_offsets`` or ``col_offsets``).
    int64 bounds, so that loop counters times block sizes cannot overflow."""
    lut_h = (i_nh % heads) % lut_heads
    p_off = OFFSETS + lut_h * (out_blocks + 1) + i_o
    return lut_h, tl.load(p_off).to(tl.int64), tl.load(p_off + 1).to(tl.int64)


@triton.jit
def bst_nt_kernel(
    A, B, C, COORDS,
    blocks, heads, lut_heads, head_dim,
    stride_an, stride_at, stride_bn, stride_bt,
    BS: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
):
    # blocks vary fastest: programs running together share one head's q and k (L2 reuse)
    i_b = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n, i_h = i_nh // heads, i_nh % heads
    p_coord = COORDS + ((i_h % lut_heads) * blocks + i_b) * 2
    i_q = tl.load(p_coord).to(tl.int64)
    i_k = tl.load(p_coord + 1).to(tl.int64)

    o_r = tl.arange(0, BS)
    o_d = tl.arange(0, BD)
    o_f = i_h * head_dim + o_d
    p_a = A + i_n.to(tl.int64) * stride_an + (i_q * BS + o_r)[:, None] * stride_at + o_f[None, :]
    p_b = B + i_n.to(tl.int64) * stride_bn + (i_k * BS + o_r)[:, None] * stride_bt + o_f[None, :]
    acc = tl.zeros((BS, BS), dtype=tl.float32)
    for d0 in range(0, head_dim, BD):
        m_d = (d0 + o_d) < head_dim
        b_a = tl.load(p_a + d0, mask=m_d[None, :], other=0.0)
        b_b = tl.load(p_b + d0, mask=m_d[None, :], other=0.0)
        # [BS, BD] @ [BD, BS] -> [BS, BS]
        acc = tl.dot(b_a, tl.trans(b_b), acc, input_precision=PRECISION)

    p_c = C + (i_nh.to(tl.int64) * blocks + i_b) * BS * BS + o_r[:, None] * BS + o_r[None, :]
    tl.store(p_c, acc.to(C.dtype.element_ty))


@triton.jit
def bst_xn_kernel(
    W, X, Y, OFFSETS, BLOCK_IDS, COORDS,
    blocks, heads, lut_heads, out_blocks, head_dim,
    stride_xn, stride_xt, stride_yn, stride_yt,
    BS: tl.constexpr, BD: tl.constexpr, TRANS_W: tl.constexpr, PRECISION: tl.constexpr,
):
    """``nn`` (``TRANS_W=False``: walk query rows, read ``x`` at each block's key block) and ``tn``
    (``TRANS_W=True``: walk key columns through ``BLOCK_IDS``, read ``x`` at the query block)."""
    i_o = tl.program_id(0)  # the output block: query block (nn) or key block (tn)
    i_nh = tl.program_id(1)
    i_d = tl.program_id(2)
    i_n, i_h = i_nh // heads, i_nh % heads
    lut_h, start, end = walk(OFFSETS, i_o, i_nh, heads, lut_heads, out_blocks)

    o_r = tl.arange(0, BS)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < head_dim
    p_x = X + i_n.to(tl.int64) * stride_xn + o_r[:, None] * stride_xt + (i_h * head_dim + o_d)[None, :]
    p_w = W + i_nh.to(tl.int64) * blocks * BS * BS
    if TRANS_W:  # w[b].T: element (j, i) of the tile is w[b, i, j]
        o_w = o_r[None, :] * BS + o_r[:, None]
    else:
        o_w = o_r[:, None] * BS + o_r[None, :]
    acc = tl.zeros((BS, BD), dtype=tl.float32)
    for e in range(start, end):
        if TRANS_W:
            i_b = tl.load(BLOCK_IDS + lut_h * blocks + e).to(tl.int64)
            i_x = tl.load(COORDS + (lut_h * blocks + i_b) * 2).to(tl.int64)      # q of the block
        else:
            i_b = e
            i_x = tl.load(COORDS + (lut_h * blocks + i_b) * 2 + 1).to(tl.int64)  # k of the block
        b_w = tl.load(p_w + i_b * BS * BS + o_w)
        b_x = tl.load(p_x + i_x * BS * stride_xt, mask=m_d[None, :], other=0.0)
        # [BS, BS] @ [BS, BD] -> [BS, BD]
        acc = tl.dot(b_w, b_x, acc, input_precision=PRECISION)

    p_y = Y + i_n.to(tl.int64) * stride_yn + (i_o * BS + o_r)[:, None].to(tl.int64) * stride_yt \
        + (i_h * head_dim + o_d)[None, :]
    tl.store(p_y, acc.to(Y.dtype.element_ty), mask=m_d[None, :])
