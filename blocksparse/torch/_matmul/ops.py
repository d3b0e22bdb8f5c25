"""PyTorch custom ops of the block-sparse matmul.

``blocksparse::matmul``     y = x @ W            (differentiable: registered autograd)
``blocksparse::matmul_dx``  dx = dy @ W.T
``blocksparse::matmul_dw``  dW = x.T @ dy, per block

Each takes the activations, the packed weight (or the gradient), an integer layout handle from
:func:`blocksparse.torch._plan.handle`, the activation layout (``axis``) and the float32 precision
(``"ieee"`` or ``"tf32"``).  Each op chooses at run time between the Triton kernels and the reference
path (:func:`use_triton`); both give the same answer.  A fake (shape) function per op lets
``torch.compile`` trace them without graph breaks.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ... import _env
from ...ops.matmul.configs import KERNEL_BLOCK_SIZES
from . import plan as _plan
from . import reference as _reference

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def use_triton(t: Tensor, block_size: int) -> bool:
    """Whether the Triton kernels serve a call on ``t`` (else the reference path does)."""
    backend = _env.backend()
    if backend == "reference" or block_size not in KERNEL_BLOCK_SIZES or t.dtype not in KERNEL_DTYPES:
        return False
    if backend == "triton":
        if not (t.is_cuda or _env.triton_interpret()):
            raise RuntimeError("BLOCKSPARSE_BACKEND=triton needs CUDA tensors, or TRITON_INTERPRET=1 "
                               f"to run the kernels on the CPU; got a tensor on {t.device}")
        return True
    return t.is_cuda and _triton_importable()


def _triton_importable():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _tokens(t, axis):
    return t.shape[0] if axis == 1 else t.shape[1]


def _out_like(x, features, axis):
    n = _tokens(x, axis)
    return x.new_empty((n, features) if axis == 1 else (features, n))


def _xprop(kind, x, w, layout_handle, axis, precision):
    st = _plan.state(layout_handle)
    lay = st.layout
    trans = kind == "bprop"
    out_features = lay.C if trans else lay.K
    if use_triton(x, lay.block_size):
        from . import launch as _triton
        plan = st.plan(kind, _tokens(x, axis), x.device, x.dtype, _triton.tma_ok(x, w))
        headers, entries = st.xprop_tables(kind, plan, x.device)
        return _triton.xprop(x, w, headers, entries, out_features=out_features, bs=lay.block_size,
                             axis=axis, trans=trans, cfg=plan.config,
                             atomic=plan.max_segment is not None, precision=precision)
    coords = st.coords(x.device)
    inp, out = (coords[:, 1], coords[:, 0]) if trans else (coords[:, 0], coords[:, 1])
    return _reference.xprop(x, w, inp, out, out_features // lay.block_size, lay.block_size, axis, trans)


@torch.library.custom_op("blocksparse::matmul", mutates_args=())
def matmul(x: Tensor, w: Tensor, layout: int, axis: int, precision: str) -> Tensor:
    return _xprop("fprop", x, w, layout, axis, precision)


@matmul.register_fake
def _(x, w, layout, axis, precision):
    return _out_like(x, _plan.state(layout).layout.K, axis)


@torch.library.custom_op("blocksparse::matmul_dx", mutates_args=())
def matmul_dx(dy: Tensor, w: Tensor, layout: int, axis: int, precision: str) -> Tensor:
    return _xprop("bprop", dy, w, layout, axis, precision)


@matmul_dx.register_fake
def _(dy, w, layout, axis, precision):
    return _out_like(dy, _plan.state(layout).layout.C, axis)


@torch.library.custom_op("blocksparse::matmul_dw", mutates_args=())
def matmul_dw(x: Tensor, dy: Tensor, layout: int, axis: int, precision: str,
              dw_dtype: torch.dtype) -> Tensor:
    st = _plan.state(layout)
    lay = st.layout
    if use_triton(x, lay.block_size):
        from . import launch as _triton
        plan = st.plan("updat", _tokens(x, axis), x.device, x.dtype, _triton.tma_ok(x, dy))
        return _triton.updat(x, dy, st.updat_table(plan, x.device), w_shape=lay.w_shape,
                             bs=lay.block_size, axis=axis, cfg=plan.config, split=plan.split,
                             precision=precision, dw_dtype=dw_dtype)
    coords = st.coords(x.device)
    return _reference.updat(x, dy, coords[:, 0], coords[:, 1], lay.block_size, axis, dw_dtype)


@matmul_dw.register_fake
def _(x, dy, layout, axis, precision, dw_dtype):
    return x.new_empty(_plan.state(layout).layout.w_shape, dtype=dw_dtype)


def _setup_context(ctx, inputs, output):
    x, w, layout, axis, precision = inputs
    ctx.save_for_backward(x, w)
    ctx.meta = (layout, axis, precision)


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    layout, axis, precision = ctx.meta
    if 0 in dy.stride() or (dy.stride(0) != 1 and dy.stride(1) != 1):
        dy = dy.contiguous()  # e.g. the expanded ones of a sum(): give the kernels real strides
    dx = matmul_dx(dy, w, layout, axis, precision) if ctx.needs_input_grad[0] else None
    dw = matmul_dw(x, dy, layout, axis, precision, w.dtype) if ctx.needs_input_grad[1] else None
    return dx, dw, None, None, None


matmul.register_autograd(_backward, setup_context=_setup_context)
