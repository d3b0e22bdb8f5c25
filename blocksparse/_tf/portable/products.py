"""The portable and dense-masked products of the block-sparse matmul with TensorFlow ops only.

Same signatures as :mod:`blocksparse._tf.matmul.reference` (``fprop(x, w, layout, axis)``,
``bprop(dy, w, layout, axis)``, ``updat(x, dy, layout, axis, dw_dtype)``), any block size, either
feature axis, in graphs and under XLA.

Portable (:mod:`blocksparse.ops.matmul.portable`): activations feature-major ``(CB, bs, N)``; per
row group one batched matmul of each row's stacked blocks with its activations; the ``(bs, N)``
slabs of the products summed per output block with ``unsorted_segment_sum`` (in float32 for 16-bit
inputs).  bprop gathers one ``(bs, N)`` slab of ``dy`` per block and runs the transposed matmuls;
updat multiplies the same slabs with the activations.

Dense: the blocks scattered into the dense ``(C, K)`` weight (``scatter_nd``) and one matmul; the
weight gradient is the dense ``x.T @ dy`` with its blocks gathered (``gather_nd``).

Matmuls run in the inputs' dtype (TensorFlow accumulates 16-bit products in float32 on GPUs);
results come back in the dtype of ``x`` / ``dy`` (``dw_dtype`` for updat).
"""
from functools import lru_cache

import numpy as np

from ...ops.matmul.portable import row_tables
from .. import tf

__all__ = ["dense_bprop", "dense_fprop", "dense_updat", "fprop", "bprop", "updat"]

_SLABS = 64  # layouts kept (their tables are a few kB each)


@lru_cache(maxsize=_SLABS)
def _tables(layout):
    t = row_tables(layout)
    inverse = np.empty_like(t.order)
    inverse[t.order] = np.arange(t.blocks)
    return t, inverse


def _feature_major(t, nblocks, bs, axis):
    """Activations as ``(nblocks, bs, N)``: a reshape of ``(F, N)``, a transpose of ``(N, F)``."""
    if axis == 1:
        t = tf.transpose(t)
    return tf.reshape(t, [nblocks, bs, -1])


def _activations(t, features, axis, n):
    """``(features, N)`` back to the activation layout, static shape restored."""
    t = tf.reshape(t, [features, -1])
    if axis == 1:
        t = tf.transpose(t)
    t.set_shape((n, features) if axis == 1 else (features, n))
    return t


def _static_n(t, axis):
    return t.shape[1 - axis] if t.shape.rank == 2 else None


def _row_weights(w, group, bs):
    """``(r, m*bs, bs)``: the ``m`` blocks of each row of the group, transposed and stacked."""
    r, m = group.blocks.shape
    wg = w[group.first:group.first + r * m] if group.first >= 0 else tf.gather(w, group.blocks.ravel())
    return tf.reshape(tf.transpose(tf.reshape(wg, [r, m, bs, bs]), [0, 1, 3, 2]), [r, m * bs, bs])


def _row_inputs(xt, group):
    return xt if group.all_rows else tf.gather(xt, group.rows)


def _segment_sum(parts, segments, count, dtype):
    data = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
    if dtype != tf.float32 and dtype != tf.float64:
        data = tf.cast(data, tf.float32)  # 16-bit sums in float32
    return tf.cast(tf.math.unsorted_segment_sum(data, segments, count), dtype)


def fprop(x, w, layout, axis):
    """``y = x @ W`` (``axis=1``) or ``y = W.T @ x`` (``axis=0``) by the portable path."""
    t, _ = _tables(layout)
    bs = layout.block_size
    xt = _feature_major(x, layout.CB, bs, axis)
    w = tf.cast(w, x.dtype)
    if x.dtype in (tf.float16, tf.bfloat16):
        # the slabs of a column are summed after the matmuls: 16-bit slabs would round each block's
        # product (a column of cancelling blocks lost ~16x one rounding); their products are exact
        # in float32 (and in TF32), so the sum keeps the float32 accumulation the op promises
        xt, w = tf.cast(xt, tf.float32), tf.cast(w, tf.float32)
    parts = []
    for g in t.groups:
        # [r, m*bs, bs] @ [r, bs, N] -> [r, m*bs, N]: one (bs, N) slab per block
        prod = tf.linalg.matmul(_row_weights(w, g, bs), _row_inputs(xt, g))
        parts.append(tf.reshape(prod, [g.blocks.size, bs, -1]))
    yt = _segment_sum(parts, t.table_cols, layout.KB, x.dtype)
    return _activations(yt, layout.K, axis, _static_n(x, axis))


def _dy_slabs(dy, layout, axis, t):
    """``(blocks, bs, N)``: the slab of ``dy`` each table row feeds, in table order."""
    return tf.gather(_feature_major(dy, layout.KB, layout.block_size, axis), t.table_cols)


def _group_slabs(slabs, t):
    """Split table-ordered slabs into each group's ``(r, m*bs, N)``."""
    start = 0
    for g in t.groups:
        r, m = g.blocks.shape
        yield g, tf.reshape(slabs[start:start + r * m], [r, m * slabs.shape[1], -1])
        start += r * m


def bprop(dy, w, layout, axis):
    """``dx = dy @ W.T`` (``axis=1``) or ``dx = W @ dy`` (``axis=0``) by the portable path."""
    t, _ = _tables(layout)
    bs = layout.block_size
    w = tf.cast(w, dy.dtype)
    parts, rows = [], []
    for g, dg in _group_slabs(_dy_slabs(dy, layout, axis, t), t):
        # [r, m*bs, bs].T @ [r, m*bs, N] -> [r, bs, N]
        parts.append(tf.linalg.matmul(_row_weights(w, g, bs), dg, transpose_a=True))
        rows.append(g.rows)
    dxt = _segment_sum(parts, np.concatenate(rows), layout.CB, dy.dtype)
    return _activations(dxt, layout.C, axis, _static_n(dy, axis))


def _updat_inputs(x, dy, dw_dtype):
    """Both in the dtype of ``x`` when ``dw_dtype`` is it (the matmul sums in float32 and rounds
    once), else in float32 (the original API's ``dw_dtype``: the reduction over the minibatch is
    rounded once, to ``dw_dtype``, never first to the other 16-bit type)."""
    dtype = x.dtype if dw_dtype == x.dtype else tf.float32
    return tf.cast(x, dtype), tf.cast(dy, dtype)


def updat(x, dy, layout, axis, dw_dtype):
    """``dw[b] = x[:, c].T @ dy[:, k]`` for every block by the portable path, ``(blocks, bs, bs)``."""
    t, inverse = _tables(layout)
    bs = layout.block_size
    x, dy = _updat_inputs(x, dy, dw_dtype)
    xt = _feature_major(x, layout.CB, bs, axis)
    parts = []
    for g, dg in _group_slabs(_dy_slabs(dy, layout, axis, t), t):
        # [r, m*bs, N] @ [r, bs, N].T -> [r, m*bs, bs]: each block's gradient, transposed
        dwt = tf.linalg.matmul(dg, _row_inputs(xt, g), transpose_b=True)
        r, m = g.blocks.shape
        parts.append(tf.reshape(tf.transpose(tf.reshape(dwt, [r, m, bs, bs]), [0, 1, 3, 2]), [r * m, bs, bs]))
    dw = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
    if not t.identity_order:
        dw = tf.gather(dw, inverse)
    dw = tf.cast(dw, dw_dtype)
    dw.set_shape(layout.w_shape)
    return dw


# ---------------------------------------------------------------- dense masked


def _dense(w, layout):
    """The dense ``(C, K)`` weight: blocks scattered, zeros elsewhere."""
    bs = layout.block_size
    blocks = tf.scatter_nd(layout.coords, w, [layout.CB, layout.KB, bs, bs])
    return tf.reshape(tf.transpose(blocks, [0, 2, 1, 3]), [layout.C, layout.K])


def _rounded_once(a, b, **kwargs):
    """``tf.linalg.matmul`` summed in float32 and rounded once: TensorFlow's own bf16 matmul rounds
    more than once on CPUs without bf16 instructions (1.1-1.4x one rounding's error, measured)."""
    if a.dtype != tf.bfloat16:
        return tf.linalg.matmul(a, b, **kwargs)
    return tf.cast(tf.linalg.matmul(tf.cast(a, tf.float32), tf.cast(b, tf.float32), **kwargs), a.dtype)


def dense_fprop(x, w, layout, axis):
    """``y = x @ W`` / ``W.T @ x`` through the dense weight."""
    dense = _dense(tf.cast(w, x.dtype), layout)
    return _rounded_once(x, dense) if axis == 1 else _rounded_once(dense, x, transpose_a=True)


def dense_bprop(dy, w, layout, axis):
    """``dx = dy @ W.T`` / ``W @ dy`` through the dense weight."""
    dense = _dense(tf.cast(w, dy.dtype), layout)
    return _rounded_once(dy, dense, transpose_b=True) if axis == 1 else _rounded_once(dense, dy)


def dense_updat(x, dy, layout, axis, dw_dtype):
    """The blocks of the dense weight gradient ``x.T @ dy`` (``x @ dy.T`` for ``axis=0``)."""
    x, dy = _updat_inputs(x, dy, dw_dtype)
    full = tf.linalg.matmul(x, dy, transpose_a=True) if axis == 1 else tf.linalg.matmul(x, dy, transpose_b=True)
    bs = layout.block_size
    tiles = tf.transpose(tf.reshape(full, [layout.CB, bs, layout.KB, bs]), [0, 2, 1, 3])
    dw = tf.cast(tf.gather_nd(tiles, layout.coords), dw_dtype)
    dw.set_shape(layout.w_shape)
    return dw
