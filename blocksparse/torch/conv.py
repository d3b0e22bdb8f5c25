"""Public PyTorch API of the block-sparse convolution: :class:`BlocksparseConv`,
:class:`BlocksparseDeconv` (the original API, filters passed in) and :class:`BlocksparseConvLayer`
(an ``nn.Module`` owning them)."""
from __future__ import annotations

import torch
from torch import nn

from .._checks import check_bool, check_epsilon
from ..ops.conv import ConvShapes
from ._checks import autocast, float_dtype, floating_tensor, real
from ._live import LiveState, field
from ._state import ConvState
from ._conv import compute as _compute
from ._conv import tables as _tables

__all__ = ["BlocksparseConv", "BlocksparseDeconv", "BlocksparseConvLayer"]

_HALF_DTYPES = (torch.float16, torch.bfloat16)


class BlocksparseConv(LiveState, ConvShapes):
    """A convolution whose filter connects blocks of input channels to blocks of output channels.

    The arguments, shape helpers and attributes are those of the TensorFlow
    :class:`blocksparse.conv.BlocksparseConv` (``BCK`` blocks of arbitrary channels, ``TRS`` /
    ``DHW`` / ``MPQ`` 1-D to 3-D, ``strides``, ``dilates``, ``padding`` "SAME" / "VALID" /
    explicit, ``edge_bias``); activations are channels-first, ``(N, C) + DHW -> (N, K) + MPQ``.

    Calls are differentiable in the input, the filter and the edge bias, work under
    ``torch.autocast`` and ``torch.compile(fullgraph=True)``; float32, float16, bfloat16 (and
    float64); a float32 filter and edge bias with float16 / bfloat16 input too.

    ``path`` (keyword only) picks the implementation of CUDA calls: ``"auto"`` (the measured
    choice: grouped convolutions for forward-only calls of sparse layouts with wide blocks, the
    implicit-GEMM kernel where its table says, else the dense path), ``"dense"`` (one convolution
    with the dense filter that is zero outside the blocks), ``"grouped"`` (grouped cuDNN
    convolutions), ``"matmul"`` (1x1 block grids only: the block-sparse matmul kernels) or
    ``"implicit"`` (convolutions only: the implicit-GEMM Triton kernel over the present channel
    blocks, dense-path gradients).  ``"auto"`` takes the dense path for CPU tensors, float64 and
    ``BLOCKSPARSE_BACKEND=reference``; an explicit ``"grouped"`` or ``"matmul"`` runs there as asked
    (framework ops; the matmul's reference path, or its kernels through Triton's interpreter with
    ``BLOCKSPARSE_BACKEND=triton``), ``"implicit"`` as the dense path wherever its kernels cannot serve.

    Examples
    --------
    >>> conv = BlocksparseConv([([0, 1], [0, 1]), ([2, 3], [1, 2])], TRS=(3, 3), DHW=(8, 8))
    >>> F = torch.randn(conv.f_shape(), requires_grad=True)       # (blocks, Kb, Cb, 3, 3)
    >>> conv(F, torch.randn(conv.i_shape(5))).shape
    torch.Size([5, 3, 8, 8])
    """

    def __init__(self, BCK, TRS, DHW, MPQ=None, strides=(1, 1, 1), dilates=(1, 1, 1), padding="SAME",
                 edge_bias=False, *, path="auto"):
        super().__init__(BCK, TRS, DHW, MPQ, strides, dilates, padding, edge_bias)
        self._path = self._check_path(path)
        self._live_rebuild()

    # what the traced code reads, kept where torch.compile specialises it (see ._live)
    _live_fields = ("spec",)
    spec = field("spec", "The checked arguments (:class:`blocksparse.ops.conv.spec.ConvSpec`).")
    _tables = field("tables")

    def _live_rebuild(self):
        self._tables = _tables.Tables(self.spec)

    @property
    def path(self):
        """The implementation asked for at construction (see the class)."""
        return self._path

    def _check_path(self, path):
        if not isinstance(path, str) or path not in _compute.PATHS:
            raise ValueError(f"path must be one of {', '.join(map(repr, _compute.PATHS))}; got {path!r}")
        if path == "matmul" and self.spec.pointwise is None:
            raise ValueError("path='matmul' needs a 1x1 convolution without padding whose blocks are aligned "
                             "squares of 16, 32, 64 or 128 channels; this op is not one")
        if path == "implicit" and self.spec.transposed:
            raise ValueError("path='implicit' serves convolutions only; got a transposed convolution "
                             "(BlocksparseDeconv)")
        return path

    # ------------------------------------------------------------------ argument checks
    def _flat_filter(self, F):
        """``(flat filter, form)``: ``F`` checked and flattened (see ``f_shape``)."""
        spec = self.spec
        if isinstance(F, (list, tuple, nn.ParameterList)):
            spec.check_block_count(len(F))
            fs = [floating_tensor(f"F[{b}]", f) for b, f in enumerate(F)]
            for b, f in enumerate(fs):
                if tuple(f.shape) != tuple(spec.filter_shape(b)):
                    raise ValueError(f"F[{b}] must have shape f_shape({b}) = {tuple(spec.filter_shape(b))}; "
                                     f"got {tuple(f.shape)}")
                if f.dtype != fs[0].dtype or f.device != fs[0].device:
                    raise TypeError(f"F[{b}] must have the dtype and device of F[0]; got {f.dtype} on "
                                    f"{f.device} and {fs[0].dtype} on {fs[0].device}")
            return torch.cat([f.reshape(-1) for f in fs]), "blocks"
        F = floating_tensor("F", F)
        form = spec.filter_form(F.shape)
        return F.reshape(-1), form

    def _check_input(self, I):
        I = floating_tensor("I", I)
        want = ["N", *self.i_shape(None)[1:]]
        if I.dim() != len(want) or tuple(I.shape[1:]) != tuple(want[1:]):
            raise ValueError(f"I must have shape i_shape(N) = [N, C] + DHW = {want}; got {list(I.shape)}")
        return I

    def _check_edge_bias(self, edge_bias):
        if edge_bias is None:
            return None
        edge_bias = floating_tensor("edge_bias", edge_bias)
        if tuple(edge_bias.shape) != self.edge_bias_shape():
            raise ValueError(f"edge_bias must have shape {self.edge_bias_shape()}{self.spec.edge_bias_hint}; "
                             f"got {tuple(edge_bias.shape)}")
        return edge_bias

    # ------------------------------------------------------------------ the op
    def __call__(self, F, I, edge_bias=None):
        """The convolution of ``I`` with the blocks' filters, plus the edge bias.

        Parameters
        ----------
        F : tensor of shape ``f_shape()`` (or ``[size]``), or a list of ``f_shape(b)`` tensors
            The filter, in the dtype of ``I``, or float32 with float16 / bfloat16 ``I`` (cast to
            ``I``'s dtype for the product; its gradient float32).
        I : tensor, shape ``i_shape(N) = [N, C] + DHW``
        edge_bias : tensor, shape ``edge_bias_shape() = (K, E)``, optional
            In the dtype of ``I``, or float32 with float16 / bfloat16 ``I`` (added in float32; its
            gradient float32).  ``E = 0`` without ``edge_bias=True``: nothing to add.  Any other
            dtype mismatch of ``F`` or ``edge_bias`` with ``I`` is a ``TypeError`` naming it (under
            ``torch.autocast`` all three take the autocast dtype first).

        Returns
        -------
        tensor, shape ``o_shape(N) = [N, K] + MPQ``, dtype of ``I`` (the autocast dtype under autocast)
        """
        I = self._check_input(I)
        flat, _ = self._flat_filter(F)
        edge_bias = self._check_edge_bias(edge_bias)
        for name, t in (("F", flat), ("edge_bias", edge_bias)):
            if t is not None and t.device != I.device:
                raise ValueError(f"{name} and I must be on one device; got {t.device} and {I.device}")
        I, flat, edge_bias = autocast(I, flat, edge_bias)
        for name, t in (("F", flat), ("edge_bias", edge_bias)):
            if t is not None and t.dtype != I.dtype and not (t.dtype == torch.float32 and I.dtype in _HALF_DTYPES):
                raise TypeError(f"{name} and I must have the same dtype (or {name} float32 with float16 / bfloat16 "
                                f"I); got {t.dtype} and {I.dtype}")
        flat = flat.to(I.dtype)  # a float32 filter with 16-bit I: the product in I's dtype, its gradient float32
        return _compute.convolve(I, flat, edge_bias, self.spec, self._tables, self._path)

    def l2_normalize(self, F, gain=None, epsilon=1e-6, dtype=torch.float32):
        """Weight normalisation: each block's filter scaled to unit L2 norm per output channel.

        ``F`` as in ``__call__``; ``gain``: ``(K,)``, the scale of output channel ``k``; ``epsilon``:
        lower bound of the squared norm; ``dtype``: of the result.  Returns ``F``'s form and shape
        (a list for a list): for each block and each of its output channels ``k``, that channel's
        slice of the block's filter divided by ``sqrt(max(sum of squares, epsilon))``, times
        ``gain[k]``; computed in float32 (float64 stays float64), differentiable in ``F`` and ``gain``.
        """
        flat, form = self._flat_filter(F)
        epsilon = real("epsilon", epsilon)
        if not epsilon > 0:
            raise ValueError(f"epsilon must be a number > 0; got {epsilon}")
        epsilon = check_epsilon(epsilon)
        dtype = float_dtype("dtype", dtype)
        if gain is not None:
            gain = floating_tensor("gain", gain)
            if tuple(gain.shape) != (self.K,):
                raise ValueError(f"gain must have shape (K,) = ({self.K},); got {tuple(gain.shape)}")
        out = _compute.l2_normalize(flat, gain, self.spec, self._tables, epsilon, dtype)
        if form == "stacked":
            return out.view(self.f_shape())
        if form == "blocks":
            return [p.view(self.f_shape(b)) for b, p in enumerate(torch.split(out, self.spec.blocks.sizes))]
        return out


class BlocksparseDeconv(BlocksparseConv):
    """The transposed convolution of the same parameters, ``(N, C) + DHW -> (N, K) + MPQ``; see the
    TensorFlow :class:`blocksparse.conv.BlocksparseDeconv` (block filters ``f_shape(b) = [Cb, Kb] +
    TRS``, ``MPQ`` picking among the output sizes of strided cases)."""

    _transposed = True


class BlocksparseConvLayer(ConvState, nn.Module):
    """An ``nn.Module`` holding a block-sparse (transposed) convolution's filter and edge bias.

    Parameters are those of :class:`BlocksparseConv` (``path`` included) plus ``transposed`` (a
    :class:`BlocksparseDeconv`), ``device`` and ``dtype``.  ``weight`` has shape ``f_shape()``,
    initialised uniform in ``+-1/sqrt(fan_in)`` per output channel (``fan_in`` counting only the
    connected inputs, times the taps), like ``nn.Conv2d``; ``edge_bias`` (with ``edge_bias=True``)
    has shape ``edge_bias_shape()``, initialised to zeros.  ``forward(x)``: ``(N, C) + DHW ->
    (N, K) + MPQ``.

    Examples
    --------
    >>> layer = BlocksparseConvLayer([([0, 1], [0]), ([1, 2], [1])], TRS=(3,), DHW=(16,), edge_bias=True)
    >>> layer(torch.randn(4, 3, 16)).shape
    torch.Size([4, 2, 16])
    """

    def __init__(self, BCK, TRS, DHW, MPQ=None, strides=(1, 1, 1), dilates=(1, 1, 1), padding="SAME",
                 edge_bias=False, transposed=False, device=None, dtype=None, *, path="auto"):
        super().__init__()
        cls = BlocksparseDeconv if check_bool(transposed, "transposed") else BlocksparseConv
        self.conv = cls(BCK, TRS, DHW, MPQ, strides, dilates, padding, edge_bias, path=path)
        factory = {"device": device, "dtype": None if dtype is None else float_dtype("dtype", dtype)}
        self.weight = nn.Parameter(torch.empty(self.conv.f_shape(), **factory))
        self.edge_bias = nn.Parameter(torch.empty(self.conv.edge_bias_shape(), **factory)) if edge_bias else None
        self.reset_parameters()

    def reset_parameters(self):
        tables = self.conv._tables.on(torch.device("cpu"))
        bound = tables.fan_in.double().clamp_min(1).rsqrt()[tables.channel[tables.segments]]
        with torch.no_grad():
            values = torch.rand(bound.shape, dtype=torch.float64, device="cpu").mul_(2).sub_(1).mul_(bound)
            self.weight.copy_(values.view(self.weight.shape))
            if self.edge_bias is not None:
                self.edge_bias.zero_()

    def forward(self, x):
        return self.conv(self.weight, x, self.edge_bias)

    def extra_repr(self):
        c = self.conv
        return (f"C={c.C}, K={c.K}, blocks={c.blocks}, TRS={c.TRS}, DHW={c.DHW}, MPQ={c.MPQ}, "
                f"strides={c.strides}, dilates={c.dilates}, density={c.density:.3f}, "
                f"edge_bias={self.edge_bias is not None}, transposed={isinstance(c, BlocksparseDeconv)}, "
                f"path={c.path!r}")
