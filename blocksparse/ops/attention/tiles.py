"""Pieces the fused attention kernels share: row-tile loads and stores, and the keep mask of a
partial tile.

Tensors are ``(B, H, S, D)`` with unit stride along ``D``.  With ``TMA`` the kernels get 4-D tensor
descriptors (block ``[1, 1, ROWS, D]``) in place of the pointers; without, pointers and the three
outer strides.  Tiles never cross the sequence end (``S`` is a multiple of every tile), so no
load is masked.
"""
import triton
import triton.language as tl


@triton.jit
def load_rows(X, i_b, i_h, row, stride_b, stride_h, stride_s,
              ROWS: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """Rows ``row .. row + ROWS - 1`` of head ``i_h`` of batch ``i_b``: [ROWS, D]."""
    if TMA:
        b_x = X.load([i_b, i_h, row, 0]).reshape(ROWS, D)
    else:
        o_r = row + tl.arange(0, ROWS)
        o_d = tl.arange(0, D)
        p_x = (X + i_b.to(tl.int64) * stride_b + i_h.to(tl.int64) * stride_h
               + o_r[:, None].to(tl.int64) * stride_s + o_d[None, :])
        b_x = tl.load(p_x)
    return b_x


@triton.jit
def store_rows(X, b_x, i_b, i_h, row, stride_b, stride_h, stride_s,
               ROWS: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """Write the [ROWS, D] tile ``b_x`` at rows ``row ..``, cast to X's dtype."""
    if TMA:
        X.store([i_b, i_h, row, 0], b_x.to(X.dtype).reshape(1, 1, ROWS, D))
    else:
        o_r = row + tl.arange(0, ROWS)
        o_d = tl.arange(0, D)
        p_x = (X + i_b.to(tl.int64) * stride_b + i_h.to(tl.int64) * stride_h
               + o_r[:, None].to(tl.int64) * stride_s + o_d[None, :])
        tl.store(p_x, b_x.to(X.dtype.element_ty))


@triton.jit
def keep_mask(o_q, o_k, seqlen, q_blk, k_blk, mask_id, MASKS,
              BS: tl.constexpr, CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr):
    """Which (query, key) pairs of a partial tile are attended.

    ``o_q`` / ``o_k`` are the tile's query and key positions shaped to broadcast against each other
    (``[BM, 1]`` and ``[1, BN]``, or transposed for a key-major tile); the result has their
    broadcast shape.  ``mask_id``: the entry's row of the element-mask table ``MASKS`` (``uint8``,
    ``(P, BS, BS)``, ``[query, key]`` within the block), or -1.
    """
    keep = (o_q >= 0) & (o_k >= 0)
    if CAUSAL:
        keep = keep & (o_q >= o_k)
    if HAS_SEQLENS:
        keep = keep & (o_k < seqlen)
    if HAS_MASKS:
        p_m = (MASKS + tl.maximum(mask_id, 0).to(tl.int64) * (BS * BS)
               + (o_q - q_blk * BS) * BS + (o_k - k_blk * BS))
        keep = keep & (tl.load(p_m, mask=keep & (mask_id >= 0), other=1) != 0)
    return keep
