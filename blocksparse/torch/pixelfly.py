"""``PixelflyLinear``: a flat block butterfly linear layer plus an optional low-rank term (PyTorch)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_bool, check_int
from ..layout import Layout
from ..layouts.butterfly import butterfly_layout, default_butterfly_size
from . import _checks
from ._portable.dispatch import Dispatched, check_input, for_layout, uniform_fan_in_
from ._state import LayoutState

__all__ = ["PixelflyLinear"]


class PixelflyLinear(LayoutState, Dispatched, nn.Module):
    """``y = x @ W + (x @ first.T) @ second.T + bias`` with ``W`` a flat block butterfly (pixelfly).

    Parameters
    ----------
    in_features, out_features : int
        Multiples of ``block_size``.
    block_size : int
        Any block edge >= 1 (48, 256, ...): sizes the kernels take run there, multiples of them
        run on a refined layout, the rest on the portable path.
    butterfly_size : int, optional
        Power of two >= 2, the butterfly's size (default: pixelfly's, the shorter side in blocks
        rounded up to a power of two).
    n_factors : int, optional
        Butterfly factors summed, ``1 .. log2(butterfly_size)`` (default: all).
    lowrank_size : int
        Rank of the low-rank term (0: none).
    bias : bool
        Add a learnable bias of shape ``(out_features,)``.
    device, dtype
        Where and in which dtype to create the parameters.
    stretch : bool
        Stretch the butterfly over a rectangular weight instead of repeating the square of the
        shorter side (see :func:`blocksparse.layouts.butterfly.butterfly_layout`).
    allow_tf32 : bool
        Let the kernels' float32 products use TF32 (the portable and dense paths follow
        PyTorch's own setting, ``torch.backends.cuda.matmul.allow_tf32``).
    impl : str
        ``"auto"`` (the cost model chooses per call; see :meth:`plan`), ``"kernels"`` /
        ``"reference"`` (the block-sparse matmul ops, as :class:`~blocksparse.torch.BlocksparseLinear`'s:
        the kernels on CUDA, the reference path elsewhere; block sizes a kernel size divides),
        ``"portable"`` or ``"dense"``; settable later as ``layer.impl``.
    cost_model : blocksparse.dispatch.CostModel, optional
        The model to plan with (default: the tables shipped for the call's device).

    Attributes
    ----------
    weight : Parameter, shape (blocks, block_size, block_size)
        The butterfly's blocks, packed in the row-major order of ``layout`` (rows along the
        inputs), as :class:`~blocksparse.torch.BlocksparseLinear` stores them.
    lowrank_first : Parameter, shape (lowrank_size, in_features), or None
    lowrank_second : Parameter, shape (out_features, lowrank_size), or None
    bias : Parameter, shape (out_features,), or None
    layout : blocksparse.layout.Layout
        The block layout (``mask``: ``(in_features // bs, out_features // bs)``).

    ``forward`` takes ``(..., in_features)`` and returns ``(..., out_features)``.  Initialised like
    ``nn.Linear`` per output feature (uniform in +-1/sqrt(fan-in), the fan-in counting the blocks
    that feed it); the low-rank factors uniform in +-1/sqrt(in_features) and +-1/sqrt(lowrank_size)
    times 1/2, so that the low-rank term starts as a small correction.

    Examples
    --------
    >>> layer = PixelflyLinear(384, 1536, block_size=48, butterfly_size=64, n_factors=6, lowrank_size=16)
    >>> layer(torch.randn(2, 5, 384)).shape
    torch.Size([2, 5, 1536])
    >>> round(layer.layout.density, 3)
    0.5
    """

    def __init__(self, in_features, out_features, block_size, butterfly_size=None, n_factors=None,
                 lowrank_size=0, bias=True, device=None, dtype=None, *, stretch=False, allow_tf32=False,
                 impl="auto", cost_model=None):
        super().__init__()
        self.in_features = in_features = check_int(in_features, "in_features")
        self.out_features = out_features = check_int(out_features, "out_features")
        lowrank_size = check_int(lowrank_size, "lowrank_size", 0)
        stretch, bias = check_bool(stretch, "stretch"), check_bool(bias, "bias")
        mask = butterfly_layout(in_features, out_features, block_size, butterfly_size, n_factors,
                                stretch=stretch)
        if butterfly_size is None:
            butterfly_size = default_butterfly_size(in_features, out_features, block_size)
        self.butterfly_size = butterfly_size
        self.n_factors = n_factors or int(butterfly_size).bit_length() - 1
        self.lowrank_size = lowrank_size
        self.stretch = stretch
        self._dispatch = for_layout(Layout(mask, block_size, any_block_size=True), allow_tf32=allow_tf32,
                                    impl=impl, cost_model=cost_model, device=device)
        factory = {"device": device, "dtype": None if dtype is None else _checks.float_dtype("dtype", dtype)}
        self.weight = nn.Parameter(torch.empty(self.layout.w_shape, **factory))
        if lowrank_size:
            self.lowrank_first = nn.Parameter(torch.empty(lowrank_size, in_features, **factory))
            self.lowrank_second = nn.Parameter(torch.empty(out_features, lowrank_size, **factory))
        else:
            self.register_parameter("lowrank_first", None)
            self.register_parameter("lowrank_second", None)
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    @property
    def layout(self):
        return self._dispatch.layout

    @property
    def block_size(self):
        return self.layout.block_size

    def reset_parameters(self):
        """Re-draw every parameter (see the class docstring) and refill the layout's index buffers (a
        layer built on the meta device, then ``to_empty()``, needs both)."""
        self._dispatch.reset_buffers()
        uniform_fan_in_(self.weight, self.bias, self.layout)
        if self.lowrank_first is not None:
            with torch.no_grad():
                self.lowrank_first.uniform_(-0.5, 0.5).mul_(1.0 / math.sqrt(self.in_features))
                self.lowrank_second.uniform_(-1.0, 1.0).mul_(1.0 / math.sqrt(self.lowrank_size))

    def dense_weight(self):
        """The whole ``(in_features, out_features)`` matrix the layer multiplies by (butterfly plus
        low-rank term), for inspection and tests; differentiable."""
        eye = torch.eye(self.in_features, dtype=self.weight.dtype, device=self.weight.device)
        dense = self._dispatch.run("dense", eye, self.weight)
        if self.lowrank_first is not None:
            dense = dense + self.lowrank_first.t() @ self.lowrank_second.t()
        return dense

    def forward(self, x):
        # the dispatch read without nn.Module.__getattr__ (a DataParallel replica's own)
        w, bias, dispatch = self.weight, self.bias, self._modules["_dispatch"]
        if self.lowrank_first is None:
            y = dispatch.fast(x, w, bias)  # a call of a kind planned before, run in C++, else None
            if y is not None:
                return y
        check_input(x, self.in_features, w)
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        y = dispatch.native(x2, w, bias)  # the eager CUDA path through the native op, else None
        if y is None:
            y = dispatch.run(dispatch.choose(x2, w), x2, w, bias)
        if self.lowrank_first is not None:
            # [N, in] @ [in, r] @ [r, out], added to y in one addmm
            y = torch.addmm(y, F.linear(x2, self.lowrank_first), self.lowrank_second.t())
        return y if x2 is x else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        lay = self.layout
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"block_size={lay.block_size}, butterfly_size={self.butterfly_size}, "
                f"n_factors={self.n_factors}, lowrank_size={self.lowrank_size}, blocks={lay.blocks}, "
                f"density={lay.density:.3f}, bias={self.bias is not None}, impl={self.impl!r}")
