"""The dense path of the PyTorch convolution: one ``conv`` / ``conv_transpose`` with the dense
filter that is zero outside the blocks; and that convolution's gradients, which the implicit-GEMM
path (:mod:`.implicit`) takes for its backward.

Padding goes to the convolution itself where it is symmetric (no copy of the input); the
remainder is an explicit ``F.pad`` (negative amounts crop) or, for transposed convolutions,
``output_padding``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["dense", "dense_filter", "dense_grads", "grad_frame", "pad", "pad_widths", "convolution", "transposed"]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def pad_widths(pairs):
    """``F.pad``'s widths (last axis first) of ``(before, after)`` pairs per spatial axis; ``[]``
    where all are zero."""
    return [v for pair in reversed(pairs) for v in pair] if any(map(any, pairs)) else []


def pad(x, pairs):
    """``x`` with ``(before, after)`` zeros around each spatial axis (negative amounts crop)."""
    widths = pad_widths(pairs)
    return F.pad(x, widths) if widths else x


def _tail(geometry):
    """Zeros after the image beyond the symmetric padding the convolution adds itself."""
    return [(0, max(a.pad_after - a.pad, 0)) for a in geometry.axes]


def convolution(x, w, geometry, groups):
    axes = geometry.axes
    x = pad(x, _tail(geometry))
    y = _CONV[geometry.ndim](x, w, stride=geometry.strides, padding=[a.pad for a in axes],
                             dilation=geometry.dilates, groups=groups)
    if any(y.shape[2 + i] != a.out for i, a in enumerate(axes)):  # pad_after < pad: extra outputs
        y = y[(slice(None), slice(None)) + tuple(slice(0, a.out) for a in axes)]
    return y


def transposed(x, w, geometry, groups):
    axes = geometry.axes
    extra = [a.pad - a.pad_after for a in axes]  # outputs after conv_transpose's padded crop
    common = dict(stride=geometry.strides, dilation=geometry.dilates, groups=groups)
    if all(0 <= e < max(a.stride, a.dilate) for e, a in zip(extra, axes)):  # output_padding's range
        return _CONV_T[geometry.ndim](x, w, padding=[a.pad for a in axes], output_padding=extra, **common)
    full = _CONV_T[geometry.ndim](x, w, **common)  # the whole padded frame, cropped to the image
    return pad(full, [(-a.pad, -a.pad_after) for a in axes])


def dense_filter(flat, spec, index):
    """The dense filter, ``(K, C) + TRS`` (transposed: ``(C, K) + TRS``), zero outside the blocks;
    ``index``: where each flat filter element goes (the tables' ``dense``)."""
    blocks = spec.blocks
    w = flat.new_zeros(blocks.dense_shape[0] * blocks.dense_shape[1] * blocks.trs).scatter(0, index, flat)
    return w.view(*blocks.dense_shape[:2], *spec.geometry.TRS)


def dense(x, flat, spec, tables):
    w = dense_filter(flat, spec, tables.dense)
    if spec.transposed:
        return transposed(x, w, spec.geometry, 1)
    return convolution(x, w, spec.geometry, 1)


def grad_frame(geometry):
    """``(x pairs, dy pairs)`` of a convolution (not transposed): the zeros after the input beyond the
    symmetric padding, and after the output gradient for the extra outputs the forward cropped, that
    make one ``convolution_backward`` with the symmetric padding compute the op's gradients."""
    tail = _tail(geometry)
    full = [(a.image + after + 2 * a.pad - a.extent) // a.stride + 1 for (_, after), a in zip(tail, geometry.axes)]
    return tail, [(0, f - a.out) for f, a in zip(full, geometry.axes)]


def dense_grads(dy, x, flat, spec, index, need_x, need_flat, traced=False):
    """``(dx, dflat)`` of a convolution (not transposed) for output gradient ``dy``, from one
    ``convolution_backward`` with the dense filter (None where not needed); ``index``: as for
    :func:`dense_filter`.  The filter gradient alone reads no filter values: the dense filter is
    then only allocated (its shape and layout), not built -- zero-filled where ``traced``
    (``torch.compile``'s backward graph: an unread empty tensor written to is no functional value)."""
    geometry = spec.geometry
    tail, dy_pairs = grad_frame(geometry)
    x_padded = pad(x, tail)
    dy = pad(dy, dy_pairs)  # the cropped extra outputs
    blocks = spec.blocks
    shape = (*blocks.dense_shape[:2], *geometry.TRS)
    if need_x:
        w = dense_filter(flat, spec, index)
    else:
        w = flat.new_zeros(shape) if traced or torch.compiler.is_compiling() else flat.new_empty(shape)
    dx, dw, _ = torch.ops.aten.convolution_backward(
        dy, x_padded, w, None, list(geometry.strides),
        [a.pad for a in geometry.axes], list(geometry.dilates), False, [0] * geometry.ndim, 1,
        [need_x, need_flat, False])
    if need_x:
        dx = pad(dx, [(0, -after) for _, after in tail])
    return dx, (dw.reshape(-1).index_select(0, index) if need_flat else None)
