"""PyTorch custom ops of the fused block-sparse attention.

``blocksparse::attention_fwd``  (q, k, v, seqlens?, layout, causal, scale, layout_now?) -> (o, lse);
                                differentiable in q, k, v (registered autograd)
``blocksparse::attention_bwd``  (do, q, k, v, o, lse, seqlens?, layout, causal, scale, layout_now?) ->
                                (dq, dk, dv); differentiating it again raises a ``RuntimeError`` that says so

``layout`` is an integer handle from :mod:`.state`.  ``layout_now``: a raw layout array's contents as
a compiled call passes them (``torch.compile`` traced the handle of the array it first saw, and
guards its shape, not its values): the ops take the handle of these contents (:func:`current`).  Each op chooses at run time between the Triton
kernels and the reference path (:func:`use_triton`); both give the same answer.  Fake (shape)
functions let ``torch.compile(fullgraph=True)`` trace them.

Eager calls skip the dispatcher: :func:`attention` runs the same implementations through
:class:`AttentionFunction` (applied without ``Function.apply``'s Python wrapper), or the forward
alone when no gradient is wanted -- a custom op's Python dispatch costs more host time than the
launches it wraps.
"""

from typing import Optional

import torch
from torch import Tensor

from ...ops.attention import configs
from .._autograd import direct_apply
from .._backend import kernels_serve
from . import reference as _reference
from . import state as _state

#: The fused kernels take 16-bit inputs only (float32 takes the reference path).
KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def use_triton(q: Tensor, block_size: int) -> bool:
    """Whether the Triton kernels serve a call on ``q`` (else the reference path does): the
    family's dtypes, head dims and block sizes, then the rule every family shares
    (:func:`blocksparse.torch._backend.kernels_serve`)."""
    if (q.dtype not in KERNEL_DTYPES or q.shape[-1] not in configs.HEAD_DIMS
            or block_size not in configs.KERNEL_BLOCK_SIZES):
        return False
    return kernels_serve(q)


def plain_forward(q, k, v, seqlens, layout, causal, scale):
    """``(o, lse)`` on the reference path as plain PyTorch ops: the custom op's CPU path, and what
    :func:`blocksparse.torch.attention` calls directly where the custom ops cannot serve
    (``torch.func`` transforms, forward-mode tangents)."""
    st = _state.state(layout)
    return _reference.forward(q, k, v, st.dense_mask(causal, q.device), seqlens, scale)


def forward_pass(q, k, v, seqlens, layout, causal, scale):
    """``(o, lse)`` on the kernels or the reference path."""
    st = _state.state(layout)
    if use_triton(q, st.block_size):
        from . import launch
        return launch.fwd(q, k, v, seqlens, st.tables(causal, q.device), block_size=st.block_size,
                          causal=causal, scale=scale, cfg=configs.fwd_config(q.shape[-1], st.block_size))
    return plain_forward(q, k, v, seqlens, layout, causal, scale)


def backward_pass(do, q, k, v, o, lse, seqlens, layout, causal, scale):
    """``(dq, dk, dv)`` of :func:`forward_pass`'s ``o`` on the kernels or the reference path."""
    st = _state.state(layout)
    if use_triton(q, st.block_size):
        from . import launch
        return launch.bwd(do, q, k, v, o, lse, seqlens, st.tables(causal, q.device), block_size=st.block_size,
                          causal=causal, scale=scale,
                          cfg=configs.bwd_config(q.shape[-1], st.block_size, st.density(causal)))
    return _reference.backward(do, q, k, v, o, st.dense_mask(causal, q.device), seqlens, scale)


def current(layout, layout_now):
    """The handle of ``layout_now``'s contents where they differ from those of handle ``layout``
    (a compiled call passing a raw layout array other than the one traced), else ``layout``."""
    if layout_now is None:
        return layout
    from ..fused_attention import _current_handle  # the public module prepares raw layouts
    return _current_handle(layout, layout_now)


@torch.library.custom_op("blocksparse::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, seqlens: Optional[Tensor], layout: int, causal: bool,
                  scale: float, layout_now: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    return forward_pass(q, k, v, seqlens, current(layout, layout_now), causal, scale)


@attention_fwd.register_fake
def _(q, k, v, seqlens, layout, causal, scale, layout_now):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("blocksparse::attention_bwd", mutates_args=())
def attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, seqlens: Optional[Tensor],
                  layout: int, causal: bool, scale: float,
                  layout_now: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    return backward_pass(do, q, k, v, o, lse, seqlens, current(layout, layout_now), causal, scale)


@attention_bwd.register_fake
def _(do, q, k, v, o, lse, seqlens, layout, causal, scale, layout_now):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, seqlens, layout, causal, scale, layout_now = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, seqlens, layout_now)
    ctx.meta = (layout, causal, scale)
    ctx.keep = _state.keep(layout)  # the layout's state stays findable until the backward
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, seqlens, layout_now = ctx.saved_tensors
    layout, causal, scale = ctx.meta
    dq, dk, dv = attention_bwd(do, q, k, v, o, lse, seqlens, layout, causal, scale, layout_now)
    return dq, dk, dv, None, None, None, None, None


def _no_double_backward(ctx, *grads):
    raise RuntimeError("blocksparse.torch.attention is differentiable once: the gradient of its gradient "
                       "(double backward) is not implemented")


attention_fwd.register_autograd(_backward, setup_context=_setup_context)
attention_bwd.register_autograd(_no_double_backward, setup_context=lambda ctx, inputs, output: None)


class AttentionFunction(torch.autograd.Function):
    """The eager path with a gradient: :func:`forward_pass` and :func:`backward_pass` called directly.  A
    backward that builds a graph (``create_graph=True``) goes through :func:`attention_bwd`, whose
    gradient says clearly that double backward is not implemented."""

    @staticmethod
    def forward(ctx, q, k, v, seqlens, layout, causal, scale):
        o, lse = forward_pass(q, k, v, seqlens, layout, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse, seqlens)
        ctx.meta = (layout, causal, scale)
        ctx.keep = _state.keep(layout)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, seqlens = ctx.saved_tensors
        layout, causal, scale = ctx.meta
        if torch.is_grad_enabled():
            dq, dk, dv = attention_bwd(do, q, k, v, o, lse, seqlens, layout, causal, scale, None)
        else:
            dq, dk, dv = backward_pass(do, q, k, v, o, lse, seqlens, layout, causal, scale)
        return dq, dk, dv, None, None, None, None


_apply = direct_apply(AttentionFunction)


def attention(q, k, v, seqlens, layout, causal, scale, layout_now=None):
    """``o`` (checked inputs): the custom op while ``torch.compile`` traces (``layout_now``: see the
    module's notes), else the eager path -- :class:`AttentionFunction` when a gradient is wanted,
    the forward alone when not."""
    if torch.compiler.is_compiling():
        return attention_fwd(q, k, v, seqlens, layout, causal, scale, layout_now)[0]
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _apply(q, k, v, seqlens, layout, causal, scale)
    return forward_pass(q, k, v, seqlens, layout, causal, scale)[0]
