"""The reference path: the three block-sparse products with TensorFlow ops only.

It runs wherever TensorFlow runs (CPU, any GPU, TPU / XLA) and is the oracle the GPU kernels are
tested against.  Each product gathers one block row of activations per weight block, multiplies
block by block (a batched matmul over the ``blocks`` axis) and, for fprop / bprop, adds the
products of each output block with ``unsorted_segment_sum``.  The largest intermediate is
``(blocks, N, bs)``; the weight is never densified.  Everything is computed in float32 (float64
for float64 inputs, which the Keras layers take) and cast to the caller's dtype at the end.

Shapes (``bs`` = block size, ``N`` = minibatch; ``axis`` is the feature axis):

============  =====================  =====================  ======================
product       axis = 1               axis = 0               block ids used
============  =====================  =====================  ======================
fprop         (N, C) -> (N, K)       (C, N) -> (K, N)       gather c, sum into k
bprop         (N, K) -> (N, C)       (K, N) -> (C, N)       gather k, sum into c
updat         -> (blocks, bs, bs)    -> (blocks, bs, bs)    gather c and k
============  =====================  =====================  ======================

The block ids are the layout core's updat table (``layout.updat[b] = (c, k)``), so block ``b`` of
``w`` is the one at ``(c, k)`` in the layout's block order (row-major or z-order).
"""
from .. import tf

__all__ = ["fprop", "bprop", "updat"]


def _accumulator(dtype):
    """The dtype products of ``dtype`` inputs are computed in: float32, or float64 for float64."""
    return tf.float64 if dtype == tf.float64 else tf.float32


def _to_blocks(t, nblocks, bs, axis):
    """Split the feature axis into blocks, block index first, in :func:`_accumulator`'s dtype.

    ``(N, nblocks*bs) -> (nblocks, N, bs)`` for ``axis == 1``;
    ``(nblocks*bs, N) -> (nblocks, bs, N)`` for ``axis == 0``.
    """
    t = tf.cast(t, _accumulator(t.dtype))
    n = tf.shape(t)[1 - axis]
    if axis == 1:
        return tf.transpose(tf.reshape(t, [n, nblocks, bs]), [1, 0, 2])
    return tf.reshape(t, [nblocks, bs, n])


def _from_blocks(t, nblocks, bs, axis, dtype):
    """Inverse of :func:`_to_blocks`, cast to ``dtype``."""
    if axis == 1:
        n = tf.shape(t)[1]
        t = tf.reshape(tf.transpose(t, [1, 0, 2]), [n, nblocks * bs])
    else:
        t = tf.reshape(t, [nblocks * bs, tf.shape(t)[2]])
    return tf.cast(t, dtype)


def _static_n(t, axis):
    return t.shape[1 - axis] if t.shape.rank == 2 else None


def _xprop(t, w, layout, axis, transpose_w):
    """Shared body of fprop (``transpose_w=False``) and bprop (``transpose_w=True``).

    fprop reads input block row ``c`` and accumulates into output block ``k`` with ``w[b]``;
    bprop reads ``k``, accumulates into ``c`` and uses ``w[b].T``.
    """
    bs = layout.block_size
    c, k = layout.updat[:, 0], layout.updat[:, 1]
    src, dst, nsrc, ndst = (k, c, layout.KB, layout.CB) if transpose_w else (c, k, layout.CB, layout.KB)
    blocks = tf.gather(_to_blocks(t, nsrc, bs, axis), src)
    wa = tf.cast(w, blocks.dtype)
    if axis == 1:
        # [blocks, N, bs] @ [blocks, bs, bs] -> [blocks, N, bs]
        prod = tf.linalg.matmul(blocks, wa, transpose_b=transpose_w)
    else:
        # [blocks, bs, bs] @ [blocks, bs, N] -> [blocks, bs, N]
        prod = tf.linalg.matmul(wa, blocks, transpose_a=not transpose_w)
    out = tf.math.unsorted_segment_sum(prod, dst, ndst)
    out = _from_blocks(out, ndst, bs, axis, t.dtype)
    n = _static_n(t, axis)
    out.set_shape((n, ndst * bs) if axis == 1 else (ndst * bs, n))
    return out


def fprop(x, w, layout, axis):
    """``y = x @ W`` (``axis=1``) or ``y = W.T @ x`` (``axis=0``), in the dtype of ``x``."""
    return _xprop(x, w, layout, axis, transpose_w=False)


def bprop(dy, w, layout, axis):
    """``dx = dy @ W.T`` (``axis=1``) or ``dx = W @ dy`` (``axis=0``), in the dtype of ``dy``."""
    return _xprop(dy, w, layout, axis, transpose_w=True)


def updat(x, dy, layout, axis, dw_dtype):
    """``dw[b] = x[:, c].T @ dy[:, k]`` for every block ``b = (c, k)``, shape ``(blocks, bs, bs)``."""
    bs = layout.block_size
    xs = tf.gather(_to_blocks(x, layout.CB, bs, axis), layout.updat[:, 0])
    dys = tf.gather(_to_blocks(dy, layout.KB, bs, axis), layout.updat[:, 1])
    if axis == 1:
        # [blocks, N, bs].T @ [blocks, N, bs] -> [blocks, bs, bs]
        dw = tf.linalg.matmul(xs, dys, transpose_a=True)
    else:
        # [blocks, bs, N] @ [blocks, bs, N].T -> [blocks, bs, bs]
        dw = tf.linalg.matmul(xs, dys, transpose_b=True)
    dw = tf.cast(dw, dw_dtype)
    dw.set_shape(layout.w_shape)
    return dw
