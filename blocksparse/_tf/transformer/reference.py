"""The reference path of the transformer ops with TensorFlow ops only (gather / einsum /
unsorted_segment_sum / unsorted_segment_max).

It runs wherever TensorFlow runs (CPU, any GPU, TPU / XLA) and serves wherever the op library's
kernels (:mod:`.gpu`) do not.  Nothing ``ctx_q x ctx_k`` is ever made: activations are cut into
position blocks ``(heads * ctx / bs, N, bs, head_dim)``, gathered once per layout block, multiplied
block by block and summed back per output block.  Blocks are addressed by the layout core's flat ids
over ``(heads, blocks)`` (:attr:`~blocksparse.ops.transformer.lut.AttentionLayout.flat_ids`).
Everything is computed in float32 and cast to the caller's dtype at the end.
"""
import numpy as np

from .. import tf

__all__ = ["keep_mask", "nt", "softmax", "softmax_grad", "xn"]


def _blocked(t, heads, bs):
    """``(N, T, H*D) -> (H * T/bs, N, bs, D)`` in float32 (head-major position blocks)."""
    t = tf.cast(t, tf.float32)
    shape = tf.shape(t)
    n, tb, d = shape[0], shape[1] // bs, shape[2] // heads
    t = tf.transpose(tf.reshape(t, [n, tb, bs, heads, d]), [3, 1, 0, 2, 4])
    return tf.reshape(t, [heads * tb, n, bs, d])


def _unblocked(t, heads, dtype):
    """Inverse of :func:`_blocked`, cast to ``dtype``."""
    shape = tf.shape(t)
    hb, n, bs, d = shape[0], shape[1], shape[2], shape[3]
    t = tf.transpose(tf.reshape(t, [heads, hb // heads, n, bs, d]), [2, 1, 3, 0, 4])
    return tf.cast(tf.reshape(t, [n, hb // heads * bs, heads * d]), dtype)


def nt(a, b, layout):
    """Packed scores ``(N, H, blocks, bs, bs)``: per block, ``a``'s query rows times ``b``'s key rows."""
    q_ids, k_ids = layout.flat_ids
    bs = layout.block_size
    qa = tf.gather(_blocked(a, layout.heads, bs), q_ids)
    kb = tf.gather(_blocked(b, layout.heads, bs), k_ids)
    # [HB, N, bs, D] @ [HB, N, bs, D].T -> [N, HB, bs, bs]
    scores = tf.einsum("bnid,bnjd->nbij", qa, kb)
    scores = tf.reshape(scores, [tf.shape(a)[0], layout.heads, layout.blocks, bs, bs])
    scores = tf.cast(scores, a.dtype)
    scores.set_shape([a.shape[0], layout.heads, layout.blocks, bs, bs])
    return scores


def xn(w, x, layout, trans):
    """``nn`` (``w[b] @ x`` at key blocks, summed per query block) or, with ``trans``, ``tn``
    (``w[b].T @ x`` at query blocks, summed per key block): ``(N, ctx_out, F)``."""
    q_ids, k_ids = layout.flat_ids
    gather, scatter, out_blocks = (q_ids, k_ids, layout.KB) if trans else (k_ids, q_ids, layout.QB)
    bs = layout.block_size
    xb = tf.gather(_blocked(x, layout.heads, bs), gather)
    wb = tf.reshape(tf.cast(w, tf.float32), [tf.shape(w)[0], layout.heads * layout.blocks, bs, bs])
    # [N, HB, bs, bs] (transposed for tn) @ [HB, N, bs, D] -> [HB, N, bs, D]
    contrib = tf.einsum("nbji,bnjd->bnid" if trans else "nbij,bnjd->bnid", wb, xb)
    out = _unblocked(tf.math.unsorted_segment_sum(contrib, scatter, layout.heads * out_blocks), layout.heads,
                     x.dtype)
    out.set_shape([x.shape[0], out_blocks * bs, x.shape[2]])
    return out


def keep_mask(layout, masks, autoregress_at_key):
    """``(heads * blocks, bs, bs)`` booleans of the elements the softmax keeps, or None for all.

    ``masks``: the in-block masks (or None); ``autoregress_at_key``: None or an int32 scalar.
    """
    keep = None
    if masks is not None:
        keep = tf.gather(tf.constant(masks.distinct()), masks.head_index(layout.heads))
    if autoregress_at_key is not None:
        q_ids, k_ids = layout.flat_ids
        o = np.arange(layout.block_size)
        q_pos = tf.constant(((q_ids % layout.QB) * layout.block_size)[:, None, None] + o[:, None], tf.int32)
        k_pos = tf.constant(((k_ids % layout.KB) * layout.block_size)[:, None, None] + o[None, :], tf.int32)
        rule = (k_pos <= q_pos) | (k_pos < autoregress_at_key)
        keep = rule if keep is None else keep & rule
    return keep


def _per_block(t, layout):
    """``(N, H, blocks, bs, bs) -> (N, H*blocks, bs, bs)`` in float32."""
    bs = layout.block_size
    return tf.reshape(tf.cast(t, tf.float32), [-1, layout.heads * layout.blocks, bs, bs])


def _row_reduce(t, layout, segment_op):
    """``segment_op`` over the blocks of each query row of ``t`` ``(N, H*blocks, bs)``, given back
    to every block of the row."""
    q_ids = layout.flat_ids[0]
    rows = segment_op(tf.transpose(t, [1, 0, 2]), q_ids, layout.heads * layout.QB)
    return tf.transpose(tf.gather(rows, q_ids), [1, 0, 2])


def softmax(x, scale, masks, autoregress_at_key, layout, dtype):
    """Softmax of ``scale * x`` (packed) along each query row over the elements it keeps (see
    :func:`keep_mask`); 0 where dropped and for rows that keep nothing.  Result in ``dtype``."""
    keep = keep_mask(layout, masks, autoregress_at_key)
    s = _per_block(x, layout) * scale
    if keep is not None:
        s = tf.where(keep, s, float("-inf"))
    shift = _row_reduce(tf.reduce_max(s, axis=-1), layout, tf.math.unsorted_segment_max)
    shift = tf.where(tf.math.is_inf(shift), tf.zeros_like(shift), shift)  # nothing kept: exp gives 0
    e = tf.exp(s - shift[..., None])
    total = _row_reduce(tf.reduce_sum(e, axis=-1), layout, tf.math.unsorted_segment_sum)
    y = tf.reshape(tf.math.divide_no_nan(e, total[..., None]), tf.shape(x))
    return tf.cast(y, dtype)


def softmax_grad(dy, y, scale, layout, dtype):
    """``(dy - sum_row(dy * y)) * y * scale`` on packed tensors, in ``dtype``."""
    dy32, y32 = _per_block(dy, layout), _per_block(y, layout)
    dot = _row_reduce(tf.reduce_sum(dy32 * y32, axis=-1), layout, tf.math.unsorted_segment_sum)
    return tf.cast(tf.reshape((dy32 - dot[..., None]) * y32 * scale, tf.shape(y)), dtype)
