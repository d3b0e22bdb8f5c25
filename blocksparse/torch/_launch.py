"""The launch layer every op family's PyTorch glue uses: one kernel launch, described once, run
many times -- from the kernel library (ahead-of-time cubins, one ctypes call) where a compiled spec
serves it, else through Triton's JIT.

A family describes a launch as a :class:`KernelLaunch` (its plan builds one per call shape): the
Triton kernel, the grid, every argument by the kernel's own parameter names, the constexprs and
compile options.  Arguments are fixed values (ints, floats, tensors such as lookup tables) or slots
filled at each call from the call's tensors: :class:`Operand` (a tensor's data pointer) and
:class:`Descriptor` (a host tensor descriptor over one, its shape, strides and block fixed).

:func:`prepare` turns a description into a runner.  :class:`AotLaunch` checks once that the spec
was compiled for exactly this launch (kernel, constexprs, options, every argument's kind, the
alignment it assumes, descriptor boxes), packs the arguments into a ``bsk_arg`` array, and per
call writes the tensors' data pointers into their slots and calls ``bsk_launch`` on the current
stream.  :class:`JitLaunch` keeps the keyword arguments ready and calls the kernel through Triton.
"""
from __future__ import annotations

import ctypes
import numbers
from dataclasses import dataclass
from functools import lru_cache

import torch

from .. import _kernels
from ..aot.abi import ARG_KINDS, ARG_WORDS, BskArg

__all__ = ["Operand", "Descriptor", "KernelLaunch", "Mismatch", "AotLaunch", "JitLaunch", "prepare", "Plans",
           "library", "device_info", "DeviceInfo"]


#: torch dtypes by Triton's names (what a compiled spec's parameter types say).
TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
                torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
                torch.bool: "i1"}


@dataclass(frozen=True)
class Operand:
    """The data pointer of the call's ``index``-th tensor, of ``dtype`` (the plan's)."""

    index: int
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class Descriptor:
    """A tensor descriptor over the call's ``index``-th tensor: ``shape`` and ``strides`` (in
    elements, outermost first) fixed by the plan, ``block`` the tile it moves."""

    index: int
    shape: tuple
    strides: tuple
    block: tuple
    dtype: torch.dtype | None = None


@dataclass(frozen=True, eq=False)
class KernelLaunch:
    """One launch of ``kernel`` over ``grid``: ``args`` by parameter name (fixed values,
    :class:`Operand` or :class:`Descriptor`), ``constexprs`` and compile options; ``zero``: the
    call's tensors (by position; sizes a multiple of 4 bytes) zero-filled just before the kernel,
    e.g. float32 buffers that atomics add into."""

    kernel: object
    grid: tuple
    args: dict
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 3
    zero: tuple = ()

    @property
    def kernel_name(self):
        return getattr(self.kernel, "__name__", None) or self.kernel.fn.__name__


class Mismatch(ValueError):
    """A compiled spec cannot serve a launch (the message says what differs)."""


@dataclass(frozen=True)
class DeviceInfo:
    arch: int   # 10 * major + minor
    sms: int


@lru_cache(maxsize=None)
def device_info(index):
    """Compute capability and SM count of CUDA device ``index``, read once."""
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(10 * props.major + props.minor, props.multi_processor_count)


def library():
    """The kernel library to launch from, or None (see :mod:`blocksparse._kernels`)."""
    return _kernels.load()


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _stream(index):
    """The current CUDA stream of device ``index`` as an integer handle."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


class JitLaunch:
    """Runs a :class:`KernelLaunch` through Triton (any GPU, or Triton's CPU interpreter)."""

    path = "jit"

    def __init__(self, launch: KernelLaunch, reason=None):
        self.launch = launch
        self.reason = reason  # why not ahead of time
        self._fixed = {**{k: v for k, v in launch.args.items() if not isinstance(v, (Operand, Descriptor))},
                       **launch.constexprs, "num_warps": launch.num_warps, "num_stages": launch.num_stages}
        self._operands = [(k, v.index) for k, v in launch.args.items() if isinstance(v, Operand)]
        self._descriptors = [(k, v) for k, v in launch.args.items() if isinstance(v, Descriptor)]
        self._empty = 0 in launch.grid
        self._run = None

    def kwargs(self, tensors):
        """The keyword arguments of the Triton call on ``tensors``."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        kwargs = dict(self._fixed)
        for name, index in self._operands:
            kwargs[name] = tensors[index]
        for name, d in self._descriptors:
            kwargs[name] = TensorDescriptor(tensors[d.index], list(d.shape), list(d.strides), list(d.block))
        return kwargs

    def __call__(self, tensors):
        for index in self.launch.zero:
            tensors[index].zero_()
        if self._empty:
            return
        if self._run is None:
            self._run = self.launch.kernel[self.launch.grid]
        self._run(**self.kwargs(tensors))


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _element_type(param):
    """Triton's element type of a pointer or descriptor parameter: ``"*bf16"`` /
    ``"tensordesc<bf16[64, 32]>"`` -> ``"bf16"``."""
    ty = param["type"]
    return ty[1:] if ty.startswith("*") else ty[len("tensordesc<"):ty.index("[")]


def _block(param):
    """The block of a descriptor parameter's type: ``"tensordesc<bf16[64, 32]>"`` -> ``(64, 32)``
    (what the kernel loads; Triton may encode the tensor map with a narrower box and load it in
    several steps, which the launch need not know)."""
    ty = param["type"]
    return tuple(int(d) for d in ty[ty.index("[") + 1:ty.index("]")].split(","))


def _check_dtype(name, param, dtype):
    if dtype is not None and TRITON_TYPES.get(dtype) != _element_type(param):
        raise Mismatch(f"{name}: the spec takes {param['type']}, the launch {dtype}")


def _check_fixed(name, param, value):
    """The ``bsk_arg`` fields of a fixed argument, or :class:`Mismatch`."""
    kind = param["kind"]
    if kind == "ptr" and value is None:  # a pointer the launch never reads (e.g. another mode's scratch)
        return 0
    if kind == "ptr" and isinstance(value, torch.Tensor):
        _check_dtype(name, param, value.dtype)
        pointer = value.data_ptr()
        if param["divisible"] and pointer % 16:
            raise Mismatch(f"{name} is not 16-byte aligned")
        return pointer
    if kind in ("i32", "i64") and _is_int(value):
        bits = 31 if kind == "i32" else 63
        if not -2**bits <= value < 2**bits:
            raise Mismatch(f"{name} = {value} does not fit in {kind}")
        if param["divisible"] and value % 16:
            raise Mismatch(f"{name} = {value} is not a multiple of 16")
        return int(value)
    if kind == "f32" and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise Mismatch(f"{name} must be a {kind} argument; the launch gives {type(value).__name__}")


def _match(launch: KernelLaunch, spec):
    """Raise :class:`Mismatch` unless ``spec`` (a manifest record) was compiled for ``launch``."""
    if spec["kernel"] != launch.kernel_name:
        raise Mismatch(f"the spec compiles {spec['kernel']}, the launch runs {launch.kernel_name}")
    for option in ("num_warps", "num_stages"):
        if spec[option] != getattr(launch, option):
            raise Mismatch(f"{option}: the spec has {spec[option]}, the launch {getattr(launch, option)}")
    params = {p["name"] for p in spec["params"]}
    given = {**launch.args, **launch.constexprs}
    for name, value in spec["constexprs"].items():
        if name not in given or given[name] != value:
            raise Mismatch(f"{name}: the spec was compiled with {value!r}, the launch gives {given.get(name)!r}")
    unknown = set(given) - params - set(spec["constexprs"])
    if unknown:
        raise Mismatch(f"the launch gives {sorted(unknown)}, which the spec neither takes nor fixes")
    for p in spec["params"]:
        if p["name"] not in launch.args:
            raise Mismatch(f"{p['name']}: the spec takes it, the launch does not give it")
        value = launch.args[p["name"]]
        if isinstance(value, Descriptor):
            if p["kind"] != "tensor" or len(value.shape) != p["rank"] or tuple(value.block) != _block(p):
                raise Mismatch(f"{p['name']}: the spec takes {p['type']}, the launch a descriptor of block "
                               f"{value.block}")
            _check_dtype(p["name"], p, value.dtype)
        elif isinstance(value, Operand):
            if p["kind"] != "ptr":
                raise Mismatch(f"{p['name']}: the spec takes a {p['kind']}, the launch a tensor")
            _check_dtype(p["name"], p, value.dtype)
        elif p["kind"] == "tensor":
            raise Mismatch(f"{p['name']}: the spec takes a tensor descriptor, the launch {value!r}")
        else:
            _check_fixed(p["name"], p, value)


class AotLaunch:
    """Runs a :class:`KernelLaunch` with a compiled spec of the kernel library: one ``bsk_launch``
    call per launch, its arguments packed once (raises :class:`Mismatch` if the spec cannot)."""

    path = "aot"
    reason = None

    def __init__(self, launch: KernelLaunch, kernels, spec_index, device_index):
        spec = kernels.specs[spec_index]
        _match(launch, spec)
        self.launch, self.kernels, self.spec_index, self.device_index = launch, kernels, spec_index, device_index
        params = spec["params"]
        self.args = (BskArg * max(1, len(params)))()
        self._keep = []  # fixed tensors whose addresses the arguments hold
        slots = []
        for i, p in enumerate(params):
            value, arg = launch.args[p["name"]], self.args[i]
            arg.kind = ARG_KINDS[p["kind"]]
            if isinstance(value, Descriptor):
                arg.rank = len(value.shape)
                for d, (size, stride) in enumerate(zip(value.shape, value.strides)):
                    arg.shape[d], arg.strides[d] = size, stride
                slots.append((i * ARG_WORDS + 1, value.index))
            elif isinstance(value, Operand):
                slots.append((i * ARG_WORDS + 1, value.index))
            elif p["kind"] == "ptr":
                arg.value.ptr = _check_fixed(p["name"], p, value)
                self._keep.append(value)
            else:
                setattr(arg.value, p["kind"], _check_fixed(p["name"], p, value))
        self.slots = tuple(slots)
        self.grid = (ctypes.c_uint * 3)(*launch.grid, *(1,) * (3 - len(launch.grid)))
        self._words = memoryview(self.args).cast("B").cast("Q")
        # everything the ctypes call takes, ready (kernels.raw_launch converts nothing)
        self._stream = ctypes.c_void_p()
        self._message = ctypes.create_string_buffer(1024)
        self._raw = kernels.raw_launch
        self._argv = (spec_index, ctypes.byref(self.grid), ctypes.byref(self.args), len(params), self._stream,
                      self._message, len(self._message))
        self._zero = tuple(launch.zero)
        self._memset = kernels.raw_memset32

    def __call__(self, tensors):
        words = self._words
        for word, index in self.slots:
            words[word] = tensors[index].data_ptr()
        device = self.device_index
        if _current_device is not None and _current_device() != device:
            with torch.cuda.device(device):  # the NULL stream launches in the current context
                return self._launch(device, tensors)
        self._launch(device, tensors)

    def _launch(self, device, tensors):
        stream = self._stream.value = _stream(device)
        for index in self._zero:  # in the runtime: no torch op (and its dispatch) for a fill
            t = tensors[index]
            status = self._memset(t.data_ptr(), 0, t.numel() * t.element_size() // 4, stream, self._message, 1024)
            if status:
                self.kernels.check(status, self._message)
        status = self._raw(*self._argv)
        if status:
            self.kernels.check(status, self._message)


def prepare(launch: KernelLaunch, device_index, kernels=None, spec_index=None):
    """The runner of ``launch``: :class:`AotLaunch` with ``spec_index`` of ``kernels`` where that
    spec serves it, else :class:`JitLaunch` (its ``reason`` says why not ahead of time)."""
    if kernels is None or spec_index is None:
        return JitLaunch(launch, "no compiled spec for this launch")
    try:
        return AotLaunch(launch, kernels, spec_index, device_index)
    except Mismatch as exc:
        return JitLaunch(launch, f"{kernels.specs[spec_index]['name']}: {exc}")


class Plans:
    """A family's prepared launches, kept by call shape (the oldest half dropped past ``limit``).

    ``find(kernels, arch, launch, *extra)`` names the compiled spec that may serve a launch (its
    index in ``kernels``, or None); :func:`prepare` then checks it argument by argument, and
    Triton's JIT runs what no spec serves (other GPUs, the CPU interpreter)."""

    def __init__(self, find, limit=512):
        self.find, self.limit, self._plans = find, limit, {}

    def runners(self, key, device, describe, *extra):
        """The runners of call shape ``key`` on ``device`` (``describe()`` lists its launches the
        first time)."""
        found = self._plans.get(key)
        if found is None:
            found = tuple(self.prepare(launch, device, *extra) for launch in describe())
            if len(self._plans) >= self.limit:
                for old in list(self._plans)[:self.limit // 2]:
                    del self._plans[old]
            self._plans[key] = found
        return found

    def prepare(self, launch, device, *extra):
        """The runner of ``launch`` on ``device``: the kernel library's spec where one serves it."""
        if device.type != "cuda":
            return JitLaunch(launch, "not a CUDA tensor")
        index = device.index if device.index is not None else torch.cuda.current_device()
        return self.prepare_on(launch, library(), device_info(index).arch, index, *extra)

    def prepare_on(self, launch, kernels, arch, index, *extra):
        """The runner of ``launch`` on GPU ``index`` of ``sm_{arch}`` with the library ``kernels``
        (or None)."""
        spec = None if kernels is None else self.find(kernels, arch, launch, *extra)
        return prepare(launch, index, kernels, spec)
