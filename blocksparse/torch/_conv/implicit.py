"""The implicit-GEMM path of the PyTorch convolution: launcher, autograd, custom op.

Forward: the Triton kernel of :mod:`blocksparse.ops.conv.implicit_gemm` on channels-last
activations.  The input is read channels-last (a channels-last tensor as it is; any other is copied
once, which costs one pass over the input but makes every chunk of channels one coalesced load),
and the output is written channels-last: an ``(N, K) + MPQ`` tensor with channels-last strides, as
cuDNN returns for channels-last inputs.  Backward: the gradients of the dense masked convolution
(:func:`.dense.dense_grads`, one cuDNN ``convolution_backward``), the filter's gathered back to
the blocks.

``blocksparse::conv_implicit`` (with a fake function and registered autograd) serves
``torch.compile``; eager calls take :class:`ImplicitConvFunction` directly (no dispatcher).  The op
receives an integer *handle* of the op's :class:`~.tables.Tables` (see :func:`register`), so that
the compiler sees only tensors, ints and strings at its boundary; the dense filter's index is an
input, since the backward (traced by the compiler) builds the dense filter from it.
"""
from __future__ import annotations

import itertools
import weakref

import torch
import triton
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...ops.conv.implicit_gemm import conv_implicit_fwd_kernel
from .._autograd import direct_apply
from .._backend import kernels_serve
from .dense import dense_grads

__all__ = ["implicit", "register", "serves", "conv_implicit_fwd", "ImplicitConvFunction", "conv_implicit_op"]

_HANDLES = weakref.WeakValueDictionary()  # handle -> Tables; an op's handle lives as long as the op
_NEXT = itertools.count()


def register(tables):
    """A new handle of ``tables`` (a :class:`~.tables.Tables` whose spec has an implicit plan)."""
    handle = next(_NEXT)
    _HANDLES[handle] = tables
    return handle


def _tables(handle):
    return _HANDLES[handle]


def serves(spec, x):
    """Whether the kernel can run this call (a convolution, a kernel dtype on a device it runs on)."""
    return spec.implicit is not None and kernels_serve(x)


def _precision(x):
    return "tf32" if x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32 else "ieee"


def _out_shape(x, spec):
    return (x.shape[0], *spec.geometry.MPQ, spec.blocks.K)


def _spatial3(values, fill):
    """A per-axis tuple as three axes (1-D / 2-D convolutions lead with neutral axes)."""
    return (fill,) * (3 - len(values)) + tuple(values)


def conv_implicit_fwd(x, flat, spec, device_tables, precision):
    """``y`` (``(N, K) + MPQ``, channels-last strides) of input ``x`` (``(N, C) + DHW``) and the flat
    filter, both of one kernel dtype."""
    plan, geometry = spec.implicit, spec.geometry
    n = x.shape[0]
    x_last = x.movedim(1, -1).contiguous()  # no copy for channels-last input
    x5 = x_last.view(n, *_spatial3(x.shape[2:], 1), x.shape[1])
    w = flat.index_select(0, device_tables.implicit_weight)
    alloc = torch.empty if plan.covers else torch.zeros  # channels no block writes stay zero
    y = alloc(_out_shape(x, spec), dtype=x.dtype, device=x.device)
    pixels, tiles = y.numel() // max(spec.blocks.K, 1), plan.tiles.shape[0]
    if pixels:
        axes = geometry.axes
        image = _spatial3([a.image for a in axes], 1)
        out = _spatial3([a.out for a in axes], 1)
        conv_implicit_fwd_kernel[lambda meta: (tiles * triton.cdiv(pixels, meta["BM"]),)](
            x5, w, y, device_tables.implicit_steps, device_tables.implicit_tiles,
            tiles, pixels, spec.blocks.K,
            *image, *out, *x5.stride()[:4],
            *_spatial3(geometry.strides, 1), *_spatial3(geometry.dilates, 1),
            *_spatial3([a.pad for a in axes], 0), *_spatial3(geometry.TRS, 1)[1:],
            BN=plan.block_n, BK=plan.block_k, PRECISION=precision,
        )
    return y.movedim(-1, 1)


class ImplicitConvFunction(torch.autograd.Function):
    """``y`` of the kernel; gradients of the dense masked convolution."""

    @staticmethod
    def forward(ctx, x, flat, dense_index, handle, precision):
        tables = _tables(handle)
        ctx.save_for_backward(x, flat, dense_index)
        ctx.handle = handle
        return conv_implicit_fwd(x, flat, tables.spec, tables.on(x.device), precision)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return (*_grads(ctx, dy), None, None, None)


def _grads(ctx, dy):
    x, flat, dense_index = ctx.saved_tensors
    need_x, need_flat = ctx.needs_input_grad[:2]
    return dense_grads(dy, x, flat, _tables(ctx.handle).spec, dense_index, need_x, need_flat)


_apply = direct_apply(ImplicitConvFunction)


@torch.library.custom_op("blocksparse::conv_implicit", mutates_args=())
def conv_implicit_op(x: Tensor, flat: Tensor, dense_index: Tensor, handle: int, precision: str) -> Tensor:
    tables = _tables(handle)
    return conv_implicit_fwd(x, flat, tables.spec, tables.on(x.device), precision)


@conv_implicit_op.register_fake
def _(x, flat, dense_index, handle, precision):
    return x.new_empty(_out_shape(x, _tables(handle).spec)).movedim(-1, 1)


def _setup_context(ctx, inputs, output):
    x, flat, dense_index, handle, _ = inputs
    ctx.save_for_backward(x, flat, dense_index)
    ctx.handle = handle


def _backward_op(ctx, dy):
    return (*_grads(ctx, dy), None, None, None)


conv_implicit_op.register_autograd(_backward_op, setup_context=_setup_context)


def implicit(x, flat, spec, device_tables):
    """The implicit path's output (the custom op while ``torch.compile`` traces)."""
    precision = _precision(x)
    if torch.compiler.is_compiling():
        return conv_implicit_op(x, flat, device_tables.dense, device_tables.implicit_handle, precision)
    if torch.is_grad_enabled() and (x.requires_grad or flat.requires_grad):
        return _apply(x, flat, device_tables.dense, device_tables.implicit_handle, precision)
    return conv_implicit_fwd(x, flat, spec, device_tables, precision)
