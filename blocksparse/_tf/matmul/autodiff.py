"""The block-sparse matmul as one differentiable op: dx via bprop, dW via updat.

In graph mode (``tf.compat.v1`` graphs, ``tf.function``) every dW product is an ``Identity`` op
named ``BlocksparseMatmulDW`` whose inputs are recorded on its graph (an :class:`UpdatRecord`
keyed by op name, in a dict stored as an attribute of the graph object).  That is what lets
:func:`blocksparse.matmul.group_param_grads` find the products of one weight and merge them;
the record lives and dies with its graph.  Where the dx product is not already a
``BlocksparseMatmulDX`` op (the reference path), it ends in an ``Identity`` op of that name, so
that :func:`blocksparse.matmul.get_parents` finds it on either path.
"""
from dataclasses import dataclass

from ...layout import Layout
from .. import tf
from .products import Products

__all__ = ["DW_OP_NAME", "DX_OP_NAME", "UpdatRecord", "matmul", "updat_record"]

#: Name (last path component, before TensorFlow's uniquifying suffix) of every dW product.
DW_OP_NAME = "BlocksparseMatmulDW"
#: Type of the GPU path's dx op, and the name of the reference path's dx marker.
DX_OP_NAME = "BlocksparseMatmulDX"
_REGISTRY = "_blocksparse_updat_records"


@dataclass(frozen=True, eq=False)
class UpdatRecord:
    """What produced one dW tensor: ``dw = products.updat(x, dy, layout, axis, dw_dtype)``."""

    x: tf.Tensor
    dy: tf.Tensor
    layout: Layout
    axis: int
    dw_dtype: tf.DType
    products: Products

    def group_key(self):
        """Records with equal keys may be merged by concatenating their ``x`` and ``dy``."""
        return (self.layout, self.axis, self.dw_dtype, self.x.dtype, self.products.name)


def updat_record(op):
    """The :class:`UpdatRecord` of ``op`` if it is a dW product, else None."""
    return getattr(op.graph, _REGISTRY, {}).get(op.name)


def _mark_updat(dw, record):
    if tf.executing_eagerly():  # nothing to rewrite later: no graph
        return dw
    dw = tf.identity(dw, name=DW_OP_NAME)
    graph = dw.graph
    if not hasattr(graph, _REGISTRY):
        setattr(graph, _REGISTRY, {})
    getattr(graph, _REGISTRY)[dw.op.name] = record
    return dw


def _mark_dx(dx):
    if tf.executing_eagerly() or dx.op.type == DX_OP_NAME:
        return dx
    return tf.identity(dx, name=DX_OP_NAME)


def matmul(x, w, layout, axis, dw_dtype, products):
    """``y = products.fprop(x, w)`` with gradients ``dx = bprop(dy, w)``, ``dW = updat(x, dy)``.

    ``x`` and ``w`` are checked tensors of the same floating dtype; ``dW`` comes out in
    ``dw_dtype``.
    """
    @tf.custom_gradient
    def blocksparse_matmul(x, w):
        y = products.fprop(x, w, layout, axis)

        def grad(dy):
            dx = _mark_dx(products.bprop(dy, w, layout, axis))
            dw = products.updat(x, dy, layout, axis, dw_dtype)
            return dx, _mark_updat(dw, UpdatRecord(x, dy, layout, axis, dw_dtype, products))

        return y, grad

    return blocksparse_matmul(x, w)
