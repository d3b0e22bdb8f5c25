"""Run a Gluon kernel's own source on the CPU, one program after another, with numpy standing in
for the Hopper primitives it calls -- Triton's interpreter does not take Gluon.

The kernel's Python function (and the ``@gluon.jit`` helpers it calls) run with their module's
globals, where ``gl``, ``tma``, ``mbarrier``, ``warpgroup_mma``, ``warpgroup_mma_wait`` and
``fence_async_shared`` are replaced by the classes below.  Values are float32 numpy arrays; shared
memory holds what the TMA copies put there, zero-filled out of bounds as the copy engine does.
Besides the values, the stand-ins check the pipeline's ordering rules, the ones a GPU would break
silently or hang on:

* a wait on an mbarrier must find the phase it names completed (else the GPU would hang);
* a stage is refilled only after its last contents were waited for, and never while a wgmma that
  reads it may still run (products retire only through ``warpgroup_mma_wait``);
* the output staging buffer is written only after the TMA store reading it was awaited.
"""
from __future__ import annotations

import types
from collections import deque

import numpy as np

__all__ = ["Desc", "Ptr", "run_kernel", "PipelineError"]


class PipelineError(AssertionError):
    """A rule of the asynchronous pipeline broken by the kernel."""


class T(np.ndarray):
    """A float32 / int tensor value: numpy with Triton's ``.to``."""

    def to(self, dtype):
        return np.asarray(self, dtype=np.float32 if dtype in (_GL.float32, _GL.bfloat16, _GL.float16)
                          else np.int64).view(T)


def _t(a):
    return np.asarray(a).view(T)


class Ptr:
    """A pointer into a 1-D numpy array (``+`` an int or an array of offsets)."""

    def __init__(self, array, offset=0):
        self.array, self.offset = np.asarray(array).reshape(-1), offset

    def __add__(self, k):
        return Ptr(self.array, self.offset + k)


class _BlockType:
    def __init__(self, shape, itemsize):
        self.shape, self.nbytes = list(shape), int(np.prod(shape)) * itemsize


class Desc:
    """A 2-D tensor descriptor over ``array`` (float32 values of a 16-bit tensor), tile ``block``."""

    def __init__(self, array, block, itemsize=2):
        self.array, self.block_type = array, _BlockType(block, itemsize)
        self.dtype, self.layout = _GL.bfloat16, None

    def tile(self, coord):
        """The block at ``coord``, zeros where it lies outside the array (negative coordinates too)."""
        (r0, c0), (br, bc) = coord, self.block_type.shape
        out = np.zeros((br, bc), np.float32)
        rows, cols = self.array.shape
        rs, re_, cs, ce = max(r0, 0), min(r0 + br, rows), max(c0, 0), min(c0 + bc, cols)
        if rs < re_ and cs < ce:
            out[rs - r0:re_ - r0, cs - c0:ce - c0] = self.array[rs:re_, cs:ce]
        return out

    def put(self, coord, value, rounding):
        """Store ``value`` at ``coord``, clipped at the array's edges, rounded by ``rounding``."""
        (r0, c0), (br, bc) = coord, value.shape
        rows, cols = self.array.shape
        re_, ce = min(r0 + br, rows), min(c0 + bc, cols)
        self.array[r0:re_, c0:ce] = rounding(np.asarray(value)[:re_ - r0, :ce - c0])


class _View:
    def __init__(self, smem, index, transposed=False):
        self.smem, self.index_, self.transposed = smem, index, transposed

    def permute(self, order):
        return _View(self.smem, self.index_, not self.transposed if tuple(order) == (1, 0) else self.transposed)

    def value(self):
        v = self.smem.data[self.index_]
        return v.T if self.transposed else v

    def key(self):
        return (id(self.smem), self.index_)


class _Smem:
    def __init__(self, shape, state):
        self.data, self.state = np.zeros(shape, np.float32), state

    def index(self, i):
        return _View(self, int(i))

    def store(self, value):
        if self.state.store_pending:
            raise PipelineError("the output buffer written while a TMA store still reads it")
        self.data[...] = value


class _Barrier:
    def __init__(self):
        self.completed, self.waited, self.pending = 0, 0, 0


class _State:
    """Per program: barriers, products in flight, the pending store."""

    def __init__(self):
        self.barriers, self.inflight, self.store_pending = {}, deque(), False


class _GL:
    """``triton.experimental.gluon.language`` for the emulation."""

    float32, bfloat16, float16, int64, int32 = "float32", "bfloat16", "float16", "int64", "int32"
    constexpr = object
    static_range = staticmethod(range)
    state: _State = None
    pid, programs = 0, 1

    @staticmethod
    def program_id(axis):
        return _GL.pid

    @staticmethod
    def num_programs(axis):
        return _GL.programs

    @staticmethod
    def allocate_shared_memory(dtype, shape, layout):
        return _Smem(shape, _GL.state)

    @staticmethod
    def zeros(shape, dtype, layout=None):
        return _t(np.zeros(shape, np.float32))

    @staticmethod
    def arange(start, end, layout=None):
        return _t(np.arange(start, end))

    @staticmethod
    def SliceLayout(dim, parent):
        return None

    @staticmethod
    def where(cond, a, b):
        return _t(np.where(cond, a, b))

    @staticmethod
    def load(ptr, mask=True, other=0):
        if np.ndim(ptr.offset) == 0:
            return ptr.array[ptr.offset].item() if mask else other
        idx = np.asarray(ptr.offset)
        ok = np.broadcast_to(np.asarray(mask), idx.shape)
        return _t(np.where(ok, ptr.array[np.where(ok, idx, 0)], other).astype(np.float32))


class _MBarrier:
    @staticmethod
    def MBarrierLayout():
        return None

    @staticmethod
    def _bar(view):
        return _GL.state.barriers.setdefault(view.key(), _Barrier())

    @staticmethod
    def init(view, count):
        _GL.state.barriers[view.key()] = _Barrier()

    @staticmethod
    def invalidate(view):
        pass

    @staticmethod
    def expect(view, nbytes, pred=True):
        if pred:
            bar = _MBarrier._bar(view)
            if bar.completed != bar.waited or bar.pending:
                raise PipelineError("a stage refilled before its last contents were waited for")
            bar.pending = nbytes

    @staticmethod
    def wait(view, phase, pred=True, deps=()):
        bar = _MBarrier._bar(view)
        if bar.completed <= bar.waited or (bar.waited & 1) != phase:
            raise PipelineError(f"a wait on phase {phase} that would never complete (completed "
                                f"{bar.completed}, waited {bar.waited})")
        bar.waited += 1


class _TMA:
    @staticmethod
    def async_copy_global_to_shared(desc, coord, view, dest, pred=True):
        if not pred:
            return
        if any(dest.key() == key for keys in _GL.state.inflight for key in keys):
            raise PipelineError("a stage refilled while a wgmma may still read it")
        dest.smem.data[dest.index_] = desc.tile([int(c) for c in coord])
        bar = _MBarrier._bar(view)
        bar.pending -= desc.block_type.nbytes
        if bar.pending < 0:
            raise PipelineError("more bytes copied than the barrier expects")
        if bar.pending == 0:
            bar.completed += 1

    @staticmethod
    def async_copy_shared_to_global(desc, coord, smem):
        desc.put([int(c) for c in coord], smem.data, desc.rounding)
        _GL.state.store_pending = True

    @staticmethod
    def store_wait(pendings):
        if pendings == 0:
            _GL.state.store_pending = False


class _Token:
    def __init__(self, value, keys):
        self.value, self.keys = value, keys


def _wgmma(a, b, acc, use_acc=True, is_async=False, **_):
    acc = acc.value if isinstance(acc, _Token) else acc
    out = _t(a.value() @ b.value() + (np.asarray(acc) if use_acc else 0))
    if not is_async:
        return out
    _GL.state.inflight.append((a.key(), b.key()))
    return _Token(out, None)


def _wgmma_wait(num_outstanding=0, deps=None):
    while len(_GL.state.inflight) > num_outstanding:
        _GL.state.inflight.popleft()
    vals = [d.value if isinstance(d, _Token) else d for d in deps]
    return vals[0] if len(vals) == 1 else tuple(vals)


def _emulated(fn, env, done):
    """``fn``'s Python function with ``env`` for its globals (its jit callees likewise)."""
    raw = getattr(fn, "fn", fn)
    if raw in done:
        return done[raw]
    glb = dict(raw.__globals__)
    out = types.FunctionType(raw.__code__, glb, raw.__name__, raw.__defaults__, raw.__closure__)
    done[raw] = out
    for name, value in list(glb.items()):
        if name in env:
            glb[name] = env[name]
        elif hasattr(value, "fn") and hasattr(value.fn, "__code__") and type(value).__name__ == "GluonJITFunction":
            glb[name] = _emulated(value, env, done)
    return out


def run_kernel(kernel, programs, *args, **constexprs):
    """Run ``kernel`` (a ``@gluon.jit`` function) for program ids ``0 .. programs - 1`` in turn, with
    ``args`` (:class:`Desc`, :class:`Ptr`, ints) and ``constexprs``; raises :class:`PipelineError`
    where the kernel breaks a pipeline rule.  The output descriptors' ``rounding`` (a callable) rounds
    what is stored."""
    env = {"gl": _GL, "mbarrier": _MBarrier, "tma": _TMA, "warpgroup_mma": _wgmma,
           "warpgroup_mma_wait": _wgmma_wait, "fence_async_shared": lambda *a, **k: None,
           "mma_layout": lambda *a, **k: None}
    fn = _emulated(kernel, env, {})
    _GL.programs = programs
    for pid in range(programs):
        _GL.pid, _GL.state = pid, _State()
        fn(*args, **constexprs)
        if _GL.state.store_pending:
            raise PipelineError("the program ended with a TMA store not awaited")
