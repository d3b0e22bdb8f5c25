"""PyTorch custom ops of the block-sparse transformer.

``blocksparse::bst_nt``            scores = a·bᵀ on the layout's blocks   (N, H, blocks, bs, bs)
``blocksparse::bst_nn``            y = w·v                                (N, ctx_q, F)
``blocksparse::bst_tn``            y = wᵀ·x                               (N, ctx_k, F)
``blocksparse::bst_softmax``       masked softmax along query rows
``blocksparse::bst_softmax_grad``  its gradient

The three products are closed under differentiation (``d(nt) = nn, tn``; ``d(nn) = nt, tn``;
``d(tn) = nt, nn``), so their registered backward passes call these ops again and second order
works.  So does the softmax gradient's: with ``dx = scale * y * (dy - rowsum(dy * y))`` it is
``softmax_grad`` again in ``dy`` and elementwise products with row sums (``nn`` with ones, spread
back by ``nt`` with ones) in ``y``.  Each op takes a layout handle
(:func:`.state.handle`) and chooses at run time between the Triton kernels and the reference path
(:func:`blocksparse.torch._matmul.products.use_triton`, the same rule as the matmul); a fake function
per op lets ``torch.compile`` trace them without graph breaks.  Eager calls (:func:`nt`, :func:`nn`,
:func:`tn`, :func:`softmax`, :func:`softmax_grad`) run the implementations directly: autograd
functions with the same contexts and backward passes, no dispatcher.
"""

from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from .._autograd import call_op, direct_apply, eager_twin
from .._matmul.products import use_triton
from . import reference as _reference
from . import state as _state

PRECISION = "ieee"  # float32 products are exact (no TF32)


def _dense(t):
    """Unit stride along features (the kernels' addressing), other strides free."""
    return t if t.stride(-1) == 1 and 0 not in t.stride() else t.contiguous()


def _kernels():
    from . import launch
    return launch


# The reference path as plain PyTorch ops: the custom ops' CPU path, and what the frontend calls
# directly where the custom ops cannot serve (torch.func transforms, forward-mode tangents).
def plain_nt(a, b, layout):
    st = _state.state(layout)
    q_ids, k_ids = st.flat_ids(a.device)
    return _reference.nt(a, b, q_ids, k_ids, st.layout.heads, st.layout.block_size)


def plain_xn(w, x, layout, trans):
    st = _state.state(layout)
    lay = st.layout
    q_ids, k_ids = st.flat_ids(x.device)
    gather, scatter, out_blocks = (q_ids, k_ids, lay.KB) if trans else (k_ids, q_ids, lay.QB)
    return _reference.xn(w, x, gather, scatter, out_blocks, lay.heads, lay.block_size, trans)


def plain_softmax(x, layout, scale, autoregress_at_key, masked, dtype):
    st = _state.state(layout)
    keep = st.keep(x.device, masked and st.masks is not None, autoregress_at_key)
    return _reference.softmax(x, st.flat_ids(x.device)[0], keep, scale, st.layout.heads * st.layout.QB, dtype)


def _nt(a: Tensor, b: Tensor, layout: int) -> Tensor:
    st = _state.state(layout)
    lay = st.layout
    if use_triton(a, lay.block_size):
        return _kernels().nt(_dense(a), _dense(b), st.tables(a.device), heads=lay.heads, lut_heads=lay.lut_heads,
                             blocks=lay.blocks, bs=lay.block_size, precision=PRECISION)
    return plain_nt(a, b, layout)


bst_nt = torch.library.custom_op("blocksparse::bst_nt", mutates_args=())(_nt)


@bst_nt.register_fake
def _(a, b, layout):
    lay = _state.state(layout).layout
    return a.new_empty((a.shape[0], lay.heads, lay.blocks, lay.block_size, lay.block_size))


def _xn(w, x, layout, trans):
    st = _state.state(layout)
    lay = st.layout
    out_ctx = lay.ctx_k if trans else lay.ctx_q
    if use_triton(x, lay.block_size):
        return _kernels().xn(w.contiguous(), _dense(x), st.tables(x.device), trans=trans, out_ctx=out_ctx,
                             heads=lay.heads, lut_heads=lay.lut_heads, bs=lay.block_size, precision=PRECISION)
    return plain_xn(w, x, layout, trans)


def _xn_fake(w, x, layout, trans):
    lay = _state.state(layout).layout
    return x.new_empty((x.shape[0], lay.ctx_k if trans else lay.ctx_q, x.shape[2]))


def _nn(w: Tensor, v: Tensor, layout: int) -> Tensor:
    return _xn(w, v, layout, trans=False)


def _tn(w: Tensor, x: Tensor, layout: int) -> Tensor:
    return _xn(w, x, layout, trans=True)


bst_nn = torch.library.custom_op("blocksparse::bst_nn", mutates_args=())(_nn)
bst_tn = torch.library.custom_op("blocksparse::bst_tn", mutates_args=())(_tn)


bst_nn.register_fake(lambda w, v, layout: _xn_fake(w, v, layout, trans=False))
bst_tn.register_fake(lambda w, x, layout: _xn_fake(w, x, layout, trans=True))


def _softmax(x: Tensor, layout: int, scale: float, autoregress_at_key: Optional[int], masked: bool,
             dtype: torch.dtype) -> Tensor:
    st = _state.state(layout)
    lay = st.layout
    masked = masked and st.masks is not None
    if use_triton(x, lay.block_size):
        return _kernels().softmax(x.contiguous(), st.tables(x.device), scale=scale,
                                  autoregress_at_key=autoregress_at_key, masked=masked, lut_heads=lay.lut_heads,
                                  q_blocks=lay.QB, dtype=dtype)
    return plain_softmax(x, layout, scale, autoregress_at_key, masked, dtype)


bst_softmax = torch.library.custom_op("blocksparse::bst_softmax", mutates_args=())(_softmax)


@bst_softmax.register_fake
def _(x, layout, scale, autoregress_at_key, masked, dtype):
    return x.new_empty(x.shape, dtype=dtype)


def _softmax_grad(dy: Tensor, y: Tensor, layout: int, scale: float, dtype: torch.dtype) -> Tensor:
    st = _state.state(layout)
    lay = st.layout
    if use_triton(y, lay.block_size):
        return _kernels().softmax_grad(dy.contiguous(), y.contiguous(), st.tables(y.device), scale=scale,
                                       lut_heads=lay.lut_heads, q_blocks=lay.QB, dtype=dtype)
    return _reference.softmax_grad(dy, y, st.flat_ids(y.device)[0], scale, lay.heads * lay.QB, dtype)


bst_softmax_grad = torch.library.custom_op("blocksparse::bst_softmax_grad", mutates_args=())(_softmax_grad)


@bst_softmax_grad.register_fake
def _(dy, y, layout, scale, dtype):
    return y.new_empty(y.shape, dtype=dtype)


# ---------------------------------------------------------------- autograd

class _Ops(NamedTuple):
    """The ops a backward pass calls: the custom ops (their registered autograd) or the eager
    calls (the eager twins' backward passes).  Either is differentiable again."""

    nt: Callable
    nn: Callable
    tn: Callable
    softmax_grad: Callable


def _save_operands(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.layout = inputs[2]
    ctx.keep = _state.keep(inputs[2])  # the layout's state stays findable until the backward


def _softmax_setup(ctx, inputs, output):
    x, layout, scale = inputs[:3]
    ctx.save_for_backward(output)
    ctx.meta = (layout, scale, x.dtype)
    ctx.keep = _state.keep(layout)


def _softmax_grad_setup(ctx, inputs, output):
    dy, y, layout, scale = inputs[:4]
    ctx.save_for_backward(dy, y)
    ctx.meta = (layout, scale)


def _backwards(ops):
    """The five ops' backward passes, calling ``ops``."""

    def product(first, second):
        """The backward of a product of saved operands ``(a, b)``: their gradients
        ``first(a, b, g, layout)`` and ``second(a, b, g, layout)`` for the output gradient ``g``."""

        def backward(ctx, g):
            a, b = ctx.saved_tensors
            need, lay = ctx.needs_input_grad, ctx.layout
            return first(a, b, g, lay) if need[0] else None, second(a, b, g, lay) if need[1] else None, None

        return backward

    # d(nt) = nn, tn; d(nn) = nt, tn; d(tn) = nt, nn
    nt_backward = product(lambda a, b, dc, lay: ops.nn(dc, b, lay), lambda a, b, dc, lay: ops.tn(dc, a, lay))
    nn_backward = product(lambda w, v, dy, lay: ops.nt(dy, v, lay), lambda w, v, dy, lay: ops.tn(w, dy, lay))
    tn_backward = product(lambda w, x, dy, lay: ops.nt(x, dy, lay), lambda w, x, dy, lay: ops.nn(w, dy, lay))

    def softmax_backward(ctx, dy):
        (y,) = ctx.saved_tensors
        layout, scale, x_dtype = ctx.meta
        return ops.softmax_grad(dy, y, layout, scale, x_dtype), None, None, None, None, None

    def row_sums(w, layout):
        """Packed ``w``'s sum over each query row (the row's blocks), at every element of that row."""
        lay = _state.state(layout).layout
        ones = w.new_ones(w.shape[0], lay.ctx_k, lay.heads)   # head_dim 1: nn sums the row, nt spreads it
        return ops.nt(ops.nn(w, ones, layout), ones, layout)

    def softmax_grad_backward(ctx, g):
        """Gradients of ``dx = scale * y * (dy - r)``, ``r = rowsum(dy * y)``, for ``g = d/d(dx)``:
        ``d dy = scale * y * (g - rowsum(g * y))`` and ``d y = scale * (g * (dy - r) - dy * rowsum(g * y))``."""
        dy, y = ctx.saved_tensors
        layout, scale = ctx.meta
        g_dy = ops.softmax_grad(g.to(y.dtype), y, layout, scale, dy.dtype) if ctx.needs_input_grad[0] else None
        g_y = None
        if ctx.needs_input_grad[1]:
            g, dy_ = g.to(y.dtype), dy.to(y.dtype)
            g_y = scale * (g * (dy_ - row_sums(dy_ * y, layout)) - dy_ * row_sums(g * y, layout))
        return g_dy, g_y, None, None, None

    return nt_backward, nn_backward, tn_backward, softmax_backward, softmax_grad_backward


#: (name, custom op, implementation, setup_context, indices of the tensor arguments) of each op,
#: in :func:`_backwards`' order
_TABLE = (("Nt", bst_nt, _nt, _save_operands, (0, 1)), ("Nn", bst_nn, _nn, _save_operands, (0, 1)),
          ("Tn", bst_tn, _tn, _save_operands, (0, 1)), ("Softmax", bst_softmax, _softmax, _softmax_setup, (0,)),
          ("SoftmaxGrad", bst_softmax_grad, _softmax_grad, _softmax_grad_setup, (0, 1)))


def _eager(i):
    """Op ``i`` of :data:`_TABLE` as an eager call: the custom op while ``torch.compile`` traces,
    else its eager twin or its implementation (:func:`~.._autograd.call_op`)."""
    _, op, impl, _, tensors = _TABLE[i]

    def call(*args):
        return call_op(op, _twins[i], impl, args, [args[k] for k in tensors])

    return call


nt, nn, tn, softmax, softmax_grad = (_eager(i) for i in range(len(_TABLE)))
for (_, op, _, setup, _), backward in zip(_TABLE, _backwards(_Ops(bst_nt, bst_nn, bst_tn, bst_softmax_grad))):
    op.register_autograd(backward, setup_context=setup)
_twins = [direct_apply(eager_twin(f"Bst{name}Function", impl, setup, backward))
          for (name, _, impl, setup, _), backward in zip(_TABLE, _backwards(_Ops(nt, nn, tn, softmax_grad)))]
