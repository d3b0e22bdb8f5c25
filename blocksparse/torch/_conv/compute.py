"""The three paths of the PyTorch convolution and the choice between them; weight normalisation.

* dense: one ``conv`` / ``conv_transpose`` with the dense filter that is zero outside the blocks.
  Any layout; the CPU path (float32 math for half types) and, on CUDA, the path for dense layouts
  or narrow blocks.
* grouped: the plan of :mod:`blocksparse.ops.conv.grouping`: channel gathers, grouped cuDNN
  convolutions, one output shuffle.  CUDA tensors, for sparse layouts of wide blocks.
* matmul: the plan of :mod:`blocksparse.ops.conv.pointwise`: a 1x1 convolution on a block grid as
  the library's block-sparse matmul over the pixels (its Triton kernels on CUDA), no gather.

float32 convolutions follow ``torch.backends.cudnn.allow_tf32`` on every path (the matmul path
asks its kernels for TF32 products when it is set, as cuDNN then computes).

Padding goes to the convolution itself where it is symmetric (no copy of the input); the
remainder is an explicit ``F.pad`` (negative amounts crop) or, for transposed convolutions,
``output_padding``.  Channels-last inputs stay channels-last through the gathers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import _env
from .._matmul import ops as _matmul_ops

__all__ = ["convolve", "dense", "grouped", "matmul", "choose", "filter_of", "l2_normalize"]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def choose(spec, x, training=False):
    """``"matmul"``, ``"grouped"`` or ``"dense"`` for a call on ``x``; ``training``: a gradient
    will be taken.  Measured on an H200 (``bench/results/conv-h200.md``): the grouped and matmul
    paths lose to the dense masked convolution in every forward + backward, and win forward-only
    only where ``spec`` says so (wide blocks, low density) -- so training takes the dense path."""
    if _env.backend() == "reference" or not x.is_cuda or training:
        return "dense"
    if spec.prefers_matmul:
        return "matmul"
    return "grouped" if spec.prefers_grouped else "dense"


def _pad(x, pairs):
    """``x`` with ``(before, after)`` zeros around each spatial axis (negative amounts crop)."""
    if not any(map(any, pairs)):
        return x
    return F.pad(x, [v for pair in reversed(pairs) for v in pair])


def _convolution(x, w, geometry, groups):
    axes = geometry.axes
    x = _pad(x, [(0, max(a.pad_after - a.pad, 0)) for a in axes])
    y = _CONV[geometry.ndim](x, w, stride=geometry.strides, padding=[a.pad for a in axes],
                             dilation=geometry.dilates, groups=groups)
    if any(y.shape[2 + i] != a.out for i, a in enumerate(axes)):  # pad_after < pad: extra outputs
        y = y[(slice(None), slice(None)) + tuple(slice(0, a.out) for a in axes)]
    return y


def _transposed(x, w, geometry, groups):
    axes = geometry.axes
    extra = [a.pad - a.pad_after for a in axes]  # outputs after conv_transpose's padded crop
    common = dict(stride=geometry.strides, dilation=geometry.dilates, groups=groups)
    if all(0 <= e < max(a.stride, a.dilate) for e, a in zip(extra, axes)):  # output_padding's range
        return _CONV_T[geometry.ndim](x, w, padding=[a.pad for a in axes], output_padding=extra, **common)
    full = _CONV_T[geometry.ndim](x, w, **common)  # the whole padded frame, cropped to the image
    return _pad(full, [(-a.pad, -a.pad_after) for a in axes])


def filter_of(flat, shape, index):
    """``flat[index]`` viewed as ``shape`` (a block-sparse filter gathered into a dense one)."""
    return flat.index_select(0, index.reshape(-1)).view(shape)


def dense(x, flat, spec, tables):
    blocks, geometry = spec.blocks, spec.geometry
    size = blocks.dense_shape[0] * blocks.dense_shape[1] * blocks.trs
    w = flat.new_zeros(size).scatter(0, tables.dense, flat)
    w = w.view(*blocks.dense_shape[:2], *geometry.TRS)
    if spec.transposed:
        return _transposed(x, w, geometry, 1)
    return _convolution(x, w, geometry, 1)


def _channels(x, index):
    """``x[:, index]`` keeping a channels-last tensor channels-last."""
    if x.dim() > 3 and x.stride(1) == 1 and not x.is_contiguous():
        last = [0, *range(2, x.dim()), 1]
        return x.permute(last).index_select(-1, index).permute(0, x.dim() - 1, *range(1, x.dim() - 1))
    return x.index_select(1, index)


def grouped(x, flat, spec, tables):
    plan, geometry = spec.grouped, spec.geometry
    outs = []
    for bucket, inputs, weight in zip(plan.buckets, tables.inputs, tables.weight):
        if bucket.input_span == (0, x.shape[1]):
            xb = x
        elif bucket.input_span is not None:
            xb = x[:, bucket.input_span[0]:bucket.input_span[1]]
        else:
            xb = _channels(x, inputs)
        w = filter_of(flat, (*bucket.weight.shape[:2], *geometry.TRS), weight)
        run = _transposed if spec.transposed else _convolution
        outs.append(run(xb, w, geometry, bucket.groups))
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    if plan.assemble == "permute":
        return _channels(y, tables.order)
    if plan.assemble == "add":
        return y.new_zeros((y.shape[0], plan.channels, *y.shape[2:])).index_add(1, tables.order, y)
    return y


def matmul(x, flat, spec, tables):
    plan = spec.pointwise
    if max(plan.strides) > 1:  # a 1x1 window reads every stride-th pixel
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in plan.strides)]
    n, channels, *size = x.shape
    pixels = x.movedim(1, -1).reshape(-1, channels)  # no copy for channels-last input
    w = filter_of(flat, plan.weight.shape, tables.pointwise)
    tf32 = x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32
    y = _matmul_ops.matmul(pixels, w, tables.matmul_handle, 1, "tf32" if tf32 else "ieee")
    return y.view(n, *size, y.shape[-1]).movedim(-1, 1)


_PATHS = {"dense": dense, "grouped": grouped, "matmul": matmul}


def convolve(x, flat, edge_bias, spec, tables, path=None):
    """The op's output for input ``x``, the flat filter and the edge bias (or None), all of one
    dtype.  ``path``: ``"dense"`` / ``"grouped"`` / ``"matmul"``, None chooses (:func:`choose`)."""
    dtype = x.dtype
    work = torch.float32 if x.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16) else dtype
    x, flat = x.to(work), flat.to(work)
    tables = tables.on(x.device)
    with torch.autocast(x.device.type, enabled=False):  # the dtype was chosen above
        training = torch.is_grad_enabled() and (x.requires_grad or flat.requires_grad
                                                 or (edge_bias is not None and edge_bias.requires_grad))
        y = _PATHS[path or choose(spec, x, training)](x, flat, spec, tables)
        if edge_bias is not None and spec.edge_count:
            padded = torch.cat([edge_bias.to(work), edge_bias.new_zeros((edge_bias.shape[0], 1), dtype=work)], 1)
            y = y + padded.index_select(1, tables.edges).view(1, spec.blocks.K, *spec.geometry.MPQ)
    return y.to(dtype)


def l2_normalize(flat, gain, spec, tables, epsilon, dtype):
    """Each block's filter scaled to unit norm per output channel, times ``gain[k]`` (float32 math;
    float64 stays float64), as ``dtype``."""
    tables = tables.on(flat.device)
    work = torch.float64 if flat.dtype == torch.float64 else torch.float32
    f = flat.to(work)
    sum_sq = f.new_zeros(tables.channel.shape[0]).index_add(0, tables.segments, f * f)
    scale = sum_sq.clamp_min(epsilon).rsqrt()
    if gain is not None:
        scale = scale * gain.to(work).index_select(0, tables.channel)
    return (f * scale.index_select(0, tables.segments)).to(dtype)
