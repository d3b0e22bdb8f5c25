"""PyTorch custom ops of layer norm.

``blocksparse::layer_norm``      ``(y, mean, rstd)``      (differentiable in x, g, b: registered autograd)
``blocksparse::layer_norm_bwd``  ``(dx, dg, db)``         (``dg`` / ``db`` empty ``(0,)`` for an absent g / b)

Eager calls on a GPU run the native op where the kernel library serves them
(:func:`native_layer_norm`: one C++ autograd node, ``csrc/norms.cpp``); other eager calls run
their implementations directly (:func:`apply_layer_norm`: an autograd function
with the same context and backward, no dispatcher).  Both choose at run time between the Triton
kernels and the reference path (:func:`blocksparse.torch._backend.kernels_serve`); fake (shape)
functions let ``torch.compile`` trace them without graph breaks.  ``mean`` / ``rstd`` are
``(segments, N)``, float32 (float64 for float64 activations).  A backward pass that builds a graph
(``create_graph=True``, for double backward) runs the reference formulas, which autograd
differentiates again.
"""

from typing import Optional

import torch
from torch import Tensor

from .. import _native
from .._autograd import call_op, direct_apply, eager_twin
from .._backend import kernels_serve
from . import reference as _reference


def _tokens(x, axis):
    return x.shape[0] if axis == 1 else x.shape[1]


def _stats_like(x, axis, segments):
    return x.new_empty((segments, _tokens(x, axis)), dtype=_reference.stats_dtype(x.dtype))


def _forward(x: Tensor, g: Optional[Tensor], b: Optional[Tensor], axis: int, epsilon: float, relu: bool,
             segments: int) -> tuple[Tensor, Tensor, Tensor]:
    kw = dict(axis=axis, epsilon=epsilon, relu=relu, segments=segments)
    if kernels_serve(x):
        from . import launch
        return launch.layer_norm_fwd(x, g, b, **kw)
    return _reference.layer_norm_fwd(x, g, b, **kw)


layer_norm = torch.library.custom_op("blocksparse::layer_norm", mutates_args=())(_forward)


@layer_norm.register_fake
def _(x, g, b, axis, epsilon, relu, segments):
    return x.new_empty(x.shape), _stats_like(x, axis, segments), _stats_like(x, axis, segments)


def _backward_of(dy, x, g, b, mean, rstd, axis, relu, segments):
    """``(dx, dg, db)``, None where ``g`` / ``b`` is."""
    kw = dict(axis=axis, relu=relu, segments=segments)
    if kernels_serve(x):
        from . import launch
        return launch.layer_norm_bwd(dy, x, g, b, mean, rstd, **kw)
    return _reference.layer_norm_bwd(dy, x, g, b, mean, rstd, **kw)


@torch.library.custom_op("blocksparse::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(dy: Tensor, x: Tensor, g: Optional[Tensor], b: Optional[Tensor], mean: Tensor, rstd: Tensor,
                   axis: int, relu: bool, segments: int) -> tuple[Tensor, Tensor, Tensor]:
    dx, dg, db = _backward_of(dy, x, g, b, mean, rstd, axis, relu, segments)
    return dx, _or_empty(dg, x), _or_empty(db, x)


def _or_empty(t, like):
    # custom ops return tensors only: an absent parameter's gradient is an empty placeholder
    return like.new_empty((0,)) if t is None else t


@layer_norm_bwd.register_fake
def _(dy, x, g, b, mean, rstd, axis, relu, segments):
    return (x.new_empty(x.shape), _or_empty(None if g is None else g.new_empty(g.shape), x),
            _or_empty(None if b is None else b.new_empty(b.shape), x))


def _setup_context(ctx, inputs, output):
    x, g, b, axis, epsilon, relu, segments = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, g, b, mean, rstd)
    ctx.meta = (axis, relu, segments)
    ctx.epsilon = epsilon


def _gradients(bwd):
    """The backward of either form, running the backward op ``bwd``: the custom op (registered
    autograd) or its implementation (the eager twin); the placeholders of the one and the None
    of the other for an absent ``g`` / ``b`` are both dropped."""

    def backward(ctx, dy, _dmean, _drstd):
        if dy is None:  # the eager twin leaves an unused output's gradient undefined: no gradients
            return (None,) * 7
        return _backward(ctx, dy, bwd)

    return backward


def _backward(ctx, dy, bwd):
    x, g, b, mean, rstd = ctx.saved_tensors
    axis, relu, segments = ctx.meta
    if torch.is_grad_enabled():
        # create_graph=True (double backward): the reference formulas, differentiable in every
        # input, with the statistics recomputed from x (they depend on it)
        _, mean, rstd = _reference.layer_norm_fwd(x, g, b, axis=axis, epsilon=ctx.epsilon, relu=relu,
                                                  segments=segments)
        dx, dg, db = _reference.layer_norm_bwd(dy, x, g, b, mean, rstd, axis=axis, relu=relu, segments=segments)
    else:
        dx, dg, db = bwd(dy, x, g, b, mean, rstd, axis, relu, segments)
    need = ctx.needs_input_grad
    return (dx if need[0] else None, dg if g is not None and need[1] else None,
            db if b is not None and need[2] else None, None, None, None, None)


layer_norm.register_autograd(_gradients(layer_norm_bwd), setup_context=_setup_context)
# the statistics' gradients are ignored: not zero-filled
_apply = direct_apply(eager_twin("LayerNormFunction", _forward, _setup_context, _gradients(_backward_of),
                                 materialize_grads=False))


def apply_layer_norm(x, g, b, axis, epsilon, relu, segments):
    """``y`` (checked inputs): the custom op while ``torch.compile`` traces, else the eager path
    (no dispatcher: :func:`blocksparse.torch._autograd.call_op`)."""
    y, _, _ = call_op(layer_norm, _apply, _forward, (x, g, b, axis, epsilon, relu, segments), (x, g, b))
    return y


def native_layer_norm(x, g, b, axis, epsilon, relu, segments):
    """``y`` of an eager call on CUDA tensors through the native op (the kernel library's layer-norm
    entry point, no Python in the backward), or None: where :func:`blocksparse.torch._native.eager_library`
    finds none, for arguments of other types (``axis`` and ``segments`` ints, ``relu`` a bool,
    ``epsilon`` a float, ``g`` and ``b`` plain tensors or None), and for calls the library's specs
    do not serve (the op checks shapes, dtypes, layout, alignment and autocast itself)."""
    if not (type(axis) is int and type(segments) is int and type(relu) is bool and type(epsilon) is float):
        return None
    kernels = _native.eager_library(x, g, b)
    entry = None if kernels is None else _native.entry(kernels, "layer_norm")
    return None if entry is None else _native.layer_norm(x, g, b, axis, epsilon, relu, segments, entry)
