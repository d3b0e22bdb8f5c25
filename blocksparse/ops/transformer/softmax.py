"""The block-sparse masked softmax and its gradient, on the tables of :mod:`.lut`.

One program owns one query block row of one (batch, head): the ``BS`` query rows of query block
``q`` across its blocks ``row_offsets[h, q] : row_offsets[h, q + 1]`` (consecutive ids).  The
statistics (row max and row sum, or ``sum(dy * y)``) are float32.

Elements the softmax drops: where the block's in-block mask (``MASK_INDEX`` / ``MASK_BITS``, with
``HAS_MASK``) has a 0, and with ``AUTOREGRESS`` where key position ``kp > qp`` and
``kp >= ar_key``.  Dropped elements get probability 0; a query row with no kept element (no block,
or every element dropped) gets 0 everywhere, never NaN.

Gradient: ``dx = (dy - sum_row(dy * y)) * y * scale``.
"""
import triton
import triton.language as tl

from .products import walk


@triton.jit
def _keep(MASK_INDEX, MASK_BITS, lut_b, i_q, i_k, ar_key, o_r,
          BS: tl.constexpr, WORDS: tl.constexpr, HAS_MASK: tl.constexpr, AUTOREGRESS: tl.constexpr):
    """``[BS, BS]`` booleans: the elements of block ``lut_b`` (at ``(i_q, i_k)``) that are kept."""
    keep = (o_r[:, None] >= 0) & (o_r[None, :] >= 0)
    if HAS_MASK:
        i_m = tl.load(MASK_INDEX + lut_b).to(tl.int64)
        # -1: no stored mask, every bit set
        b_bits = tl.load(MASK_BITS + i_m * BS * WORDS + o_r[:, None] * WORDS + (o_r // 32)[None, :],
                         mask=i_m >= 0, other=-1)
        keep = ((b_bits >> (o_r % 32)[None, :]) & 1) != 0
    if AUTOREGRESS:
        o_qp = i_q * BS + o_r
        o_kp = i_k * BS + o_r
        keep = keep & ((o_kp[None, :] <= o_qp[:, None]) | (o_kp[None, :] < ar_key))
    return keep


@triton.jit
def _scores(COORDS, MASK_INDEX, MASK_BITS, i_b, lut_b, p_x, o_r, scale, ar_key,
            BS: tl.constexpr, WORDS: tl.constexpr, HAS_MASK: tl.constexpr, AUTOREGRESS: tl.constexpr):
    """Block ``i_b``'s scores times ``scale`` in float32, ``-inf`` where dropped."""
    b_s = tl.load(p_x + i_b * BS * BS).to(tl.float32) * scale
    if HAS_MASK or AUTOREGRESS:
        i_q = tl.load(COORDS + lut_b * 2).to(tl.int64)
        i_k = tl.load(COORDS + lut_b * 2 + 1).to(tl.int64)
        keep = _keep(MASK_INDEX, MASK_BITS, lut_b, i_q, i_k, ar_key, o_r, BS, WORDS, HAS_MASK, AUTOREGRESS)
        b_s = tl.where(keep, b_s, float("-inf"))
    return b_s


@triton.jit
def bst_softmax_kernel(
    X, Y, ROW_OFFSETS, COORDS, MASK_INDEX, MASK_BITS,
    scale, ar_key, blocks, heads, lut_heads, q_blocks,
    BS: tl.constexpr, WORDS: tl.constexpr, HAS_MASK: tl.constexpr, AUTOREGRESS: tl.constexpr,
):
    i_q = tl.program_id(0)
    i_nh = tl.program_id(1)
    lut_h, start, end = walk(ROW_OFFSETS, i_q, i_nh, heads, lut_heads, q_blocks)

    o_r = tl.arange(0, BS)
    o_blk = o_r[:, None] * BS + o_r[None, :]
    p_x = X + i_nh.to(tl.int64) * blocks * BS * BS + o_blk
    p_y = Y + i_nh.to(tl.int64) * blocks * BS * BS + o_blk
    # online max and sum over the row's blocks; a max of -inf (nothing kept yet) shifts by 0
    b_m = tl.full((BS,), float("-inf"), tl.float32)
    b_l = tl.zeros((BS,), dtype=tl.float32)
    for i_b in range(start, end):
        b_s = _scores(COORDS, MASK_INDEX, MASK_BITS, i_b, lut_h * blocks + i_b, p_x, o_r, scale, ar_key,
                      BS, WORDS, HAS_MASK, AUTOREGRESS)
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_shift = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_l = b_l * tl.exp(b_m - b_shift) + tl.sum(tl.exp(b_s - b_shift[:, None]), axis=1)
        b_m = b_m_new

    b_shift = tl.where(b_m == float("-inf"), 0.0, b_m)
    # an empty row: 0, not 0 / 0; a NaN sum (an inf or NaN score kept) makes the row NaN, as torch.softmax
    b_inv = 1.0 / tl.where(b_l == 0.0, float("inf"), b_l)
    for i_b in range(start, end):
        b_s = _scores(COORDS, MASK_INDEX, MASK_BITS, i_b, lut_h * blocks + i_b, p_x, o_r, scale, ar_key,
                      BS, WORDS, HAS_MASK, AUTOREGRESS)
        b_y = tl.exp(b_s - b_shift[:, None]) * b_inv[:, None]
        tl.store(p_y + i_b * BS * BS, b_y.to(Y.dtype.element_ty))


@triton.jit
def bst_softmax_grad_kernel(
    DY, Y, DX, ROW_OFFSETS,
    scale, blocks, heads, lut_heads, q_blocks,
    BS: tl.constexpr,
):
    i_q = tl.program_id(0)
    i_nh = tl.program_id(1)
    _, start, end = walk(ROW_OFFSETS, i_q, i_nh, heads, lut_heads, q_blocks)

    o_r = tl.arange(0, BS)
    o_blk = i_nh.to(tl.int64) * blocks * BS * BS + o_r[:, None] * BS + o_r[None, :]
    b_dot = tl.zeros((BS,), dtype=tl.float32)
    for i_b in range(start, end):
        o_b = o_blk + i_b * BS * BS
        b_dot += tl.sum(tl.load(DY + o_b).to(tl.float32) * tl.load(Y + o_b).to(tl.float32), axis=1)
    for i_b in range(start, end):
        o_b = o_blk + i_b * BS * BS
        b_y = tl.load(Y + o_b).to(tl.float32)
        b_dx = (tl.load(DY + o_b).to(tl.float32) - b_dot[:, None]) * b_y * scale
        tl.store(DX + o_b, b_dx.to(DX.dtype.element_ty))
