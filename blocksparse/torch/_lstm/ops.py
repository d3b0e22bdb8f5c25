"""PyTorch custom ops of the fused LSTM gates, one pair per input packing.

``blocksparse::lstm_gates``      ``(c, h (N, 4K), bias?) -> (c_next, h_next)``       (registered autograd)
``blocksparse::lstm_gates_bwd``  ``-> (dc, dh (N, 4K), dbias)``
``blocksparse::lstm_gates4``     ``(c, i, j, f, o, bias?) -> (c_next, h_next)``      (registered autograd)
``blocksparse::lstm_gates4_bwd`` ``-> (dc, di, dj, df, do, dbias)``

``dbias`` is an empty ``(0,)`` placeholder without a bias.  Each op chooses at run time between
the Triton kernels and the reference path (:func:`blocksparse.torch._backend.kernels_serve`);
fake (shape) functions let ``torch.compile`` trace them.  A backward pass that builds a graph
(``create_graph=True``, double backward) runs the reference formulas, which autograd differentiates
again.
"""

from typing import Optional

import torch
from torch import Tensor

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


@torch.library.custom_op("blocksparse::lstm_gates", mutates_args=())
def lstm_gates(c: Tensor, h: Tensor, bias: Optional[Tensor], forget_bias: float) -> tuple[Tensor, Tensor]:
    return _forward(c, _split(h), bias, forget_bias)


@lstm_gates.register_fake
def _(c, h, bias, forget_bias):
    return _outputs_like(c)


@torch.library.custom_op("blocksparse::lstm_gates_bwd", mutates_args=())
def lstm_gates_bwd(c: Tensor, h: Tensor, bias: Optional[Tensor], dc_next: Tensor, dh_next: Tensor,
                   forget_bias: float) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_of(c, _split(h), bias, dc_next, dh_next, forget_bias, merged=True)


@lstm_gates_bwd.register_fake
def _(c, h, bias, dc_next, dh_next, forget_bias):
    return c.new_empty(c.shape), h.new_empty(h.shape), _dbias_like(bias, c)


@torch.library.custom_op("blocksparse::lstm_gates4", mutates_args=())
def lstm_gates4(c: Tensor, i: Tensor, j: Tensor, f: Tensor, o: Tensor, bias: Optional[Tensor],
                forget_bias: float) -> tuple[Tensor, Tensor]:
    return _forward(c, (i, j, f, o), bias, forget_bias)


@lstm_gates4.register_fake
def _(c, i, j, f, o, bias, forget_bias):
    return _outputs_like(c)


@torch.library.custom_op("blocksparse::lstm_gates4_bwd", mutates_args=())
def lstm_gates4_bwd(c: Tensor, i: Tensor, j: Tensor, f: Tensor, o: Tensor, bias: Optional[Tensor],
                    dc_next: Tensor, dh_next: Tensor, forget_bias: float
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    dc, dgates, dbias = _backward_of(c, (i, j, f, o), bias, dc_next, dh_next, forget_bias, merged=False)
    return (dc, *dgates, dbias)


@lstm_gates4_bwd.register_fake
def _(c, i, j, f, o, bias, dc_next, dh_next, forget_bias):
    return (c.new_empty(c.shape), *(t.new_empty(t.shape) for t in (i, j, f, o)), _dbias_like(bias, c))


def _setup_context(ctx, inputs, output):
    *tensors, forget_bias = inputs
    ctx.save_for_backward(*tensors)
    ctx.forget_bias = forget_bias


def _grads(ctx, dgates, dbias):
    """(dgates..., dbias, None for forget_bias), None where no gradient is needed."""
    has_bias = ctx.saved_tensors[-1] is not None
    grads = (*dgates, dbias if has_bias else None, None)
    return tuple(gr if need else None for gr, need in zip(grads, ctx.needs_input_grad[1:]))


def _differentiable_bwd(c, gates, bias, dc_next, dh_next, forget_bias, merged):
    """The reference backward, which autograd differentiates again: used when the backward pass
    builds a graph (``create_graph=True``, double backward)."""
    return _reference.lstm_gates_bwd(c, gates, bias, dc_next, dh_next, forget_bias=forget_bias, merged=merged)


def _backward(ctx, dc_next, dh_next):
    c, h, bias = ctx.saved_tensors
    if torch.is_grad_enabled():
        dc, dh, dbias = _differentiable_bwd(c, _split(h), bias, dc_next, dh_next, ctx.forget_bias, True)
    else:
        dc, dh, dbias = lstm_gates_bwd(c, h, bias, dc_next, dh_next, ctx.forget_bias)
    return (dc if ctx.needs_input_grad[0] else None, *_grads(ctx, (dh,), dbias))


def _backward4(ctx, dc_next, dh_next):
    c, i, j, f, o, bias = ctx.saved_tensors
    if torch.is_grad_enabled():
        dc, (di, dj, df, do), dbias = _differentiable_bwd(c, (i, j, f, o), bias, dc_next, dh_next,
                                                          ctx.forget_bias, False)
    else:
        dc, di, dj, df, do, dbias = lstm_gates4_bwd(c, i, j, f, o, bias, dc_next, dh_next, ctx.forget_bias)
    return (dc if ctx.needs_input_grad[0] else None, *_grads(ctx, (di, dj, df, do), dbias))


lstm_gates.register_autograd(_backward, setup_context=_setup_context)
lstm_gates4.register_autograd(_backward4, setup_context=_setup_context)
