"""How a matmul call reaches the products: eagerly through a plain autograd function, under
``torch.compile`` through custom ops.

``blocksparse::matmul``     y = x @ W (+ bias)   (differentiable: registered autograd)
``blocksparse::matmul_dx``  dx = dy @ W.T
``blocksparse::matmul_dw``  dW = x.T @ dy, per block

Each takes the activations, the packed weight (or the gradient; ``matmul`` an optional bias, added to
the float32 sums before the one rounding as on the eager path), an integer layout handle from
:func:`.plan.handle`, the activation layout (``axis``) and the float32 precision (``"ieee"`` or
``"tf32"``).  A fake (shape) function per op lets ``torch.compile(fullgraph=True)`` trace them.
Eager calls skip the dispatcher (a few tens of microseconds a call): :func:`matmul` takes the
custom op only while compiling; eagerly with a gradient, the native op (one C++ autograd node,
:mod:`blocksparse.torch._native`) where the kernel library serves all three products, else
:class:`MatmulFunction`; without a gradient the product alone.  All paths run the same planned
launches (:mod:`.products`).
"""

import numpy as np
import torch
from typing import Optional

from torch import Tensor

from .. import _native
from .._autograd import direct_apply, owned
from .._checks import plain_ops_needed
from .._reduce import column_sums
from . import plan as _plan
from . import products as _products

__all__ = ["matmul", "MatmulFunction", "matmul_op", "matmul_dx_op", "matmul_dw_op", "native_ids"]


def _out_like(x, features, axis):
    n = x.shape[0] if axis == 1 else x.shape[1]
    return x.new_empty((n, features) if axis == 1 else (features, n))


@torch.library.custom_op("blocksparse::matmul", mutates_args=())
def matmul_op(x: Tensor, w: Tensor, bias: Optional[Tensor], layout: int, axis: int, precision: str) -> Tensor:
    return _products.fprop(x, w, layout, axis, precision, bias)


@matmul_op.register_fake
def _(x, w, bias, layout, axis, precision):
    return _out_like(x, _plan.state(layout).layout.K, axis)


@torch.library.custom_op("blocksparse::matmul_dx", mutates_args=())
def matmul_dx_op(dy: Tensor, w: Tensor, layout: int, axis: int, precision: str) -> Tensor:
    return _products.bprop(dy, w, layout, axis, precision)


@matmul_dx_op.register_fake
def _(dy, w, layout, axis, precision):
    return _out_like(dy, _plan.state(layout).layout.C, axis)


@torch.library.custom_op("blocksparse::matmul_dw", mutates_args=())
def matmul_dw_op(x: Tensor, dy: Tensor, layout: int, axis: int, precision: str,
                 dw_dtype: torch.dtype) -> Tensor:
    return _products.updat(x, dy, layout, axis, precision, dw_dtype)


@matmul_dw_op.register_fake
def _(x, dy, layout, axis, precision, dw_dtype):
    return x.new_empty(_plan.state(layout).layout.w_shape, dtype=dw_dtype)


def _setup_context(ctx, inputs, output):
    x, w, bias, layout, axis, precision = inputs
    ctx.save_for_backward(x, w)
    ctx.meta = (layout, axis, precision, None if bias is None else bias.dtype)
    ctx.keep = _plan.keep(layout)  # the layout's state stays findable until the backward


def _backward_op(ctx, dy):
    x, w = ctx.saved_tensors
    layout, axis, precision, bias_dtype = ctx.meta
    need = ctx.needs_input_grad
    dx = matmul_dx_op(dy, w, layout, axis, precision) if need[0] else None
    dw = matmul_dw_op(x, dy, layout, axis, precision, w.dtype) if need[1] else None
    db = (dy if axis == 1 else dy.t()).sum(0).to(bias_dtype) if need[2] else None
    return dx, dw, db, None, None, None


matmul_op.register_autograd(_backward_op, setup_context=_setup_context)


def _add_bias(y, bias, axis):
    """``y + bias`` in place on the fresh product ``y`` (bias per output feature, cast to ``y``)."""
    if bias.dtype != y.dtype:
        bias = bias.to(y.dtype)
    return y.add_(bias if axis == 1 else bias[:, None])


def _bias_grad(dy, bias, axis):
    return column_sums(dy if axis == 1 else dy.t()).to(bias.dtype)


class MatmulFunction(torch.autograd.Function):
    """``y = x @ W (+ bias)`` in eager mode: the products called directly, no dispatcher in between;
    the bias is added in place to the product (one op, no autograd node of its own).

    Its gradients are products of the same family (:class:`BpropFunction`, :class:`UpdatFunction`),
    each differentiable in turn, so a ``create_graph=True`` backward (gradient penalties, meta
    learning) differentiates through them; without it they are called directly."""

    @staticmethod
    def forward(ctx, x, w, bias, layout, axis, precision):
        ctx.save_for_backward(x, w)
        ctx.meta = (layout, axis, precision, bias)
        ctx.keep = _plan.keep(layout)
        return owned(_products.fprop(x, w, layout, axis, precision, bias))

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        layout, axis, precision, bias = ctx.meta
        need = ctx.needs_input_grad
        dx = _bprop(dy, w, layout, axis, precision) if need[0] else None
        dw = _updat(x, dy, layout, axis, precision, w.dtype) if need[1] else None
        db = None
        if need[2]:
            db = ((dy if axis == 1 else dy.t()).sum(0).to(bias.dtype) if torch.is_grad_enabled()
                  else _bias_grad(dy, bias, axis))
        return dx, dw, db, None, None, None


class BpropFunction(torch.autograd.Function):
    """``dx = dy @ W.T``, differentiable: ``d(dy) = fprop(g, W)``, ``dW = updat(g, dy)``."""

    @staticmethod
    def forward(ctx, dy, w, layout, axis, precision):
        ctx.save_for_backward(dy, w)
        ctx.meta = (layout, axis, precision)
        ctx.keep = _plan.keep(layout)
        return owned(_products.bprop(dy, w, layout, axis, precision))

    @staticmethod
    def backward(ctx, g):
        dy, w = ctx.saved_tensors
        layout, axis, precision = ctx.meta
        need = ctx.needs_input_grad
        d_dy = MatmulFunction.apply(g, w, None, layout, axis, precision) if need[0] else None
        dw = UpdatFunction.apply(g, dy, layout, axis, precision, w.dtype) if need[1] else None
        return d_dy, dw, None, None, None


class UpdatFunction(torch.autograd.Function):
    """``dW = x.T @ dy`` on the blocks, differentiable: ``dx = bprop(dy, G)``, ``d(dy) = fprop(x, G)``."""

    @staticmethod
    def forward(ctx, x, dy, layout, axis, precision, dw_dtype):
        ctx.save_for_backward(x, dy)
        ctx.meta = (layout, axis, precision)
        ctx.keep = _plan.keep(layout)
        return owned(_products.updat(x, dy, layout, axis, precision, dw_dtype))

    @staticmethod
    def backward(ctx, g):
        x, dy = ctx.saved_tensors
        layout, axis, precision = ctx.meta
        g = g.to(x.dtype)
        need = ctx.needs_input_grad
        dx = BpropFunction.apply(dy, g, layout, axis, precision) if need[0] else None
        d_dy = MatmulFunction.apply(x, g, None, layout, axis, precision) if need[1] else None
        return dx, d_dy, None, None, None, None


def _bprop(dy, w, layout, axis, precision):
    """bprop: recorded (differentiable) where a ``create_graph=True`` backward runs, else direct."""
    if torch.is_grad_enabled() and (dy.requires_grad or w.requires_grad):
        return BpropFunction.apply(dy, w, layout, axis, precision)
    return _products.bprop(dy, w, layout, axis, precision)


def _updat(x, dy, layout, axis, precision, dw_dtype):
    """updat: recorded where a ``create_graph=True`` backward runs, else direct."""
    if torch.is_grad_enabled() and (x.requires_grad or dy.requires_grad):
        return UpdatFunction.apply(x, dy, layout, axis, precision, dw_dtype)
    return _products.updat(x, dy, layout, axis, precision, dw_dtype)


_apply = direct_apply(MatmulFunction)


def matmul(x, w, layout, axis, precision, bias=None):
    """``y = x @ W (+ bias)`` (checked inputs; ``bias`` per output feature or None): the custom op
    while ``torch.compile`` traces, else the eager path -- :class:`MatmulFunction` when a gradient
    is wanted, the product alone when not."""
    if torch.compiler.is_compiling() and not plain_ops_needed():
        return matmul_op(x, w, bias, layout, axis, precision)
    if plain_ops_needed(x, w, bias):  # torch.func transforms, forward-mode tangents: plain ops
        y = dense_product(x, w, layout, axis)
        return y if bias is None else _add_bias(y, bias, axis)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        if x.is_cuda and _native.available():
            ids = native_ids(x, w, layout, axis, precision, bias is not None)
            if ids is not None:
                return _native.linear(x, w, bias, ids)
        return _apply(x, w, bias, layout, axis, precision)
    return _products.fprop(x, w, layout, axis, precision, bias)


def dense_product(x, w, layout, axis):
    """``x @ W`` (``axis=1``) or ``W.T @ x`` (``axis=0``) with ``W`` the dense matrix of the packed
    blocks ``w``, built by differentiable copies: the product under ``torch.func`` transforms,
    whose batched tensors the kernels and the reference path's autograd functions cannot take."""
    lay = _plan.state(layout).layout
    bs, cb, kb = lay.block_size, lay.CB, lay.KB
    if lay.packing > 1:  # a packed refinement: w holds the coarse blocks, fine block f in block f // r^2
        r = lay.packing
        w = w.reshape(-1, r, bs, r, bs).transpose(2, 3).reshape(-1, bs, bs)
    coords = torch.tensor(np.asarray(lay.coords, dtype=np.int64).reshape(-1, 2), device=w.device)
    tiles = w.new_zeros((cb * kb, bs, bs)).index_copy(0, coords[:, 0] * kb + coords[:, 1], w)
    dense = tiles.view(cb, kb, bs, bs).transpose(1, 2).reshape(cb * bs, kb * bs)
    return x @ dense if axis == 1 else dense.t() @ x


def native_ids(x, w, layout, axis, precision, bias=False):
    """The native op's record ids for this call (:func:`blocksparse.torch._native.records`), or None
    where the kernel library does not serve all three products of dense, aligned operands.  ``bias``:
    calls with a bias (the fprop kernel adds it where its sums are final)."""
    if not (x.is_contiguous() and w.is_contiguous() and x.numel()):
        return None
    if not _products.use_triton(x, _plan.state(layout).layout.block_size):
        return None
    fprop = _products.plan_of("fprop", x, w, layout, axis, precision, bias=bias)

    def backward_plans():  # for the gradient autograd hands over: fresh, dense, of the output's shape
        dy = _out_like(x, _plan.state(layout).layout.K, axis)
        return (_products.plan_of("bprop", dy, w, layout, axis, precision),
                _products.plan_of("updat", x, dy, layout, axis, precision, w.dtype))

    return _native.records(fprop, backward_plans)
