"""Public PyTorch API of the block-sparse matmul: :class:`BlocksparseMatMul`, :class:`BlocksparseLinear`."""
from __future__ import annotations

import torch
from torch import nn

from .._checks import check_bool, check_epsilon
from .._frontend import LayoutShapes, check_feature_axis
from .._initializers import identity_blocks, ortho_blocks
from ..layout import BLOCK_SIZES, Layout
from . import _checks
from ._backend import autocast_dtype_of
from ._matmul import ops as _ops
from ._matmul import plan as _plan
from ._matmul import weights as _weights
from ._portable.dispatch import Dispatched, LinearDispatch, check_input, for_layout, uniform_fan_in_
from ._state import LayoutState

_BSMM_IMPLS = ("kernels", "reference")  # the implementations that run through BlocksparseMatMul

__all__ = ["BlocksparseMatMul", "BlocksparseLinear"]


class BlocksparseMatMul(LayoutShapes):
    """``y = x @ W`` with a block-sparse ``W`` of shape ``(C, K)`` given by a block layout.

    Parameters
    ----------
    layout : array_like, shape (C // block_size, K // block_size)
        0/1 block mask (see :class:`blocksparse.layout.Layout`), or a ``Layout``.
    block_size : int
        One of 8, 16, 32, 64, 128 (8 always takes the reference path).
    feature_axis : {1, 0}
        1: activations ``(N, C) -> (N, K)``; 0: ``(C, N) -> (K, N)``.
    z_order : bool
        Number the blocks in Morton order (the original package's ``z_order=True``).
    allow_tf32 : bool
        Let float32 products use TF32 tensor cores (faster, ~1e-3 relative error).  Off by default.

    The weight is a separate tensor of shape :attr:`w_shape` (``(blocks, bs, bs)``; block ``b`` is
    ``W[c*bs:(c+1)*bs, k*bs:(k+1)*bs]`` with ``(c, k) = block_coord(b)``), so several weights can
    share one object.  Calls are differentiable in ``x`` and ``w`` and traceable by ``torch.compile``.

    Examples
    --------
    >>> bsmm = BlocksparseMatMul([[1, 0], [1, 1]], block_size=16)
    >>> w = torch.randn(bsmm.w_shape)
    >>> bsmm(torch.randn(5, 32), w).shape
    torch.Size([5, 32])
    """

    def __init__(self, layout, block_size=32, feature_axis=1, *, z_order=False, allow_tf32=False):
        if isinstance(layout, Layout):
            if layout.block_size != block_size:
                raise ValueError(f"block_size must match the Layout's block size "
                                 f"{layout.block_size}; got {block_size}")
            self.layout = layout
        else:
            self.layout = Layout(layout, block_size, z_order=z_order)
        self.axis = check_feature_axis(feature_axis)
        self.allow_tf32 = check_bool(allow_tf32, "allow_tf32")
        self._handle = _plan.handle(self.layout, self)
        self._precision = "tf32" if self.allow_tf32 else "ieee"
        self._w_size = torch.Size(self.layout.w_shape)

    # ------------------------------------------------------------------ shape helpers
    block_size = property(lambda self: self.layout.block_size)
    blocks = property(lambda self: self.layout.blocks)
    C = property(lambda self: self.layout.C)
    K = property(lambda self: self.layout.K)
    w_shape = property(lambda self: self.layout.w_shape)

    def __repr__(self):
        return f"BlocksparseMatMul({self.layout!r}, feature_axis={self.axis})"

    def __getstate__(self):
        # the layout handle is an index into this process's registry: never send it elsewhere
        return {k: v for k, v in self.__dict__.items() if k != "_handle"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._handle = _plan.handle(self.layout, self)

    # ------------------------------------------------------------------ weights
    def ortho_init(self):
        """Initializer ``init(shape=None, dtype=torch.float32, device=None)`` -> a ``w_shape``
        tensor: random orthonormal columns within each layout column (the whole ``(C, K)`` matrix
        semi-orthogonal for a dense layout), as the TensorFlow object's; seed with ``np.random.seed``."""
        return _weights.Initializer(lambda: ortho_blocks(self.layout), self.w_shape, "ortho_init")

    def identity_init(self, gpu=False):
        """Initializer (as :meth:`ortho_init`'s): identity blocks where ``c % KB == k % CB``, zeros
        elsewhere.  ``gpu`` is accepted for compatibility; the values are the same wherever made."""
        check_bool(gpu, "gpu")
        return _weights.Initializer(lambda: identity_blocks(self.layout), self.w_shape, "identity_init")

    def l2_normalize(self, w, gain=None, epsilon=1e-6, dtype=torch.float32):
        """Weight normalisation: each output feature scaled to unit L2 norm (times ``gain``).

        ``w``: ``w_shape``; ``gain``: ``K`` values (``(K,)``, ``(1, K)`` or ``(K, 1)``), the scale of
        each output feature; ``epsilon``: lower bound of the squared norm (guards empty or zero
        columns); ``dtype``: of the result.  Returns ``w[b, :, j] / max(||column k*bs + j of the dense
        W||, sqrt(epsilon))``, times ``gain``, for block ``b`` in layout column ``k``; computed in
        float32 (float64 stays float64), differentiable in ``w`` and ``gain``.
        """
        w = _checks.floating_tensor("w", w)
        if tuple(w.shape) != self.w_shape:
            raise ValueError(f"w must have shape {self.w_shape}; got {tuple(w.shape)}")
        epsilon = check_epsilon(epsilon)
        dtype = _checks.float_dtype("dtype", dtype)
        if gain is not None:
            gain = _checks.floating_tensor("gain", gain)
            if gain.numel() != self.K or (gain.dim() == 2 and 1 not in gain.shape) or gain.dim() > 2:
                raise ValueError(f"gain must have shape (K,) = ({self.K},) (or (1, K) / (K, 1)); got "
                                 f"{tuple(gain.shape)}")
            if gain.device != w.device:
                raise ValueError(f"gain and w must be on one device; got {gain.device} and {w.device}")
        coords = torch.tensor(self.layout.coords[:, 1], dtype=torch.int64, device=w.device)
        return _weights.l2_normalize(w, coords, self.layout.KB, gain, epsilon, dtype)

    # ------------------------------------------------------------------ the product
    def __call__(self, x, w):
        """``y = x @ W``; see the class docstring for shapes."""
        x, w = self._check(x, w)
        return _ops.matmul(x, w, self._handle, self.axis, self._precision)

    def _linear(self, x, w, bias):
        """``x @ W + bias`` (``bias``: per output feature, or None), the bias added in place."""
        x, w = self._check(x, w)
        return _ops.matmul(x, w, self._handle, self.axis, self._precision, bias)

    def _check(self, x, w):
        """The inputs as the products take them (autocast applied), or ValueError / TypeError.
        The common case costs a handful of attribute reads; :meth:`_refuse` explains the rest."""
        try:
            good = (x.dim() == 2 and x.shape[self.axis] == self.layout.C and w.shape == self._w_size
                    and x.dtype in _checks.FLOAT_DTYPES and w.dtype in _checks.FLOAT_DTYPES
                    and x.layout == w.layout == torch.strided and x.device == w.device)
        except (AttributeError, TypeError):  # not tensors
            good = False
        if not good:
            self._refuse(x, w)
        dtype = autocast_dtype_of("cuda" if x.is_cuda else x.device.type)
        if dtype is not None:  # as torch's autocast: float64 tensors stay float64
            x, w = (t if t.dtype is torch.float64 else t.to(dtype) for t in (x, w))
        if x.dtype != w.dtype:
            raise TypeError(f"x and w must have the same dtype; got {x.dtype} and {w.dtype}")
        return x, w

    def _refuse(self, x, w):
        """Raise the error that says what is wrong with ``x`` and ``w``."""
        for name, t in (("x", x), ("w", w)):
            _checks.floating_tensor(name, t)
        wanted = f"(N, {self.C})" if self.axis else f"({self.C}, N)"
        if x.dim() != 2:
            raise ValueError(f"x must be 2-D {wanted}; got shape {tuple(x.shape)}")
        if x.shape[self.axis] != self.C:
            raise ValueError(f"x must have {self.C} features on axis {self.axis} (shape "
                             f"{wanted}); got shape {tuple(x.shape)}")
        if tuple(w.shape) != self.w_shape:
            raise ValueError(f"w must have shape {self.w_shape}; got {tuple(w.shape)}")
        raise ValueError(f"x and w must be on one device; got {x.device} and {w.device}")


class BlocksparseLinear(LayoutState, Dispatched, nn.Module):
    """A linear layer ``y = x @ W + bias`` with a block-sparse weight.

    Parameters
    ----------
    layout : array_like, shape (in_features // block_size, out_features // block_size)
        0/1 block mask, or a :class:`blocksparse.layout.Layout`.
    block_size : int
        Any block edge >= 1: 8, 16, 32, 64, 128 run the kernels as they are, multiples of 16-128
        (48, 256, ...) on a refined layout, the rest the portable and dense paths only (as
        :class:`~blocksparse.torch.PixelflyLinear`).
    bias : bool
        Add a learnable bias of shape ``(out_features,)``.
    device, dtype
        Where and in which dtype to create the parameters.
    allow_tf32 : bool
        Let float32 products use TF32 tensor cores.
    impl : str
        Which implementation runs the product: ``"auto"`` (default: the cost model of
        :mod:`blocksparse.dispatch` chooses per call), ``"kernels"`` / ``"reference"`` (both the
        matmul ops of :class:`BlocksparseMatMul`: the kernels on CUDA, the reference path elsewhere),
        ``"portable"`` or ``"dense"``; settable later as ``layer.impl``.  :meth:`plan` says what runs
        and why.
    cost_model : blocksparse.dispatch.CostModel, optional
        The model to plan with (default: the tables shipped for the call's device).

    ``weight`` has shape ``(blocks, block_size, block_size)`` (see :class:`BlocksparseMatMul`);
    ``forward`` takes ``(..., in_features)`` and returns ``(..., out_features)``.  Initialised like
    ``nn.Linear``, with each output's fan-in counting only the blocks that feed it.

    Examples
    --------
    >>> lin = BlocksparseLinear(torch.ones(2, 3), block_size=16)
    >>> lin(torch.randn(4, 7, 32)).shape
    torch.Size([4, 7, 48])
    """

    def __init__(self, layout, block_size=32, bias=True, device=None, dtype=None, *,
                 z_order=False, allow_tf32=False, impl="auto", cost_model=None):
        super().__init__()
        given = layout.block_size if isinstance(layout, Layout) else block_size
        if type(given) is int and given in BLOCK_SIZES:  # (16.0 is checked, and refused, by Layout)
            self.bsmm = BlocksparseMatMul(layout, block_size, feature_axis=1, z_order=z_order,
                                          allow_tf32=allow_tf32)
            self._dispatch = LinearDispatch(self.bsmm.layout, self.bsmm, impl=impl, cost_model=cost_model,
                                            device=device)
        else:  # any other block size: the portable and dense paths, the kernels on a refinement
            if not isinstance(layout, Layout):
                layout = Layout(layout, block_size, z_order=z_order, any_block_size=True)
            elif layout.block_size != block_size:
                raise ValueError(f"block_size must match the Layout's block size {layout.block_size}; "
                                 f"got {block_size}")
            self._dispatch = for_layout(layout, allow_tf32=allow_tf32, impl=impl, cost_model=cost_model,
                                        device=device)
            self.bsmm = self._dispatch.bsmm
        self.in_features, self.out_features = self.layout.C, self.layout.K
        factory = {"device": device, "dtype": None if dtype is None else _checks.float_dtype("dtype", dtype)}
        self.weight = nn.Parameter(torch.empty(self.layout.w_shape, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if check_bool(bias, "bias") else None
        self.reset_parameters()

    @property
    def layout(self):
        return self._dispatch.layout

    def reset_parameters(self):
        """Uniform in +-1/sqrt(fan_in) per output feature, fan_in = features of its blocks; the layout's
        index buffers refilled too (a layer built on the meta device, then ``to_empty()``, needs both)."""
        self._dispatch.reset_buffers()
        uniform_fan_in_(self.weight, self.bias, self.layout)

    def forward(self, x):
        # the dispatch read without nn.Module.__getattr__ (a DataParallel replica's own)
        w, bias, dispatch = self.weight, self.bias, self._modules["_dispatch"]
        y = dispatch.fast(x, w, bias)  # a call of a kind planned before, run in C++, else None
        if y is not None:
            return y
        check_input(x, self.in_features, w)
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        y = dispatch.native(x2, w, bias)  # the eager CUDA fast path, else None
        if y is None:
            impl = dispatch.choose(x2, w)
            if (impl in _BSMM_IMPLS and dispatch.refinement is None  # the matmul ops: the kernels on CUDA,
                    and not _checks.plain_ops_needed(x2, w, bias)):      # else the reference path
                y = self.bsmm._linear(x2, w, bias)
            else:  # (in a torch.func transform: the dense product through the layer's own index buffers)
                y = dispatch.run(impl, x2, w, bias)
        return y if x2 is x else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"block_size={self.layout.block_size}, blocks={self.layout.blocks}, "
                f"density={self.layout.density:.3f}, bias={self.bias is not None}, impl={self.impl!r}")
