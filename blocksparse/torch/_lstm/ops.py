"""PyTorch custom ops of the fused LSTM gates, one pair per input packing.

``blocksparse::lstm_gates``      ``(c, h (N, 4K), bias?) -> (c_next, h_next)``       (registered autograd)
``blocksparse::lstm_gates_bwd``  ``-> (dc, dh (N, 4K), dbias)``
``blocksparse::lstm_gates4``     ``(c, i, j, f, o, bias?) -> (c_next, h_next)``      (registered autograd)
``blocksparse::lstm_gates4_bwd`` ``-> (dc, di, dj, df, do, dbias)``

``dbias`` is an empty ``(0,)`` placeholder without a bias.  Eager calls on a GPU run the native
op where the kernel library serves them (:func:`native_gates`: one C++ autograd node,
``csrc/norms.cpp``); other eager calls run the implementations directly (:func:`apply_gates`: autograd functions with the same context and backward, no
dispatcher).  Each op chooses at run time between
the Triton kernels and the reference path (:func:`blocksparse.torch._backend.kernels_serve`);
fake (shape) functions let ``torch.compile`` trace them.  A backward pass that builds a graph
(``create_graph=True``, double backward) runs the reference formulas, which autograd differentiates
again.
"""

from typing import Optional

import torch
from torch import Tensor

from .. import _native
from .._autograd import call_op, direct_apply, eager_twin
from .._backend import kernels_serve
from . import reference as _reference


def _forward(c, gates, bias, forget_bias):
    if kernels_serve(c):
        from . import launch
        return launch.lstm_gates_fwd(launch.rows(c), [launch.rows(t) for t in gates], bias,
                                     forget_bias=forget_bias)
    return _reference.lstm_gates_fwd(c, gates, bias, forget_bias=forget_bias)


def _backward_of(c, gates, bias, dc_next, dh_next, forget_bias, merged):
    if kernels_serve(c):
        from . import launch
        dc, dgates, dbias = launch.lstm_gates_bwd(
            launch.rows(c), [launch.rows(t) for t in gates], bias, launch.rows(dc_next), launch.rows(dh_next),
            forget_bias=forget_bias, merged=merged)
    else:
        dc, dgates, dbias = _reference.lstm_gates_bwd(c, gates, bias, dc_next, dh_next,
                                                      forget_bias=forget_bias, merged=merged)
    return dc, dgates, c.new_empty((0,)) if dbias is None else dbias


def _split(h):
    return h.split(h.shape[1] // 4, dim=1)


def _outputs_like(c):
    return c.new_empty(c.shape), c.new_empty(c.shape)


def _dbias_like(bias, c):
    return c.new_empty((0,)) if bias is None else bias.new_empty(bias.shape)


def _merged(c: Tensor, h: Tensor, bias: Optional[Tensor], forget_bias: float) -> tuple[Tensor, Tensor]:
    return _forward(c, _split(h), bias, forget_bias)


lstm_gates = torch.library.custom_op("blocksparse::lstm_gates", mutates_args=())(_merged)


@lstm_gates.register_fake
def _(c, h, bias, forget_bias):
    return _outputs_like(c)


def _merged_bwd(c: Tensor, h: Tensor, bias: Optional[Tensor], dc_next: Tensor, dh_next: Tensor,
                forget_bias: float) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_of(c, _split(h), bias, dc_next, dh_next, forget_bias, merged=True)


lstm_gates_bwd = torch.library.custom_op("blocksparse::lstm_gates_bwd", mutates_args=())(_merged_bwd)


@lstm_gates_bwd.register_fake
def _(c, h, bias, dc_next, dh_next, forget_bias):
    return c.new_empty(c.shape), h.new_empty(h.shape), _dbias_like(bias, c)


def _four(c: Tensor, i: Tensor, j: Tensor, f: Tensor, o: Tensor, bias: Optional[Tensor],
          forget_bias: float) -> tuple[Tensor, Tensor]:
    return _forward(c, (i, j, f, o), bias, forget_bias)


lstm_gates4 = torch.library.custom_op("blocksparse::lstm_gates4", mutates_args=())(_four)


@lstm_gates4.register_fake
def _(c, i, j, f, o, bias, forget_bias):
    return _outputs_like(c)


def _four_bwd(c: Tensor, i: Tensor, j: Tensor, f: Tensor, o: Tensor, bias: Optional[Tensor],
              dc_next: Tensor, dh_next: Tensor, forget_bias: float
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    dc, dgates, dbias = _backward_of(c, (i, j, f, o), bias, dc_next, dh_next, forget_bias, merged=False)
    return (dc, *dgates, dbias)


lstm_gates4_bwd = torch.library.custom_op("blocksparse::lstm_gates4_bwd", mutates_args=())(_four_bwd)


@lstm_gates4_bwd.register_fake
def _(c, i, j, f, o, bias, dc_next, dh_next, forget_bias):
    return (c.new_empty(c.shape), *(t.new_empty(t.shape) for t in (i, j, f, o)), _dbias_like(bias, c))


def _setup_context(ctx, inputs, output):
    *tensors, forget_bias = inputs
    ctx.save_for_backward(*tensors)
    ctx.forget_bias = forget_bias


def _grads(ctx, dgates, dbias, bias):
    """(dgates..., dbias, None for forget_bias), None where no gradient is needed.  (``bias``: the
    saved one, unpacked once: a checkpoint refuses a second unpack.)"""
    grads = (*dgates, dbias if bias is not None else None, None)
    return tuple(gr if need else None for gr, need in zip(grads, ctx.needs_input_grad[1:]))


def _differentiable_bwd(c, gates, bias, dc_next, dh_next, forget_bias, merged):
    """The reference backward, which autograd differentiates again: used when the backward pass
    builds a graph (``create_graph=True``, double backward)."""
    return _reference.lstm_gates_bwd(c, gates, bias, dc_next, dh_next, forget_bias=forget_bias, merged=merged)


def _backward(bwd):
    """The merged packing's backward, running the backward op ``bwd`` (the custom op, or its
    implementation in the eager twin)."""

    def backward(ctx, dc_next, dh_next):
        c, h, bias = ctx.saved_tensors
        if torch.is_grad_enabled():
            dc, dh, dbias = _differentiable_bwd(c, _split(h), bias, dc_next, dh_next, ctx.forget_bias, True)
        else:
            dc, dh, dbias = bwd(c, h, bias, dc_next, dh_next, ctx.forget_bias)
        return (dc if ctx.needs_input_grad[0] else None, *_grads(ctx, (dh,), dbias, bias))

    return backward


def _backward4(bwd):
    """The four-tensor packing's backward (as :func:`_backward`)."""

    def backward(ctx, dc_next, dh_next):
        c, i, j, f, o, bias = ctx.saved_tensors
        if torch.is_grad_enabled():
            dc, (di, dj, df, do), dbias = _differentiable_bwd(c, (i, j, f, o), bias, dc_next, dh_next,
                                                              ctx.forget_bias, False)
        else:
            dc, di, dj, df, do, dbias = bwd(c, i, j, f, o, bias, dc_next, dh_next, ctx.forget_bias)
        return (dc if ctx.needs_input_grad[0] else None, *_grads(ctx, (di, dj, df, do), dbias, bias))

    return backward


lstm_gates.register_autograd(_backward(lstm_gates_bwd), setup_context=_setup_context)
lstm_gates4.register_autograd(_backward4(lstm_gates4_bwd), setup_context=_setup_context)
_apply = direct_apply(eager_twin("LstmGatesFunction", _merged, _setup_context, _backward(_merged_bwd)))
_apply4 = direct_apply(eager_twin("LstmGates4Function", _four, _setup_context, _backward4(_four_bwd)))


def apply_gates(c, gates, bias, forget_bias):
    """``(c_next, h_next)`` of one merged or four gate tensors (checked inputs): the custom op while
    ``torch.compile`` traces, else the eager path (no dispatcher: :func:`~.._autograd.call_op`)."""
    if len(gates) == 1:
        return call_op(lstm_gates, _apply, _merged, (c, gates[0], bias, forget_bias), (c, gates[0], bias))
    return call_op(lstm_gates4, _apply4, _four, (c, *gates, bias, forget_bias), (c, *gates, bias))


def native_gates(c, gates, bias, forget_bias):
    """``(c_next, h_next)`` of an eager call on CUDA tensors through the native op (the kernel
    library's LSTM-gates entry point, no Python in the backward), or None: where
    :func:`blocksparse.torch._native.eager_library` finds none, for a ``forget_bias`` that is not a
    float, and for calls the library's specs do not serve (the op checks shapes, dtypes, layout,
    alignment and autocast itself)."""
    if type(forget_bias) is not float or len(gates) not in (1, 4):
        return None
    kernels = _native.eager_library(c, *gates, bias)
    entry = None if kernels is None else _native.entry(kernels, "lstm_gates")
    return None if entry is None else _native.lstm_gates(c, gates, bias, forget_bias, entry)
