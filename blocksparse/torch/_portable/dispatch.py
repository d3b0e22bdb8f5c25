"""Per-layer dispatch of a block-sparse linear product in PyTorch (the cost model's glue).

A :class:`LinearDispatch` belongs to one layer.  Per call it names the implementation
(:meth:`~LinearDispatch.choose`): ``BLOCKSPARSE_BACKEND`` first (``triton``: the kernels;
``reference``: the reference path, or the portable one where the block size has none), then the
layer's ``impl`` override, then the cost model's :class:`~blocksparse.dispatch.Plan` for the call's
(tokens, dtype, device, training or not), made once and cached.  :meth:`~LinearDispatch.run`
computes the product with it.

Under ``torch.compile`` the plan is made while tracing, for the token count of the layer's last
eager call (:data:`DEFAULT_TOKENS` before any) -- a symbolic size cannot key a table -- and is a
constant of the compiled graph.
"""
from __future__ import annotations

import itertools
from functools import lru_cache
import weakref

import torch
from torch import nn

from ... import _env, _kernels
from ..._checks import check_bool, check_int
from .._checks import float_dtype, floating_tensor, plain_ops_needed
from ..._initializers import fan_in_bounds
from ...dispatch import Problem, check_cost_model, check_impl, override_plan, shared_model
from ...dispatch.model import PLAN_CACHE_SIZE
from ...layout import Layout
from ...ops.matmul.grouping import groups_well
from ...ops.matmul.portable import row_tables
from ...ops.matmul.refine import refine, refined_block_size
from ...ops.matmul.configs import AOT_PACKINGS, KERNEL_BLOCK_SIZES
from .. import _native
from .._autograd import functorch_active as _functorch_active
from .._backend import KERNEL_DTYPES, autocast_dtype_of
from .._launch import TRITON_TYPES
from .._matmul import ops as _ops
from .._matmul.products import use_triton
from .matmul import PortableTables, dense_matmul, portable_matmul

__all__ = ["DEFAULT_TOKENS", "Dispatched", "LinearDispatch", "check_input", "for_layout", "kernel_layout",
           "uniform_fan_in_"]

#: Tokens assumed when planning a call whose token count is unknown (tracing, ``plan()``).
DEFAULT_TOKENS = 4096
_PRECISION = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
              torch.float64: "float64"}

# handle -> dispatcher, so that a traced graph can reach its layer's planner through a constant: a
# string (torch 2.4's compile with dynamic=True made int attributes of modules symbolic)
_dispatchers = weakref.WeakValueDictionary()
_handles = itertools.count()


def _new_handle(dispatcher):
    handle = f"linear-dispatch-{next(_handles)}"
    _dispatchers[handle] = dispatcher
    return handle


def kernel_layout(layout):
    """``(layout the kernels / reference path run, Refinement or None)``: ``layout`` itself when its
    block size is one of theirs, else its refinement to the largest one that divides it, else
    ``(None, None)`` (e.g. block size 3: only the portable and dense paths).  A refinement the
    kernel library compiles packed (:data:`~blocksparse.ops.matmul.configs.AOT_PACKINGS`) is
    packed: the kernels address the layer's weight where it lies, no re-blocking copies."""
    fine = refined_block_size(layout.block_size)
    if fine is None:
        return None, None
    if fine == layout.block_size:
        return layout, None
    ref = refine(layout, fine, packed=layout.block_size // fine in AOT_PACKINGS.get(fine, ()))
    return ref.layout, ref


def for_layout(layout, *, allow_tf32=False, impl="auto", cost_model=None, device=None):
    """A :class:`LinearDispatch` for ``layout`` (any block size) with its own kernel product:
    over ``layout`` itself, or over its refinement (:func:`kernel_layout`), or none."""
    from ..matmul import BlocksparseMatMul  # the public module imports this one

    allow_tf32 = check_bool(allow_tf32, "allow_tf32")  # checked whether or not a kernel product is built
    fine, refinement = kernel_layout(layout)
    bsmm = BlocksparseMatMul(fine, fine.block_size, allow_tf32=allow_tf32) if fine is not None else None
    return LinearDispatch(layout, bsmm, refinement, impl=impl, cost_model=cost_model, device=device)


def _through_jit(dtype, block_size):
    """Whether the kernels of a CUDA call in ``dtype`` on blocks of ``block_size`` launch through
    Triton's JIT: no kernel library, or none of its forward products of that kind serves the current
    GPU (planned where no GPU is seen, the library is taken to serve)."""
    library = _kernels.load()
    if library is None:
        return True
    if not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability()
    return _unserved(library, 10 * major + minor, TRITON_TYPES.get(dtype), block_size)


@lru_cache(maxsize=64)
def _unserved(library, arch, dtype, block_size):
    return library.find("matmul", arch, product="fprop", dtype=dtype, block_size=block_size) is None


@torch._dynamo.assume_constant_result
def _traced_choice(handle, dtype, device_type, backward, revision):
    """The plan's choice while tracing (``revision``: the cost model's, so a graph is traced anew
    when it moves)."""
    d = _dispatchers[handle]
    return d.plan(d.last_tokens or DEFAULT_TOKENS, dtype, device_type, backward).impl


class LinearDispatch(nn.Module):
    """Chooses and runs the implementation of ``y = x @ W (+ bias)`` for one layer.

    Parameters
    ----------
    layout : Layout
        The layer's layout (any block size).
    bsmm : blocksparse.torch.BlocksparseMatMul or None
        The kernels' (and reference path's) product over :func:`kernel_layout`; None where the
        block size has neither.
    refinement : Refinement or None
        How the layer's weight becomes ``bsmm``'s (None: it is already).
    impl : str
        ``"auto"`` or one of :data:`blocksparse.dispatch.IMPLS`.
    cost_model : CostModel, optional
        Default: the tables shipped for PyTorch on the call's device.
    device : torch.device, optional
        Where to create the index buffers (they follow the owning layer's ``.to()``).

    A module without parameters: its buffers (the portable tables) are not saved in ``state_dict``.
    """

    def __init__(self, layout: Layout, bsmm=None, refinement=None, *, impl="auto", cost_model=None,
                 device=None):
        super().__init__()
        self.layout = layout
        self.bsmm = bsmm
        self.refinement = refinement
        self.impl = self.check_impl(impl)
        self.cost_model = check_cost_model(cost_model)
        self.tables = PortableTables(row_tables(layout), layout.coords, device)
        self.last_tokens = None
        self._plans = {}
        self._choices = {}
        self._structured = None
        self._native = {}
        self._fast = _native.FastPath(layout.K, self._copy_factor)
        self._fast.planned = self.model_state()
        self.handle = _new_handle(self)

    def reset_buffers(self):
        """Refill the index buffers (after ``Module.to_empty()``, which leaves them uninitialised)."""
        self.tables.reset()

    def __getstate__(self):
        # the decisions are a per-process memo (they depend on the machine's kernel library, and hold
        # read-only mappings that do not pickle)
        return {**self.__dict__, "_plans": {}, "_choices": {}, "_native": {},
                "_fast": _native.FastPath(self.layout.K, self._fast.factor)}

    def __setstate__(self, state):
        # a copy (deepcopy, pickle, torch.load) plans on its own: a traced graph reaches it by a
        # handle of its own, valid after the original is gone
        super().__setstate__(state)
        self.handle = _new_handle(self)

    def extra_repr(self):
        return f"impl={self.impl!r}, refined={self.refinement is not None}"

    def model_state(self):
        """``(cost model, its revision)``: what the memos of choices key on (a margin set later is seen)."""
        model = self.cost_model
        return (model, model.revision) if model is not None else (None, 0)

    def set_impl(self, impl):
        """Override the implementation (``"auto"`` or one of :data:`blocksparse.dispatch.IMPLS`)."""
        self.impl = self.check_impl(impl)
        self._fast.clear()  # its call kinds were planned under the old override

    def check_impl(self, impl):
        """``impl`` checked against what this layout can run at all."""
        impl = check_impl(impl)
        if impl in ("kernels", "reference") and self.bsmm is None:
            raise ValueError(f"impl={impl!r} cannot run block size {self.layout.block_size}: no kernel or "
                             "reference block size (8..128) divides it; use 'portable', 'dense' or 'auto'")
        return impl

    # ------------------------------------------------------------------ choosing
    @property
    def structured(self):
        if self._structured is None:
            self._structured = groups_well(self.layout)
        return self._structured

    def candidates(self, device_type, dtype):
        """Implementations that can run on ``device_type`` in ``dtype`` (a torch dtype)."""
        out = ["portable", "dense"]
        if self.bsmm is not None:
            kernels = (device_type == "cuda" and dtype in KERNEL_DTYPES
                       and self.bsmm.block_size in KERNEL_BLOCK_SIZES)
            out.append("kernels" if kernels else "reference")   # both run through bsmm
        return out

    def _forced(self):
        """``(impl, why)`` forced by the environment or the layer, or None."""
        backend = _env.backend()
        if backend == "triton":
            if self.bsmm is None:
                raise ValueError(f"BLOCKSPARSE_BACKEND=triton asks for the kernels, which have no block "
                                 f"size dividing {self.layout.block_size}; unset it (it overrides impl=) to "
                                 "run this layer")
            if self.bsmm.block_size not in KERNEL_BLOCK_SIZES:  # as BlocksparseMatMul at such blocks
                return "reference", (f"BLOCKSPARSE_BACKEND=triton, but the kernels take no blocks of "
                                     f"{self.bsmm.block_size}: the reference path serves")
            return "kernels", "BLOCKSPARSE_BACKEND=triton"
        if backend == "reference":
            return ("reference" if self.bsmm is not None else "portable"), "BLOCKSPARSE_BACKEND=reference"
        if self.impl != "auto":
            return self.impl, f"impl={self.impl!r} was asked for"
        return None

    def plan(self, tokens, dtype, device_type, backward=True):
        """The :class:`~blocksparse.dispatch.Plan` of a call on ``tokens`` rows of ``dtype`` on
        ``device_type`` (``"cpu"``, ``"cuda"``, ...); cached."""
        forced = self._forced()
        if forced is not None:
            impl, why = forced
            if impl == "kernels" and _env.backend() != "triton" and not (device_type == "cuda"
                                                                        and dtype in KERNEL_DTYPES):
                # what runs: the kernels' op takes its reference path off CUDA (see run)
                kinds = ", ".join(str(d).replace("torch.", "") for d in KERNEL_DTYPES)
                impl, why = "reference", (f"{why}, but the kernels run on CUDA tensors of {kinds} only: "
                                          f"their reference path runs a {device_type} {dtype} call")
            return override_plan(impl, why)
        precision = _PRECISION.get(dtype)
        if precision is None:
            raise TypeError(f"dtype must be one of {list(_PRECISION)}; got {dtype}")
        if precision == "float32" and device_type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
            precision = "tf32"
        candidates = tuple(self.candidates(device_type, dtype))
        model = self.cost_model or shared_model("torch", device_type)  # no table: the default rule
        jit = "kernels" in candidates and _through_jit(dtype, self.bsmm.block_size)
        key = (tokens, precision, device_type, backward, candidates, model, model.revision, jit)
        plan = self._plans.get(key)
        if plan is None:
            lay = self.layout
            problem = Problem(tokens, lay.C, lay.K, lay.block_size, lay.density, precision,
                              self.structured, backward, jit)
            plan = _bounded(self._plans)[key] = model.choose(problem, candidates)
        return plan

    def choose(self, x, w):
        """The implementation of the call ``x @ W`` (``x`` 2-D, ``w`` the layer's weight).

        Eager calls look their answer up by everything it depends on (one dict lookup after the
        first call of a kind: the plan is made once); the environment is read on every call, so
        a change of ``BLOCKSPARSE_BACKEND`` takes effect at once.
        """
        device_type = "cuda" if x.is_cuda else x.device.type
        dtype = x.dtype
        if dtype is not torch.float64:  # autocast leaves float64
            dtype = autocast_dtype_of(device_type) or dtype
        backward = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
        if torch.compiler.is_compiling():
            forced = self._forced()
            if forced:
                return forced[0]
            return _traced_choice(self.handle, dtype, device_type, backward, self.model_state()[1])
        tokens = x.shape[0] or 1  # an empty batch is planned as one token: every path returns it
        self.__dict__["last_tokens"] = tokens  # a plain int: nn.Module.__setattr__ costs microseconds
        tf32 = device_type == "cuda" and dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        key = (tokens, dtype, device_type, backward, self.impl, _env.getenv("BLOCKSPARSE_BACKEND"), tf32,
               self.model_state(), _env.getenv("BLOCKSPARSE_KERNELS"))
        impl = self._choices.get(key)
        if impl is None:
            impl = _bounded(self._choices)[key] = self.plan(tokens, dtype, device_type, backward).impl
        return impl

    # ------------------------------------------------------------------ running
    def fast(self, x, w, bias):
        """``x @ W (+ bias)`` for the layer's input ``x`` ``(..., in_features)`` where an eager call
        of its kind ran natively before (:class:`~blocksparse.torch._native.FastPath`: the kind
        looked up in C++), else None.  Plain tensors only (a subclass takes the planned way, where
        its ``__torch_function__`` sees the ops); never while tracing or under a functorch transform."""
        if not _plain(x, w, bias) or _functorch_active() or torch.compiler.is_compiling():
            return None
        fast, state = self._fast, self.model_state()
        if state != getattr(fast, "planned", None):  # the cost model changed: the kinds are planned anew
            fast.clear()
            fast.planned = state
            return None
        y = fast(x, w, bias)
        if y is not None:
            self.__dict__["last_tokens"] = x.shape[0] if x.dim() == 2 else x.numel() // x.shape[-1]
        return y

    def native(self, x, w, bias):
        """``x @ W (+ bias)`` as one native autograd node (:mod:`blocksparse.torch._native`: the
        refinement of the weight, the three products and the bias in C++) where the call's kind runs
        the kernel library's products, else None: :meth:`choose` and :meth:`run` serve it.

        ``x``: 2-D, ``w``: the layer's weight, both checked by the layer.  Eager CUDA calls look the
        answer up by everything it depends on -- one dict lookup after the first call of a kind.
        """
        if not x.is_cuda or _functorch_active() or torch.compiler.is_compiling():
            return None
        cast = autocast_dtype_of("cuda")
        grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                            or (bias is not None and bias.requires_grad))
        key = (x.shape[0], x.dtype, w.dtype, x.get_device(), w.get_device(), cast, grad, bias is None, self.impl,
               _env.getenv("BLOCKSPARSE_BACKEND"), _env.getenv("BLOCKSPARSE_TORCH_NATIVE"),
               torch._C._get_cublas_allow_tf32(), self.model_state())
        ids = self._native.get(key)
        if ids is None:
            ids = self._native[key] = self._native_ids(x, w, bias is not None) or False
        if not ids or w.shape != self.layout.w_shape:
            return None
        if _plain(x, w, bias):  # a call the fast path could have served: it will next time
            self._fast.store(x, w, bias, ids)
        self.__dict__["last_tokens"] = x.shape[0]
        if cast is not None:  # ids exist for kernel dtypes only: no float64 here
            x, w = x.to(cast), w.to(cast)
        return _native.linear(x, w, bias, ids, self._copy_factor)

    def _native_ids(self, x, w, bias=False):
        """The native op's record ids for calls like this one (``bias``: with a bias), or None."""
        if (self.bsmm is None or not x.numel() or x.device != w.device or w.shape != self.layout.w_shape
                or not _native.available() or self.choose(x, w) != "kernels"):
            return None
        cast = autocast_dtype_of("cuda")
        if cast is not None:
            x, w = x.to(cast), w.to(cast)
        if x.dtype != w.dtype or not use_triton(x, self.bsmm.block_size):
            return None
        x, w = (_dense(t) for t in (x, self.kernel_weight(w)))  # as the op hands them to the kernels
        bsmm = self.bsmm
        return _ops.native_ids(x, w, bsmm._handle, bsmm.axis, bsmm._precision, bias)

    @property
    def _copy_factor(self):
        """The factor of a refinement the weight is re-blocked for (copied), else 1."""
        ref = self.refinement
        return 1 if ref is None or ref.layout.packing > 1 else ref.factor

    def kernel_weight(self, w):
        """The layer's weight as ``bsmm``'s weight: re-blocked when the layout was refined (unpacked)."""
        ref = self.refinement
        if ref is None or ref.layout.packing > 1:
            return w
        s, r = ref.layout.block_size, ref.factor  # the refined layout is numbered coarse block by block
        return w.reshape(w.shape[0], r, s, r, s).transpose(2, 3).reshape(-1, s, s)

    def run(self, impl, x, w, bias=None):
        """``x @ W (+ bias)`` by ``impl``; ``x`` ``(N, C)``, ``w`` the layer's ``(blocks, bs, bs)``."""
        if w.shape != self.layout.w_shape:  # a replaced weight: the index tables would misread it
            raise ValueError(f"weight must have shape {self.layout.w_shape} (blocks, block_size, block_size); "
                             f"got {tuple(w.shape)}")
        if impl in ("kernels", "reference"):
            if self.bsmm is None:
                raise ValueError(f"impl={impl!r} cannot run block size {self.layout.block_size}; use "
                                 "'portable' or 'dense'")
            if not plain_ops_needed(x, w, bias):
                # the matmul ops of bsmm: the kernels where they run, else its reference path (as
                # BlocksparseLinear's "kernels" has always done off CUDA)
                return self.bsmm._linear(x, self.kernel_weight(w), bias)  # the bias added in the product
            # inside a torch.func transform bsmm would compute the dense product of its own layout:
            # the layer's index buffers say which (a vmap over stacked layers swaps in each one's)
            impl = "dense"
        self._check(x, w)
        self.tables.follow(w.device)
        if impl == "portable":
            return portable_matmul(x, w, self.tables, bias)
        return dense_matmul(x, w, self.tables, bias)

    def _check(self, x, w):
        floating_tensor("input", x)
        if x.device != w.device:
            raise ValueError(f"input and weight must be on one device; got {x.device} and {w.device}")
        if x.dtype != w.dtype and (torch.float64 in (x.dtype, w.dtype)
                                   or autocast_dtype_of(x.device.type) is None):  # autocast leaves float64
            raise TypeError(f"input and weight must have the same dtype (or float16 / bfloat16 / float32 under "
                            f"autocast); got {x.dtype} and {w.dtype}")


_PLAIN = (torch.Tensor, nn.Parameter)
_PLAIN_OR_NONE = (torch.Tensor, nn.Parameter, type(None))


def _bounded(cache):
    """``cache``, emptied first when full (a layer fed ever new token counts stays bounded)."""
    if len(cache) >= PLAN_CACHE_SIZE:
        cache.clear()
    return cache


def _plain(x, w, bias):
    """Whether the operands are plain tensors / parameters (no subclass with its own dispatch)."""
    return type(x) is torch.Tensor and type(w) in _PLAIN and type(bias) in _PLAIN_OR_NONE


def _dense(t):
    """``t`` contiguous on a 16-byte boundary (as the native op makes its operands)."""
    t = t.contiguous()
    return t if not t.data_ptr() % 16 else t.clone()


def check_input(x, in_features, weight):
    """``x`` after checking it is a floating tensor of shape ``(..., in_features)`` on ``weight``'s
    device (a layer's input; checked before the plan, which depends on the device)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor; got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(f"input must have shape (..., {in_features}); got {tuple(x.shape)}")
    floating_tensor("input", x)
    if x.device != weight.device:
        raise ValueError(f"input and weight must be on one device; got {x.device} and {weight.device}")
    return x


def uniform_fan_in_(weight, bias, layout):
    """Initialise a block-sparse layer like ``nn.Linear``: uniform in +-1/sqrt(fan-in) per output
    feature, the fan-in counting only the blocks that feed it (:func:`blocksparse._initializers.fan_in_bounds`)."""
    per_block, per_feature = fan_in_bounds(layout)
    with torch.no_grad():
        weight.uniform_(-1.0, 1.0).mul_(torch.as_tensor(per_block, device=weight.device)
                                        .to(weight.dtype)[:, None, None])
        if bias is not None:
            bias.uniform_(-1.0, 1.0).mul_(torch.as_tensor(per_feature, device=bias.device).to(bias.dtype))


class Dispatched:
    """Mixin of the layers that own a :class:`LinearDispatch` as ``_dispatch`` and a ``weight``:
    the ``impl`` override and :meth:`plan`."""

    @property
    def impl(self):
        """The implementation override: ``"auto"`` or one of :data:`blocksparse.dispatch.IMPLS`."""
        return self._dispatch.impl

    @impl.setter
    def impl(self, value):
        self._dispatch.set_impl(value)

    def plan(self, tokens=None, dtype=None, device=None, backward=True):
        """What runs a call on ``tokens`` rows, and why: a :class:`blocksparse.dispatch.Plan`.

        Defaults: the token count of the last call (else :data:`DEFAULT_TOKENS`), the weight's
        dtype (a torch or numpy dtype or its name) and device; ``backward``: whether the call is
        trained through (both gradients too).
        """
        tokens = check_int(tokens, "tokens", allow_none=True)
        dtype = None if dtype is None else float_dtype("dtype", dtype)
        if not isinstance(backward, bool):
            raise TypeError(f"backward must be a bool; got {backward!r}")
        if device is None:
            device = self.weight.device
        else:
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(f"device must name a torch device (e.g. 'cuda', 'cpu', 'cuda:1'); got {device!r}") \
                    from exc
        return self._dispatch.plan(tokens or self._dispatch.last_tokens or DEFAULT_TOKENS,
                                   dtype or self.weight.dtype, device.type, backward)
