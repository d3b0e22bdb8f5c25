"""1x1 convolutions on a block grid, as the block-sparse matmul ``y = x @ W`` over pixels.

A convolution with a 1x1 filter and no padding reads one input pixel per output pixel: with the
activations channels-last, ``(pixels, C) @ W -> (pixels, K)``, where ``W`` is the ``(C, K)``
matrix of the filter.  When every block of ``BCK`` is an aligned ``bs x bs`` square of channels
(``c0 .. c0+bs-1`` with ``c0 % bs == 0``, the same for ``k``) that matrix is a block-sparse weight
of :class:`blocksparse.layout.Layout` and the library's matmul kernels compute the convolution
with no channel gather at all.  Strides subsample the input first (a convolution); a transposed
convolution qualifies only at stride 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...layout import Layout
from .blocks import frozen_int64

__all__ = ["PointwisePlan", "pointwise_plan", "worth_matmul", "MATMUL_BLOCK_SIZES", "MATMUL_MAX_DENSITY"]

#: Block sizes of the matmul kernels.
MATMUL_BLOCK_SIZES = (16, 32, 64, 128)
#: The matmul path serves forward-only GPU calls up to this channel density per block size.  Measured
#: on an H200 (bench/results/conv-h200.md, bf16, 1x1 layers of 28x28 and 56x56 images): it ran at
#: 0.24-0.53 of the dense masked cuDNN convolution at every block size and density, so it is never
#: chosen by itself (``path="matmul"`` still asks for it).
MATMUL_MAX_DENSITY = {16: 0.0, 32: 0.0, 64: 0.0, 128: 0.0}


@dataclass(frozen=True, eq=False)
class PointwisePlan:
    """``layout``: the weight's :class:`~blocksparse.layout.Layout`; ``weight``: ``(blocks, bs, bs)``
    indices into the flat filter of the packed matmul weight (rows along ``C``); ``strides``: the
    input subsampling."""

    layout: Layout
    weight: np.ndarray
    strides: tuple


def pointwise_plan(blocks, geometry):
    """The :class:`PointwisePlan` of a convolution, or None when it is not a 1x1 block grid."""
    if blocks.trs != 1 or any(a.pad or a.pad_after > 0 for a in geometry.axes):
        return None
    if geometry.transposed and max(geometry.strides) > 1:
        return None
    sizes = {(c.size, k.size) for c, k in zip(blocks.cs, blocks.ks)}
    if len(sizes) != 1:
        return None
    bs, bk = sizes.pop()
    if bs != bk or bs not in MATMUL_BLOCK_SIZES:
        return None
    coords = []
    for c, k in zip(blocks.cs, blocks.ks):
        for channels in (c, k):
            if channels[0] % bs or not np.array_equal(channels, np.arange(channels[0], channels[0] + bs)):
                return None
        coords.append((c[0] // bs, k[0] // bs))
    coords = np.array(coords)
    mask = np.zeros((blocks.C // bs, blocks.K // bs), dtype=np.int8)
    mask[coords[:, 0], coords[:, 1]] = 1
    layout = Layout(mask, bs)
    owner = {tuple(ck): b for b, ck in enumerate(coords.tolist())}
    weight = []
    for c, k in np.asarray(layout.coords):
        index = blocks.flat_index(owner[(int(c), int(k))])[..., 0]   # (Kb, Cb) or, transposed, (Cb, Kb)
        weight.append(index if blocks.transposed else index.T)
    return PointwisePlan(layout, frozen_int64(np.stack(weight)), geometry.strides)


def worth_matmul(plan, density):
    """Whether the matmul path is expected to beat the dense convolution on a GPU."""
    return plan is not None and density <= MATMUL_MAX_DENSITY[plan.layout.block_size]
