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

__all__ = ["DW_OP_NAME", "DX_OP_NAME", "UpdatRecord", "mark_updat", "matmul", "updat_record"]

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


def mark_updat(dw, record):
    """``dw`` named as a dW product (:data:`DW_OP_NAME`), with ``record`` kept for :func:`updat_record`."""
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


def _with_grad_in(w, dtype):
    """``w`` (an identity) whose gradient is cast to ``dtype``."""
    @tf.custom_gradient
    def grad_in_dw_dtype(w):
        return tf.identity(w), lambda g: tf.cast(g, dtype)

    return grad_in_dw_dtype(w)


def matmul(x, w, layout, axis, dw_dtype, products):
    """``y = products.fprop(x, w)`` with gradients ``dx = bprop(dy, w)``, ``dW = updat(x, dy)``.

    ``x`` and ``w`` are checked tensors of the same floating dtype; ``dW`` comes out in
    ``dw_dtype``.

    Where ``dw_dtype`` is not ``w``'s dtype, ``grad`` does not use ``w`` itself for ``dx`` but an
    identity of it whose gradient is cast to ``dw_dtype``.  The gradient computation is itself
    differentiated whenever a tape records it: nested or persistent tapes around a
    ``tf.function`` (TensorFlow then builds the function's backward with inputs for the gradients
    of every forward tensor it reads, ``w`` included), a SavedModel function under such a tape,
    or eager higher-order gradients.  Those gradients of the tensors ``grad`` reads come in their
    own dtype and TensorFlow adds them to the ``dW`` of the same tensor; with ``w`` read directly
    that would add ``w.dtype`` to ``dw_dtype`` (``AddN`` refuses mixed dtypes).  Through the
    identity they reach ``w`` in ``dw_dtype``, so ``dW`` keeps ``dw_dtype`` in every mode.
    """
    @tf.custom_gradient
    def blocksparse_matmul(x, w):
        y = products.fprop(x, w, layout, axis)
        cast_grad = w.dtype != dw_dtype
        # In graphs (tf.function, v1) the identity must be a forward op: made in the backward graph
        # it would make w the function's side output again.  Eager, grad makes it when it runs.
        w_bprop = _with_grad_in(w, dw_dtype) if cast_grad and not tf.executing_eagerly() else w

        @tf.custom_gradient
        def bprop(dy, w_b):
            # differentiated (second order): W's part is an updat, the float32 sum rounded once
            # to dw_dtype, not the product's own gradient in W's dtype
            def bprop_grad(g):
                return products.fprop(g, w_b, layout, axis), products.updat(g, dy, layout, axis, dw_dtype)

            return products.bprop(dy, w_b, layout, axis), bprop_grad

        def grad(dy):
            w_b = _with_grad_in(w, dw_dtype) if cast_grad and w_bprop is w else w_bprop
            dx = _mark_dx(bprop(dy, w_b))
            dw = products.updat(x, dy, layout, axis, dw_dtype)
            return dx, mark_updat(dw, UpdatRecord(x, dy, layout, axis, dw_dtype, products))

        return y, grad

    return blocksparse_matmul(x, w)
