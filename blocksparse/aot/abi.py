"""ctypes view of the kernel runtime's C API (``src/runtime/bsk.h``): the kernel library as the
PyTorch launch layer, the tests and the GPU verification script use it.  Framework-neutral, and
cheap to import (no Triton, no compiler)."""
from __future__ import annotations

import ctypes
import json

from .targets import BuiltImages

__all__ = ["ABI_VERSION", "ARG_KINDS", "MAX_RANK", "BskArg", "KernelLibrary", "KernelError", "STATUS"]

#: Must equal BSK_ABI_VERSION of the library loaded.
ABI_VERSION = 3
#: Argument kinds (BSK_ARG_*), by the names of :class:`blocksparse.aot.compile.Param`.
ARG_KINDS = {"ptr": 1, "i32": 2, "i64": 3, "f32": 4, "tensor": 5}
MAX_RANK = 5
STATUS = {1: "invalid call", 2: "unsupported", 3: "no driver", 4: "CUDA error"}
#: Words (8 bytes) of one :class:`BskArg`: kind and rank, value, shape, strides.
ARG_WORDS = 2 + 2 * MAX_RANK


class _Value(ctypes.Union):
    _fields_ = [("ptr", ctypes.c_uint64), ("i64", ctypes.c_int64), ("i32", ctypes.c_int32),
                ("f32", ctypes.c_float)]


class BskArg(ctypes.Structure):
    """``bsk_arg``: one kernel argument (see bsk.h)."""

    _fields_ = [("kind", ctypes.c_int32), ("rank", ctypes.c_int32), ("value", _Value),
                ("shape", ctypes.c_int64 * MAX_RANK), ("strides", ctypes.c_int64 * MAX_RANK)]


assert ctypes.sizeof(BskArg) == 8 * ARG_WORDS  # the launch layer writes arguments as 8-byte words


class KernelError(RuntimeError):
    """A runtime call failed; ``status`` is its BSK_ERR_* code."""

    def __init__(self, status, message):
        super().__init__(f"{STATUS.get(status, status)}: {message}")
        self.status = status


_SIGNATURES = (
    ("bsk_abi_version", ctypes.c_int, []),
    ("bsk_spec_count", ctypes.c_int, []),
    ("bsk_manifest", ctypes.c_char_p, []),
    ("bsk_spec_key", ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64),
                                    ctypes.POINTER(ctypes.c_char_p)]),
    ("bsk_arch_rank", ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    ("bsk_spec_rank", ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
    ("bsk_arch_shared_limit", ctypes.c_int, [ctypes.c_int]),
    ("bsk_spec_image", ctypes.c_int, [ctypes.c_int]),
    ("bsk_device", ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                  ctypes.c_char_p, ctypes.c_size_t]),
    ("bsk_launch", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_uint * 3), ctypes.POINTER(BskArg),
                                  ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    ("bsk_memset32", ctypes.c_int, [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p,
                                    ctypes.c_char_p, ctypes.c_size_t]),
    ("bsk_upload", ctypes.c_int, [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                  ctypes.c_char_p, ctypes.c_size_t]),
)


#: Fields a library built before them does not record, and what they read as there.
_FIELD_DEFAULTS = {"pack": 1}


def _field(spec, key, wanted):
    """``spec[key]``; a missing boolean flag (a library built before it) reads as False, a missing
    field of :data:`_FIELD_DEFAULTS` as its default."""
    return spec.get(key, False if isinstance(wanted, bool) else _FIELD_DEFAULTS.get(key))


class KernelLibrary(BuiltImages):
    """A loaded kernel library (``_kernels.so``, or a library linked against it).

    ``specs``: the manifest's record of every spec, in the runtime's order (the index is what
    :meth:`launch` takes); each has ``family``, ``name``, ``arch``, ``image`` (``"cubin"`` or
    ``"ptx"``), ``target`` (``"sm_80"``, ``"sm_90a"``, ``"compute_80"``), ``params`` (the arguments in
    order: name, kind, divisible, rank), ``constexprs``, ``tensormaps`` and its family's fields.
    """

    def __init__(self, path):
        self.path = str(path)
        lib = ctypes.CDLL(self.path)
        for name, res, args in _SIGNATURES:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self._lib = lib
        if lib.bsk_abi_version() != ABI_VERSION:
            raise KernelError(1, f"{self.path} has runtime ABI {lib.bsk_abi_version()}; this module "
                                 f"speaks {ABI_VERSION}")
        self.manifest = json.loads(lib.bsk_manifest().decode())
        self.specs = self.manifest["specializations"]
        if len(self.specs) != lib.bsk_spec_count():
            raise KernelError(1, f"{self.path}: the manifest lists {len(self.specs)} kernels, the table "
                                 f"{lib.bsk_spec_count()}")
        # The launch layer's entry: no argument conversion (a third of the cost of a ctypes call;
        # it passes ints, byref()s of its prebuilt arrays, a c_void_p stream and a buffer), and
        # the GIL held, so no other thread rewrites an argument array while the runtime reads it.
        python_dll = ctypes.PyDLL(self.path)
        self.raw_launch = python_dll.bsk_launch
        self.raw_launch.restype = ctypes.c_int
        self.raw_memset32 = python_dll.bsk_memset32  # the launch layer's fills (typed: rare enough)
        self.raw_memset32.restype, self.raw_memset32.argtypes = lib.bsk_memset32.restype, lib.bsk_memset32.argtypes

    def library(self, name, signatures):
        """This library's function ``name`` with ``signatures`` ``(restype, argtypes)`` set (a
        family's own C entry points)."""
        fn = getattr(self._lib, name)
        fn.restype, fn.argtypes = signatures
        return fn

    def address(self, name):
        """The address of this library's exported function ``name`` (for native code that calls it)."""
        return ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value

    def key(self, spec, name):
        """Key ``name`` of spec ``spec`` as the C table holds it: an int, a str, or None."""
        value, text = ctypes.c_int64(), ctypes.c_char_p()
        if not self._lib.bsk_spec_key(spec, name.encode(), ctypes.byref(value), ctypes.byref(text)):
            return None
        return text.value.decode() if text.value is not None else value.value

    def arch_rank(self, compiled, image, arch):
        """The runtime's ``bsk_arch_rank``: how well ``image`` (``BSK_IMAGE_*``, see
        :mod:`.targets`) compiled for ``compiled`` serves ``sm_{arch}``; 0: not at all."""
        return self._lib.bsk_arch_rank(compiled, image, arch)

    def shared_limit(self, arch):
        """``bsk_arch_shared_limit``: shared memory (bytes) one block may use on ``sm_{arch}``."""
        return self._lib.bsk_arch_shared_limit(arch)

    def rank(self, spec, arch):
        """``bsk_spec_rank``: how well spec ``spec`` serves ``sm_{arch}`` (0: it cannot run there, or
        needs more shared memory than :meth:`shared_limit`)."""
        return self._lib.bsk_spec_rank(spec, arch)

    def find(self, family, arch, **fields):
        """Index of the spec of ``family`` with these ``fields`` that serves ``sm_{arch}`` best (a
        cubin over PTX, the newest compiled arch first: :meth:`rank`), or None.  A flag a library
        built before it existed does not record reads as False."""
        ranks = {i: self.rank(i, arch) for i, s in enumerate(self.specs)
                 if s["family"] == family and all(_field(s, k, v) == v for k, v in fields.items())}
        best = max(ranks, key=ranks.get, default=None)
        return best if best is not None and ranks[best] else None

    @staticmethod
    def check(status, message):
        """Raise :class:`KernelError` for a failed call's ``status`` and message buffer."""
        if status:
            raise KernelError(status, message.value.decode(errors="replace"))

    def device(self, stream=0):
        """``(arch, SMs)`` of the GPU of ``stream`` (an int CUstream handle)."""
        arch, sms, message = ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(1024)
        self.check(self._lib.bsk_device(stream, ctypes.byref(arch), ctypes.byref(sms), message, 1024), message)
        return arch.value, sms.value

    def launch(self, spec, grid, args, stream=0):
        """Launch ``spec`` over ``grid`` with ``args`` (a sequence of :class:`BskArg`)."""
        message = ctypes.create_string_buffer(1024)
        array = (BskArg * max(1, len(args)))(*args)
        self.check(self.raw_launch(spec, (ctypes.c_uint * 3)(*grid), array, len(args), stream, message, 1024),
                   message)

    def memset32(self, address, value, count, stream=0):
        """Fill ``count`` 32-bit words at ``address`` with ``value`` on ``stream``."""
        message = ctypes.create_string_buffer(1024)
        self.check(self._lib.bsk_memset32(address, value, count, stream, message, 1024), message)

    def upload(self, address, source, stream=0):
        """Copy the bytes of ``source`` (a contiguous numpy array) to the device ``address`` on
        ``stream``."""
        message = ctypes.create_string_buffer(1024)
        self.check(self._lib.bsk_upload(address, source.ctypes.data or None, source.nbytes, stream, message, 1024),
                   message)
