"""The three products of the block-sparse matmul on torch tensors: each picks the kernels (through
its cached :class:`~.plan.Plan`) or the reference path, and computes.  The eager autograd function
and the custom ops (:mod:`.ops`) both call these.

``fprop``  y = x @ W          ``bprop``  dx = dy @ W.T          ``updat``  dW = x.T @ dy, per block
"""
from __future__ import annotations

import torch

from ...ops.matmul.configs import KERNEL_BLOCK_SIZES
from .._backend import kernels_serve
from . import plan as _plan
from . import reference as _reference

__all__ = ["fprop", "bprop", "updat", "use_triton", "plan_of"]

def use_triton(t, block_size):
    """Whether the kernels serve a call on ``t`` (else the reference path does): the family's block
    sizes, then the rule every family shares (:func:`blocksparse.torch._backend.kernels_serve`)."""
    return block_size in KERNEL_BLOCK_SIZES and kernels_serve(t)


#: Elements from which a broadcast scalar is made dense as 8-byte words (as the native op does).
WORD_FILL_MIN = 1 << 20


def _strided(t):
    """``t``, or a contiguous copy where neither dimension is unit-stride (the kernels index
    activations through one unit stride), e.g. the expanded gradient of a ``sum()``."""
    s = t.stride()
    if s[0] != 1 and s[1] != 1 or 0 in s:
        return _dense_broadcast(t) if not any(s) else t.contiguous()
    return t


def _dense_broadcast(t):
    """A broadcast scalar (every stride 0: the gradient of a ``sum()`` or ``mean()``) made dense
    from its one element repeated as 8-byte words: the strided copy kernel is bound by per-element
    index arithmetic, and 16-bit elements are 4x as many."""
    e = t.element_size()
    if t.numel() < WORD_FILL_MIN or e >= 8 or t.numel() % (8 // e):
        return t.contiguous()
    word = t.as_strided((8 // e,), (0,)).contiguous().view(torch.int64)
    return word.expand(t.numel() * e // 8).contiguous().view(t.dtype).view(t.shape)


def plan_of(kind, a, b, layout_handle, axis, precision, dw_dtype=None, bias=False):
    """The :class:`~.plan.Plan` of a kernel call (inputs as the product functions take them);
    ``bias``: an fprop whose kernel adds the bias where it can (the plan's ``bias`` says)."""
    if a.dtype is not torch.float32:
        precision = "ieee"  # TF32 concerns float32 products only: one plan (and compiled spec) for both
    try:
        aligned = not (a.data_ptr() | b.data_ptr()) & 15
    except RuntimeError as exc:  # a tensor without storage: vmap's batched tensors
        raise RuntimeError("the block-sparse matmul kernels take tensors with storage: torch.func transforms "
                           "(vmap, grad, ...) are not supported; call the product per sample instead") from exc
    key = (kind, a.shape, a.stride(), b.stride() if kind == "updat" else None, a.dtype, a.get_device(), axis,
           precision, dw_dtype, aligned, bias)
    return _plan.state(layout_handle).plan(key, kind, a, b, axis, precision, dw_dtype, aligned, bias)


def _xprop(kind, x, w, layout_handle, axis, precision, bias=None):
    st = _plan.state(layout_handle)
    lay = st.layout
    if use_triton(x, lay.block_size) and x.numel():  # an empty batch: nothing to launch, the reference path
        x = _strided(x)
        if not w.is_contiguous():
            w = w.contiguous()
        return plan_of(kind, x, w, layout_handle, axis, precision, bias=bias is not None)(x, w, bias, axis)
    trans = kind == "bprop"
    coords = st.coords(x.device)
    inp, out = (coords[:, 1], coords[:, 0]) if trans else (coords[:, 0], coords[:, 1])
    return _reference.xprop(x, w, inp, out, (lay.C if trans else lay.K) // lay.block_size, lay.block_size, axis,
                            trans, lay.packing, bias)


def fprop(x, w, layout_handle, axis, precision, bias=None):
    """``y = x @ W (+ bias)``: ``x`` activations ``(N, C)`` (``axis=1``) or ``(C, N)``, ``w`` the packed
    weight, ``bias`` per output feature added to the float32 sums before the one rounding to ``y``'s dtype."""
    return _xprop("fprop", x, w, layout_handle, axis, precision, bias)


def bprop(dy, w, layout_handle, axis, precision):
    """``dx = dy @ W.T``."""
    return _xprop("bprop", dy, w, layout_handle, axis, precision)


def updat(x, dy, layout_handle, axis, precision, dw_dtype):
    """``dW = x.T @ dy`` on the layout's blocks, in ``dw_dtype``."""
    st = _plan.state(layout_handle)
    lay = st.layout
    if use_triton(x, lay.block_size) and x.numel():  # an empty batch: dW = 0 from the reference path
        x, dy = _strided(x), _strided(dy)
        return plan_of("updat", x, dy, layout_handle, axis, precision, dw_dtype)(x, dy)
    coords = st.coords(x.device)
    return _reference.updat(x, dy, coords[:, 0], coords[:, 1], lay.block_size, axis, dw_dtype, lay.packing)
