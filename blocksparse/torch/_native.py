"""The eager linear, the eager implicit-GEMM convolution, layer norm and the LSTM gates as C++
autograd nodes (``csrc/``): built here, fed from the plans or the kernel library's entry points.

Where the kernel library serves all three products of a linear call, :func:`records` turns their
prepared launches (:class:`~blocksparse.torch._launch.AotLaunch`) into records of the native op
once per plan, and the call is ``torch.ops.blocksparse_native.linear`` -- no Python in the
backward, which autograd runs on its CUDA worker thread (about 100 µs a step for a Python
``autograd.Function``, measured in ``bench/README.md``).  The convolution's glue
(:mod:`blocksparse.torch._conv.implicit`) registers its two launches alike (:func:`add_launch`)
with the geometry of its filter gradient (:func:`add_conv`), and calls :func:`conv`.  Layer norm
and the LSTM gates need no plans: the kernel library's own entry points for them
(``bsk_layer_norm_run`` / ``bsk_lstm_gates_run``, as the TensorFlow ops call them) choose the spec
and launch, so the ops take the library's function addresses (:func:`entry`) and an eager call
(:func:`eager_library` says which) is one op call, :func:`layer_norm` / :func:`lstm_gates`.

The ops are compiled against the installed torch on first use into one library (about 30 s;
``$CXX``, else c++ / g++) in ``BLOCKSPARSE_CACHE_DIR`` and reused; ``BLOCKSPARSE_TORCH_NATIVE=off``
switches them off.  They need torch :data:`MIN_TORCH` or newer (older releases have no stream
handle in their C++ API): before that the Python paths serve, silently.  Where they cannot be
built, one :class:`NativeBuildWarning` says why and the Python paths serve.
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
import torch.autograd.forward_ad as _forward_ad

from .. import _env, _kernels
from ._autograd import functorch_active as _functorch_active

__all__ = ["NativeBuildWarning", "MIN_TORCH", "available", "supported", "build", "records", "linear", "SOURCES",
           "FastPath", "add_record", "add_launch", "add_conv", "conv", "ENTRY_POINTS", "entry", "eager_library",
           "layer_norm", "lstm_gates"]

CSRC = Path(__file__).with_name("csrc")
#: The op library's translation units: the records and the linear (``linear.cpp``), the implicit-GEMM
#: convolution (``conv.cpp``), layer norm (``norms.cpp``); compiled with the headers of :data:`CSRC` into one shared library.
SOURCES = (CSRC / "linear.cpp", CSRC / "conv.cpp", CSRC / "norms.cpp")
#: The oldest torch whose C++ API the op builds against (``c10::Stream::native_handle``).
MIN_TORCH = (2, 5)
_log = logging.getLogger("blocksparse")
#: Tensor types the native ops take as they are (no ``__torch_function__`` of their own).
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_lock = threading.Lock()
_state = {}  # "loaded": bool, "why": str


class NativeBuildWarning(RuntimeWarning):
    """The native ops could not be built or loaded; the Python autograd paths serve (the message says why)."""


def _compiler():
    for name in filter(None, (os.environ.get("CXX"), "c++", "g++", "clang++")):
        path = shutil.which(name)
        if path:
            return path
    return None


def _commands(compiler, sources, objects, target):
    """The compile command of each source (into ``objects``) and the link command of ``target``."""
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in (CSRC, *cpp_extension.include_paths())]
    libdir = cpp_extension.library_paths()[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compile_ = [[compiler, "-O2", "-std=c++17", "-fPIC", "-w", *includes, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-c",
                 str(source), "-o", str(obj)] for source, obj in zip(sources, objects)]
    link = [compiler, "-shared", *map(str, objects), "-o", str(target), *_loaded_cxx_runtime(), f"-L{libdir}",
            "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{libdir}"]
    return compile_, link


def _loaded_cxx_runtime():
    """The shared C++ runtime this process has loaded (torch's), named to the linker first, or nothing.

    A toolchain whose ``-lstdc++`` finds only the static archive (seen: g++ 13.3 against torch 2.11)
    copies libstdc++ into the library; that second copy's locale is never initialised, so formatting
    a number -- every error message with one, ``TORCH_CHECK(f >= 1, "got ", f)`` -- crashed the process
    instead of raising.  Linked against the loaded runtime, the ops use the one copy torch uses."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libstdc++.so" in line}
    except OSError:  # no /proc (not Linux): the toolchain's default
        return []
    paths = sorted(p for p in paths if os.path.isfile(p))
    return paths[:1]


def _digest(compiler):
    """What the library depends on: its sources and headers, torch's version, the compiler, the C++
    runtime it links."""
    text = b"".join(p.name.encode() + p.read_bytes() for p in (*SOURCES, *sorted(CSRC.glob("*.h"))))
    recipe = " ".join(["link-loaded-runtime", *_loaded_cxx_runtime()]).encode()  # a library linked otherwise is rebuilt
    return hashlib.sha256(text + torch.__version__.encode() + compiler.encode() + recipe).hexdigest()[:16]


def build(cache=None):
    """Path of the ops' shared library (:data:`SOURCES`) for the installed torch, compiled if not
    cached -- the sources in parallel, then linked (``RuntimeError`` with the compiler's output where
    it fails)."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found: set CXX or install g++")
    target = Path(cache or _env.cache_dir()) / "native" / f"native-{torch.__version__}-{_digest(compiler)}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _log.info("blocksparse: compiling the native ops for torch %s (once, about 30 s)", torch.__version__)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        objects = [Path(tmp) / f"{source.stem}.o" for source in SOURCES]
        compile_, link = _commands(compiler, SOURCES, objects, partial)
        running = [(source, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                   for source, command in zip(SOURCES, compile_)]
        outputs = [process.communicate()[1] for _, process in running]  # every compile finishes first
        for (source, process), stderr in zip(running, outputs):
            if process.returncode:
                raise RuntimeError(f"compiling {source.name} failed:\n{stderr[-4000:]}")
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"linking {target.name} failed:\n{done.stderr[-4000:]}")
        os.replace(partial, target)  # atomic: a concurrent build of the same sources is harmless
    return target


def supported():
    """Whether the installed torch is :data:`MIN_TORCH` or newer."""
    return torch.__version__ >= MIN_TORCH


def available():
    """Whether the native ops are loaded (built and loaded on the first call; False where switched off,
    on a torch older than :data:`MIN_TORCH`, or where it cannot be built, with one warning)."""
    if not _env.torch_native():
        return False
    loaded = _state.get("loaded")  # once loaded, the torch version is known to be supported
    if loaded is None:
        if not supported():  # a version comparison: slow, asked only before the first load
            return False
        with _lock:
            loaded = _state.get("loaded")
            if loaded is None:
                try:
                    torch.ops.load_library(str(build()))
                    loaded = True
                except Exception as exc:  # noqa: BLE001 -- any failure leaves the Python path
                    loaded, _state["why"] = False, str(exc)
                    warnings.warn(f"blocksparse: the native ops are not used ({exc}); the Python "
                                  "autograd paths serve", NativeBuildWarning, stacklevel=3)
                _state["loaded"] = loaded
    return loaded


def _address(function):
    return ctypes.cast(function, ctypes.c_void_p).value


def add_launch(runner, out_shape, out_dtype, zero=None, cast_to=None, pretranspose=False, fused_bias=False,
               transpose_inputs=False, scratch=None, pack=1):
    """Register the prepared launch ``runner`` (an ``AotLaunch``) with the native ops as a record
    writing an ``out_shape`` tensor of ``out_dtype``, zero-filled first where ``zero`` says (None:
    where the launch zero-fills a tensor); its integer id.  The rest: the fields of a matmul plan
    (:func:`add_record`)."""
    kernels = runner.kernels
    words = torch.from_numpy(np.frombuffer(bytes(memoryview(runner.args)), dtype=np.int64).copy())
    slots = [v for slot in runner.slots for v in slot]
    return torch.ops.blocksparse_native.add_record(
        _address(kernels.raw_launch), _address(kernels.raw_memset32), runner.spec_index, list(runner.grid), words,
        runner._argv[3], slots, list(out_shape), out_dtype, bool(runner._zero) if zero is None else zero, cast_to,
        pretranspose, fused_bias, transpose_inputs, *(scratch or (0, 0)), pack)


def add_record(plan):
    """Register ``plan`` (a :class:`~blocksparse.torch._matmul.plan.Plan` whose runner is an
    ``AotLaunch``) with the native op; its integer id."""
    return add_launch(plan.runner, plan.out_shape, plan.out_dtype, cast_to=plan.cast_to,
                      pretranspose=plan.pretranspose, fused_bias=plan.bias, transpose_inputs=plan.transpose_inputs,
                      scratch=plan.scratch, pack=plan.pack)


def records(fprop, make_backward):
    """``(fprop, bprop, updat)`` record ids of a call whose forward plan is ``fprop``, or None where
    a product is not served by the kernel library; ``make_backward()`` gives the other two plans
    (called once per forward plan: the ids are kept on it)."""
    ids = getattr(fprop, "native", None)
    if ids is None:
        plans = (fprop, *make_backward())
        ok = all(p.runner is not None and p.path == "aot" and not p.pad_tokens
                 and not (p.transpose_inputs and p.kind != "updat") for p in plans)
        ids = fprop.native = tuple(add_record(p) for p in plans) if ok else False
    return ids or None


def linear(x, w, bias, ids, factor=1):
    """``x @ W (+ bias)`` through the native op (``ids`` from :func:`records`); a refined layer
    passes the factor of its refinement (:mod:`blocksparse.ops.matmul.refine`) and its coarse
    weight."""
    return torch.ops.blocksparse_native.linear(x, w, bias, *ids, factor)


def add_conv(fprop, bprop, x_shape, dtype, strides, pads, dilations, x_pad, dy_pad, w_shape):
    """Register an implicit-GEMM convolution's call shape with the native op: the launch records of
    its output and its input gradient (:func:`add_launch`), the input's shape and dtype, and the
    geometry of its filter gradient -- strides, symmetric pads and dilations of the dense
    convolution, ``F.pad`` widths of the input and of the output gradient (``()``: none), the
    dense filter's shape; its integer id (see ``csrc/conv.cpp``)."""
    return torch.ops.blocksparse_native.add_conv(fprop, bprop, list(x_shape), dtype, list(strides), list(pads),
                                                 list(dilations), list(x_pad), list(dy_pad), list(w_shape))


def conv(x, flat, weight_index, grad_index, dense_index, conv_id):
    """The implicit-GEMM convolution of ``x`` and the flat filter through the native op, a record of
    :func:`add_conv` (``weight_index`` / ``grad_index``: the packed filters' gathers of the output
    and of the input gradient; ``dense_index``: the dense filter's positions)."""
    return _conv(x, flat, weight_index, grad_index, dense_index, conv_id)


def _conv(*args):
    global _conv
    _conv = torch.ops.blocksparse_native.conv_implicit.default  # the overload itself: no per-call resolution
    return _conv(*args)


class FastPath:
    """A layer's eager fast path: the native op's own table of the layer's planned call kinds.

    After Python planned a call and found it native (:func:`records`), :meth:`store` enters its
    kind -- token count, dtypes, device, autocast, whether a backward follows, TF32, the
    ``BLOCKSPARSE_BACKEND`` / ``BLOCKSPARSE_TORCH_NATIVE`` settings -- and its records into the op's
    table.  :meth:`__call__` then runs a call of a stored kind as one op call, its kind computed
    and looked up in C++; anything else (a new kind, bad input) gives None, and Python plans it.
    Used only where the op is loaded; ``clear()`` forgets the layer's kinds (its choices changed).
    ``planned``: what the stored kinds were planned under (the layer's cost model and its revision),
    kept here so that replicas sharing the table (``DataParallel``) agree on it.
    """

    __slots__ = ("layer", "out_features", "factor", "planned")

    def __init__(self, out_features, factor=1, planned=None):
        self.layer = None  # the op's layer id, made on the first store
        self.out_features = out_features
        self.factor = factor
        self.planned = planned

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


#: The kernel library's entry points of the ops of ``csrc/norms.cpp``: the op's registration and
#: the library's functions (run, workspace, select, device).
ENTRY_POINTS = {
    "layer_norm": ("norms_entry", ("bsk_layer_norm_run", "bsk_layer_norm_workspace", "bsk_layer_norm_select",
                                   "bsk_device_at")),
    "lstm_gates": ("lstm_gates_entry", ("bsk_lstm_gates_run", "bsk_lstm_gates_workspace", "bsk_lstm_gates_select",
                                        "bsk_device_at")),
}


def entry(kernels, op):
    """The native op's id of the entry points of ``op`` (``"layer_norm"``, ``"lstm_gates"``) in the
    kernel library ``kernels`` (registered once per library, see ``csrc/norms.cpp``), or None for
    a library without them."""
    ids = kernels.__dict__.setdefault("native_entries", {})
    found = ids.get(op)
    if found is None:
        register, names = ENTRY_POINTS[op]
        try:
            addresses = [kernels.address(name) for name in names]
        except AttributeError:  # an older library: the Python path serves
            found = False
        else:
            found = getattr(torch.ops.blocksparse_native, register)(*addresses)
        ids[op] = found
    return found if found is not False else None


def eager_library(*tensors):
    """The kernel library for an eager call of the native ops of ``csrc/norms.cpp`` on ``tensors``
    (the first a CUDA tensor, each a plain tensor or None), or None: other tensor types, while
    ``torch.compile`` or ``torch.jit`` traces, inside ``torch.func`` transforms or forward-mode AD,
    the reference backend, no kernel library or no native ops."""
    if not (type(tensors[0]) in _PLAIN and tensors[0].is_cuda
            and all(t is None or type(t) in _PLAIN for t in tensors[1:])):
        return None
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or _functorch_active()
            or _forward_ad._current_level >= 0 or _env.backend() == "reference" or not available()):
        return None
    return _kernels.load()


def layer_norm(x, g, b, axis, epsilon, relu, segments, entry):
    """``y`` of the eager layer norm through the native op and the entry points ``entry``
    (:func:`entry`), or None where the kernel library does not serve the call."""
    return _layer_norm(x, g, b, axis, epsilon, relu, segments, entry)


def _layer_norm(*args):
    global _layer_norm
    _layer_norm = torch.ops.blocksparse_native.layer_norm.default  # the overload itself: no per-call resolution
    return _layer_norm(*args)


def lstm_gates(c, gates, bias, forget_bias, entry):
    """``(c_next, h_next)`` of the eager LSTM gates (one merged or four gate tensors) through the
    native op and the entry points ``entry`` (:func:`entry`), or None where the kernel library does
    not serve the call."""
    out = _lstm_gates(c, *gates, *((None,) * (4 - len(gates))), bias, forget_bias, entry)
    return tuple(out) if out else None


def _lstm_gates(*args):
    global _lstm_gates
    _lstm_gates = torch.ops.blocksparse_native.lstm_gates.default  # the overload itself: no per-call resolution
    return _lstm_gates(*args)
