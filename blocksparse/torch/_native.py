"""The eager linear as one C++ autograd node (``csrc/linear.cpp``): built here, fed from the plans.

Where the kernel library serves all three products of a call, :func:`records` turns their
prepared launches (:class:`~blocksparse.torch._launch.AotLaunch`) into records of the native op
once per plan, and the call is ``torch.ops.blocksparse_native.linear`` -- no Python in the
backward, which autograd runs on its CUDA worker thread (about 100 µs a step for a Python
``autograd.Function``, measured in ``bench/README.md``).

The op is compiled against the installed torch on first use (about 30 s; ``$CXX``, else c++ / g++)
into ``BLOCKSPARSE_CACHE_DIR`` and reused; ``BLOCKSPARSE_TORCH_NATIVE=off`` switches it off.  It
needs torch :data:`MIN_TORCH` or newer (older releases have no stream handle in their C++ API):
before that the Python path serves, silently.  Where it cannot be built, one
:class:`NativeBuildWarning` says why and the Python path serves.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from .. import _env

__all__ = ["NativeBuildWarning", "MIN_TORCH", "available", "supported", "build", "records", "linear", "SOURCE",
           "FastPath"]

SOURCE = Path(__file__).with_name("csrc") / "linear.cpp"
#: The oldest torch whose C++ API the op builds against (``c10::Stream::native_handle``).
MIN_TORCH = (2, 5)
_log = logging.getLogger("blocksparse")
_lock = threading.Lock()
_state = {}  # "loaded": bool, "why": str


class NativeBuildWarning(RuntimeWarning):
    """The native op could not be built or loaded; the Python autograd path serves (the message says why)."""


def _compiler():
    for name in filter(None, (os.environ.get("CXX"), "c++", "g++", "clang++")):
        path = shutil.which(name)
        if path:
            return path
    return None


def _command(compiler, source, target):
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libdir = cpp_extension.library_paths()[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", *includes, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            str(source), "-o", str(target), f"-L{libdir}", "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{libdir}"]


def build(cache=None):
    """Path of the op's shared library for the installed torch, compiled if not cached
    (``RuntimeError`` with the compiler's output where it fails)."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found: set CXX or install g++")
    text = SOURCE.read_bytes()
    digest = hashlib.sha256(text + torch.__version__.encode() + compiler.encode()).hexdigest()[:16]
    target = Path(cache or _env.cache_dir()) / "native" / f"linear-{torch.__version__}-{digest}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _log.info("blocksparse: compiling the native linear op for torch %s (once, about 30 s)", torch.__version__)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        done = subprocess.run(_command(compiler, SOURCE, partial), capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{done.stderr[-4000:]}")
        os.replace(partial, target)  # atomic: a concurrent build of the same source is harmless
    return target


def supported():
    """Whether the installed torch is :data:`MIN_TORCH` or newer."""
    return torch.__version__ >= MIN_TORCH


def available():
    """Whether the native op is loaded (built and loaded on the first call; False where switched off,
    on a torch older than :data:`MIN_TORCH`, or where it cannot be built, with one warning)."""
    if not _env.torch_native() or not supported():
        return False
    loaded = _state.get("loaded")
    if loaded is None:
        with _lock:
            loaded = _state.get("loaded")
            if loaded is None:
                try:
                    torch.ops.load_library(str(build()))
                    loaded = True
                except Exception as exc:  # noqa: BLE001 -- any failure leaves the Python path
                    loaded, _state["why"] = False, str(exc)
                    warnings.warn(f"blocksparse: the native linear op is not used ({exc}); the Python "
                                  "autograd path serves", NativeBuildWarning, stacklevel=3)
                _state["loaded"] = loaded
    return loaded


def _address(function):
    return ctypes.cast(function, ctypes.c_void_p).value


def add_record(plan):
    """Register ``plan`` (a :class:`~blocksparse.torch._matmul.plan.Plan` whose runner is an
    ``AotLaunch``) with the native op; its integer id."""
    runner = plan.runner
    kernels = runner.kernels
    words = torch.from_numpy(np.frombuffer(bytes(memoryview(runner.args)), dtype=np.int64).copy())
    slots = [v for slot in runner.slots for v in slot]
    return torch.ops.blocksparse_native.add_record(
        _address(kernels.raw_launch), _address(kernels.raw_memset32), runner.spec_index, list(runner.grid), words,
        runner._argv[3], slots, list(plan.out_shape), plan.out_dtype, bool(runner._zero), plan.cast_to,
        plan.pretranspose, plan.bias, plan.transpose_inputs, *(plan.scratch or (0, 0)), plan.pack)


def records(fprop, make_backward):
    """``(fprop, bprop, updat)`` record ids of a call whose forward plan is ``fprop``, or None where
    a product is not served by the kernel library; ``make_backward()`` gives the other two plans
    (called once per forward plan: the ids are kept on it)."""
    ids = getattr(fprop, "native", None)
    if ids is None:
        plans = (fprop, *make_backward())
        ok = all(p.runner is not None and p.path == "aot" for p in plans)
        ids = fprop.native = tuple(add_record(p) for p in plans) if ok else False
    return ids or None


def linear(x, w, bias, ids, factor=1):
    """``x @ W (+ bias)`` through the native op (``ids`` from :func:`records`); a refined layer
    passes the factor of its refinement (:mod:`blocksparse.ops.matmul.refine`) and its coarse
    weight."""
    return torch.ops.blocksparse_native.linear(x, w, bias, *ids, factor)


class FastPath:
    """A layer's eager fast path: the native op's own table of the layer's planned call kinds.

    After Python planned a call and found it native (:func:`records`), :meth:`store` enters its
    kind -- token count, dtypes, device, autocast, whether a backward follows, TF32, the
    ``BLOCKSPARSE_BACKEND`` / ``BLOCKSPARSE_TORCH_NATIVE`` settings -- and its records into the op's
    table.  :meth:`__call__` then runs a call of a stored kind as one op call, its kind computed
    and looked up in C++; anything else (a new kind, bad input) gives None, and Python plans it.
    Used only where the op is loaded; ``clear()`` forgets the layer's kinds (its choices changed).
    """

    __slots__ = ("layer", "out_features", "factor")

    def __init__(self, out_features, factor=1):
        self.layer = None  # the op's layer id, made on the first store
        self.out_features = out_features
        self.factor = factor

    def __call__(self, x, w, bias):
        """``x @ W (+ bias)`` for ``x`` ``(..., in_features)`` where its call kind was stored, else None."""
        layer = self.layer
        return None if layer is None else _fast(x, w, bias, layer)

    def store(self, x, w, bias, ids):
        """Enter the kind of the call ``(x, w, bias)`` (as the layer received them), run by ``ids``."""
        if self.layer is None:
            self.layer = torch.ops.blocksparse_native.fast_layer()
        torch.ops.blocksparse_native.fast_store(x, w, bias, self.layer, *ids, self.factor, self.out_features)

    def clear(self):
        if self.layer is not None:
            torch.ops.blocksparse_native.fast_clear(self.layer)


def _fast(x, w, bias, layer):
    global _fast
    _fast = torch.ops.blocksparse_native.fast.default  # the overload itself: no per-call resolution
    return _fast(x, w, bias, layer)
