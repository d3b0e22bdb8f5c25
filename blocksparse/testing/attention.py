"""float64 numpy references of block-sparse attention (no framework import).

Everything is computed on dense ``(batch, heads, ctx_q, ctx_k)`` matrices: the packed score
tensors are scattered to their dense place first (:func:`unpack`), the dense result gathered back
(:func:`pack`), so these share no logic with any implementation under test beyond the block
coordinates of the layout.  Activations are ``(batch, ctx, heads * head_dim)`` as in the ops.

A *kept* element is one whose block is in the layout and that the in-block mask (``masks``) and the
autoregressive rule (``autoregress_at_key``) keep; the softmax of a query row runs over its kept
elements, and a row with none is all zeros.
"""
import numpy as np

__all__ = ["BAD_QUERY_KEY", "attention", "causal_layout", "diagonal_causal", "draw_attention", "kept_mask",
           "merge_heads", "nn", "nt", "pack", "present_mask", "random_layout", "softmax", "softmax_grad", "split_heads",
           "tn", "unpack"]


def random_layout(rng, heads, QB, KB, density, *, empty_rows=0):
    """A random 0/1 ``(heads, QB, KB)`` layout, the same number of blocks in every head.

    ``empty_rows``: that many query rows of every head hold no block.
    """
    rows = np.arange(QB) if not empty_rows else np.sort(rng.choice(QB, QB - empty_rows, replace=False))
    count = max(1, int(round(density * rows.size * KB)))
    lay = np.zeros((heads, QB, KB), dtype=np.int32)
    for h in range(heads):
        flat = rng.choice(rows.size * KB, count, replace=False)
        lay[h, rows[flat // KB], flat % KB] = 1
    return lay


def causal_layout(QB, heads=None):
    """Lower-triangular ``(QB, QB)`` layout, or ``(heads, QB, QB)`` when ``heads`` is given."""
    lay = np.tril(np.ones((QB, QB), dtype=np.int32))
    return lay if heads is None else np.repeat(lay[None], heads, axis=0)


def diagonal_causal(blk_shape, head, q, k, blk):
    """A ``mask_callback``: causal inside the diagonal blocks, everything elsewhere (the original
    package's test callback)."""
    return np.tril(np.ones(blk_shape, dtype=bool)) if q == k else np.ones(blk_shape, dtype=bool)


def draw_attention(rng, bst, batch, head_dim):
    """float64 numpy ``(q, k, v, do)`` for either frontend's ``BlocksparseTransformer`` ``bst``:
    ``(batch, ctx, heads * head_dim)`` with ``ctx_q`` for ``q`` and ``do``, ``ctx_k`` for ``k`` and ``v``."""
    return tuple(rng.standard_normal((batch, ctx, bst.heads * head_dim))
                 for ctx in (bst.ctx_q, bst.ctx_k, bst.ctx_k, bst.ctx_q))


#: Query / key shapes every frontend must reject with ``ValueError`` (and the message) for
#: ``causal_layout(2)``, block size 16, 2 heads, by case name.
BAD_QUERY_KEY = {
    "features": ((2, 32, 8), (2, 32, 6), "q and k must have the same features"),
    "ctx": ((2, 30, 8), (2, 32, 8), r"q must have shape \(batch, ctx_q = 32, .*got 30 positions"),
    "k-ctx": ((2, 32, 8), (2, 48, 8), r"k must have shape \(batch, ctx_k = 32, .*got 48 positions"),
    "head-dim": ((2, 32, 7), (2, 32, 7), "7 features on axis 2, not a positive multiple of 2"),
    "rank": ((32, 8), (32, 8), "q must be 3-D"),
    "batch": ((2, 32, 8), (3, 32, 8), "same batch size; got 2 and 3"),
}


def split_heads(x, heads):
    """``(N, T, H*D) -> (N, H, T, D)`` in float64."""
    x = np.asarray(x, dtype=np.float64)
    n, t, f = x.shape
    return x.reshape(n, t, heads, f // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """``(N, H, T, D) -> (N, T, H*D)``."""
    n, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(n, t, h * d)


def _head_coords(layout):
    """``(heads, blocks, 2)`` block coordinates of every head (shared layouts repeated)."""
    return layout.coords[np.arange(layout.heads) % layout.lut_heads].astype(np.int64)


def _dense_index(layout):
    """Index arrays ``(h, q_pos, k_pos)`` of every packed element, each ``(heads, blocks, bs, bs)``."""
    bs = layout.block_size
    c = _head_coords(layout)
    o = np.arange(bs)
    h = np.broadcast_to(np.arange(layout.heads)[:, None, None, None], c.shape[:2] + (bs, bs))
    q = c[:, :, 0, None, None] * bs + o[:, None]
    k = c[:, :, 1, None, None] * bs + o[None, :]
    return h, np.broadcast_to(q, h.shape), np.broadcast_to(k, h.shape)


def unpack(layout, packed):
    """Packed ``(N, H, blocks, bs, bs)`` -> dense ``(N, H, ctx_q, ctx_k)`` float64, zeros elsewhere."""
    packed = np.asarray(packed, dtype=np.float64)
    dense = np.zeros((packed.shape[0], layout.heads, layout.ctx_q, layout.ctx_k))
    h, q, k = _dense_index(layout)
    dense[:, h, q, k] = packed
    return dense


def pack(layout, dense):
    """Dense ``(N, H, ctx_q, ctx_k)`` -> packed ``(N, H, blocks, bs, bs)`` (the layout's blocks)."""
    h, q, k = _dense_index(layout)
    return np.asarray(dense)[:, h, q, k]


def present_mask(layout):
    """``(H, ctx_q, ctx_k)`` booleans: True inside the layout's blocks."""
    return unpack(layout, np.ones((1, layout.heads, layout.blocks, layout.block_size, layout.block_size)))[0] > 0


def kept_mask(layout, masks=None, autoregress_at_key=None):
    """``(H, ctx_q, ctx_k)`` booleans: the elements the masked softmax keeps.

    ``masks``: :class:`blocksparse.ops.transformer.lut.BlockMasks` or None (keep whole blocks);
    ``autoregress_at_key``: keep key ``kp`` for query ``qp`` only where ``kp <= qp or
    kp < autoregress_at_key`` (None: no such rule).
    """
    kept = present_mask(layout)
    if masks is not None:
        per_block = masks.per_block()[np.arange(layout.heads) % layout.lut_heads]
        kept &= unpack(layout, per_block[None].astype(np.float64))[0] > 0
    if autoregress_at_key is not None:
        qp = np.arange(layout.ctx_q)[:, None]
        kp = np.arange(layout.ctx_k)[None, :]
        kept &= (kp <= qp) | (kp < autoregress_at_key)
    return kept


def nt(layout, a, b):
    """Packed ``a_h @ b_h.T`` on the layout's blocks: ``(N, ctx_q, F), (N, ctx_k, F) -> (N, H, blocks, bs, bs)``."""
    H = layout.heads
    return pack(layout, split_heads(a, H) @ split_heads(b, H).transpose(0, 1, 3, 2))


def nn(layout, w, v):
    """``W_h @ v_h`` with ``W`` the dense form of packed ``w``: ``-> (N, ctx_q, F)``."""
    return merge_heads(unpack(layout, w) @ split_heads(v, layout.heads))


def tn(layout, w, x):
    """``W_h.T @ x_h`` with ``W`` the dense form of packed ``w``: ``-> (N, ctx_k, F)``."""
    return merge_heads(unpack(layout, w).transpose(0, 1, 3, 2) @ split_heads(x, layout.heads))


def _dense_softmax(s, kept):
    """Row softmax of dense scores over the kept elements; rows with none are zeros."""
    s = np.where(kept, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def softmax(layout, x, scale=1.0, masks=None, autoregress_at_key=None):
    """Packed masked softmax of packed scores ``x`` times ``scale`` (see :func:`kept_mask`)."""
    kept = kept_mask(layout, masks, autoregress_at_key)
    return pack(layout, _dense_softmax(unpack(layout, x) * scale, kept))


def softmax_grad(layout, dy, y, scale=1.0):
    """Gradient of :func:`softmax` for output gradient ``dy`` and output ``y`` (both packed)."""
    dY, Y = unpack(layout, dy), unpack(layout, y)
    return pack(layout, (dY - (dY * Y).sum(axis=-1, keepdims=True)) * Y * scale)


def attention(layout, q, k, v, do, scale, masks=None, autoregress_at_key=None):
    """Dense attention ``o = softmax(scale q kᵀ | kept) v`` and its gradients, all float64.

    Returns ``(o, dq, dk, dv)`` for output gradient ``do``; activations ``(N, ctx, H*D)``.
    """
    H = layout.heads
    Q, K, V, dO = (split_heads(t, H) for t in (q, k, v, do))
    P = _dense_softmax(scale * Q @ K.transpose(0, 1, 3, 2), kept_mask(layout, masks, autoregress_at_key))
    dP = dO @ V.transpose(0, 1, 3, 2)
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True)) * scale
    return merge_heads(P @ V), merge_heads(dS @ K), merge_heads(dS.transpose(0, 1, 3, 2) @ Q), \
        merge_heads(P.transpose(0, 1, 3, 2) @ dO)
