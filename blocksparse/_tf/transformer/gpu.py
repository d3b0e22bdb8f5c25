"""The GPU path of the TensorFlow ``BlocksparseTransformer``: the compiled op library's transformer ops.

Each op gets the layout's lookup tables (:mod:`blocksparse.ops.transformer.lut`) as ``int32`` host
tensors and the layout's sizes as attrs; the op library launches the kernels on TensorFlow's CUDA
stream.  As for the matmul (:mod:`blocksparse._tf.matmul.gpu`), graphs hold the tables as constants
and eager calls pass the same host tensors of a layout every step, so that each op kernel uploads
a table once and keeps the copy.  The ops take one dtype for every operand: a softmax (or its
gradient) whose result has another dtype computes in float32 -- float16 and bfloat16 convert to it
exactly -- and casts the result, as a kernel reading one dtype and writing another would round it.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...ops.transformer import aot
from .. import tf
from .backend import Products

__all__ = ["DTYPES", "host_tables", "products", "register_gradients", "served"]

DTYPES = {tf.float16: "fp16", tf.bfloat16: "bf16", tf.float32: "fp32"}
_NO_MASKS = np.zeros([0], np.int32)
_ATTRS = ("block_size", "heads", "lut_heads", "blocks", "q_blocks", "k_blocks")


def _attrs(layout):
    return dict(zip(_ATTRS, (layout.block_size, layout.heads, layout.lut_heads, layout.blocks, layout.QB,
                             layout.KB)))


def _numpy_tables(layout, masks):
    index, bits = (masks.index, masks.bits) if masks is not None else (_NO_MASKS, _NO_MASKS)
    return dict(coords=layout.coords, row_offsets=layout.row_offsets, col_offsets=layout.col_offsets,
                col_blocks=layout.col_blocks, mask_index=index, mask_bits=bits)


@lru_cache(maxsize=256)
def _eager_tables(layout, masks):
    with tf.device("/device:CPU:0"):
        return {name: tf.constant(t) for name, t in _numpy_tables(layout, masks).items()}


def host_tables(layout, masks=None):
    """The tables of ``layout`` (and of its in-block ``masks``) by name, as the ops take them: numpy
    arrays (graph constants) while a graph is built, else host tensors made once per layout."""
    if tf.executing_eagerly():
        return _eager_tables(layout, masks)
    return _numpy_tables(layout, masks)


def served(library, arch, block_size, dtype, head_dim):
    """Whether ``library`` holds every kernel the ops of one call may run on ``sm_{arch}``: for the
    products (``head_dim`` > 0) ``nt``, ``nn`` and ``tn`` of the head slice; for the softmax
    (``head_dim`` 0) its four variants and its gradient, in ``dtype`` and in float32."""
    name = DTYPES[dtype]
    if head_dim:
        bd = aot.head_slice(head_dim, block_size)
        wanted = [dict(product="nt", dtype=name, bd=bd)] + [dict(product="xn", dtype=name, bd=bd, trans=t)
                                                             for t in (False, True)]
    else:
        wanted = [dict(product="softmax", dtype=d, has_mask=m, autoregress=ar) for d in {name, "fp32"}
                  for m in (False, True) for ar in (False, True)]
        wanted += [dict(product="softmax_grad", dtype=d) for d in {name, "fp32"}]
    return all(library.serves(arch, "transformer", block_size=block_size, **w) for w in wanted)


def products(library, arch, block_size, dtype, head_dim):
    """The :class:`Products` of ``library`` on ``sm_{arch}`` for ``dtype`` operands on blocks of
    ``block_size`` (``head_dim``: see :func:`served`), or None where it lacks kernels for them."""
    if not served(library, arch, block_size, dtype, head_dim):
        return None
    ops = library.module
    register_gradients(ops)

    def nt(a, b, layout):
        return ops.blocksparse_transformer_nt(a, b, host_tables(layout)["coords"], **_attrs(layout))

    def xn(w, x, layout, trans):
        t = host_tables(layout)
        return ops.blocksparse_transformer_xn(w, x, t["coords"], t["col_offsets" if trans else "row_offsets"],
                                              t["col_blocks"], trans=trans, **_attrs(layout))

    def softmax(x, scale, masks, autoregress_at_key, layout, dtype):
        masks = masks if masks is not None and masks.bits.shape[0] else None   # no mask drops anything
        t = host_tables(layout, masks)
        within = x.dtype if x.dtype == dtype else tf.float32
        y = ops.blocksparse_transformer_softmax(
            tf.cast(x, within), scale, 0 if autoregress_at_key is None else autoregress_at_key, t["row_offsets"],
            t["coords"], t["mask_index"], t["mask_bits"], masked=masks is not None,
            autoregress=autoregress_at_key is not None, **_attrs(layout))
        return tf.cast(y, dtype)

    def softmax_grad(dy, y, scale, layout, dtype):
        within = y.dtype if y.dtype == dtype else tf.float32
        dx = ops.blocksparse_transformer_softmax_grad(tf.cast(dy, within), tf.cast(y, within), scale,
                                                      host_tables(layout)["row_offsets"], **_attrs(layout))
        return tf.cast(dx, dtype)

    return Products(f"tf-gpu-sm{arch}", nt, xn, softmax, softmax_grad)


_registered = []


def register_gradients(module):
    """Register the gradient of ``BlocksparseTransformerSoftmax`` (once per process), which the
    softmax's second order differentiates through (its gradient reads the op's output): ``dx`` and
    ``dscale`` by ``BlocksparseTransformerSoftmaxGrad``.  The first order is :mod:`.autodiff`'s."""
    if _registered:
        return
    _registered.append(module)

    @tf.RegisterGradient("BlocksparseTransformerSoftmax")
    def _softmax_grad(op, dy):
        x, scale, _, row_offsets = op.inputs[:4]
        attrs = {name: op.get_attr(name) for name in _ATTRS}
        y = op.outputs[0]
        dx = module.blocksparse_transformer_softmax_grad(dy, y, scale, row_offsets, **attrs)
        ds = module.blocksparse_transformer_softmax_grad(dy, y, 1.0, row_offsets, **attrs)
        return [dx, tf.reduce_sum(tf.cast(ds, tf.float32) * tf.cast(x, tf.float32)), None, None, None, None, None]
