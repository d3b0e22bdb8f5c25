"""The four paths of the PyTorch convolution and the choice between them; weight normalisation.

* dense: one ``conv`` / ``conv_transpose`` with the dense filter that is zero outside the blocks.
  Any layout; the CPU path (float32 math for half types) and, on CUDA, the path for dense layouts
  or narrow blocks.
* grouped: the plan of :mod:`blocksparse.ops.conv.grouping`: channel gathers, grouped cuDNN
  convolutions, one output shuffle.  CUDA tensors, for sparse layouts of wide blocks.
* matmul: the plan of :mod:`blocksparse.ops.conv.pointwise`: a 1x1 convolution on a block grid as
  the library's block-sparse matmul over the pixels (its Triton kernels on CUDA), no gather.
* implicit: the implicit-GEMM Triton kernel of :mod:`blocksparse.ops.conv.implicit_gemm` over the
  present channel blocks (convolutions, any layout), for the output and the input gradient; the
  filter gradient is the dense path's (:mod:`.implicit`).  Where the kernels cannot run (CPU
  tensors, float64) the dense path serves.

float32 convolutions follow ``torch.backends.cudnn.allow_tf32`` on every path (the matmul path
asks its kernels for TF32 products when it is set, as cuDNN then computes).

Channels-last inputs stay channels-last through the gathers.
"""
from __future__ import annotations

import torch

from ... import _env
from ...ops.conv.implicit import worth_implicit
from .._checks import autocast_off, plain_ops_needed
from .._matmul import ops as _matmul_ops
from . import implicit as _implicit
from .dense import convolution, dense, transposed

__all__ = ["convolve", "dense", "grouped", "matmul", "choose", "filter_of", "l2_normalize", "PATHS"]


def choose(spec, x, training=False):
    """``"implicit"``, ``"matmul"``, ``"grouped"`` or ``"dense"`` for a call on ``x``; ``training``: a
    gradient will be taken.  Measured on an H200 (``bench/results/conv-h200.md``): the grouped and
    matmul paths lose to the dense masked convolution in every forward + backward, and win
    forward-only only where ``spec`` says so (wide blocks, low density); the implicit-GEMM kernel
    serves where its table says (:data:`blocksparse.ops.conv.implicit.IMPLICIT_MAX_DENSITY`)."""
    if _env.backend() == "reference" or not x.is_cuda:
        return "dense"
    if worth_implicit(spec.implicit, spec.blocks.density, training) and _implicit.serves(spec, x):
        return "implicit"
    if training:
        return "dense"
    if spec.prefers_matmul:
        return "matmul"
    return "grouped" if spec.prefers_grouped else "dense"


def filter_of(flat, shape, index):
    """``flat[index]`` viewed as ``shape`` (a block-sparse filter gathered into a dense one)."""
    return flat.index_select(0, index.reshape(-1)).view(shape)


def _channels(x, index):
    """``x[:, index]`` keeping a channels-last tensor channels-last (while ``torch.compile`` traces,
    asked as a memory format: Dynamo fails comparing a symbolic stride with 1 under a dynamic batch)."""
    if torch.compiler.is_compiling():
        last_format = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
        channels_last = last_format is not None and x.is_contiguous(memory_format=last_format)
    else:
        channels_last = x.dim() > 3 and x.stride(1) == 1
    if channels_last and not x.is_contiguous():
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
        run = transposed if spec.transposed else convolution
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


_PATHS = {"dense": dense, "grouped": grouped, "matmul": matmul, "implicit": _implicit.implicit}
#: The paths a caller may ask for (``"auto"``: :func:`choose`).
PATHS = ("auto", *_PATHS)


def convolve(x, flat, edge_bias, spec, tables, path=None):
    """The op's output for input ``x``, the flat filter and the edge bias (or None), all of one
    dtype, but for a float32 edge bias beside 16-bit ``x`` (added in float32).  ``path``: one of
    :data:`PATHS` (None or ``"auto"`` chooses: :func:`choose`); ``"implicit"`` runs the dense path
    where the kernels cannot serve ``x``."""
    dtype = x.dtype
    work = torch.float32 if x.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16) else dtype
    x, flat = x.to(work), flat.to(work)
    tables = tables.on(x.device)
    with autocast_off(x.device):  # the dtype was chosen above
        training = torch.is_grad_enabled() and (x.requires_grad or flat.requires_grad
                                                 or (edge_bias is not None and edge_bias.requires_grad))
        if path in (None, "auto"):
            path = choose(spec, x, training)
        elif path == "implicit" and (not _implicit.serves(spec, x) or plain_ops_needed(x, flat, edge_bias)):
            path = "dense"  # the kernels cannot serve x, or a torch.func transform / forward-mode tangent
        y = _PATHS[path](x, flat, spec, tables)
        if edge_bias is not None and spec.edge_count:
            add = torch.float32 if edge_bias.dtype == torch.float32 else work  # float32 bias, 16-bit x
            padded = torch.cat([edge_bias.to(add), edge_bias.new_zeros((edge_bias.shape[0], 1), dtype=add)], 1)
            # a gather, not index_select: Inductor (PyTorch 2.13, CPU) miscompiled the index_select form's
            # gradient after a convolution of batch 1 (wrong values, heap corruption)
            edges = padded.gather(1, tables.edges.expand(padded.shape[0], -1))
            y = y.to(add) + edges.view(1, spec.blocks.K, *spec.geometry.MPQ)
        elif edge_bias is not None and edge_bias.requires_grad:
            y = y + edge_bias.sum().to(y.dtype)  # no edge pattern: adds 0, and an empty (K, 0) gradient
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
