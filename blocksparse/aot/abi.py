"""ctypes view of the kernel runtime's C API (``src/runtime/bsk.h``), for the tests and the GPU
verification script; the TensorFlow op library calls the same functions from C++."""
from __future__ import annotations

import ctypes
import json

__all__ = ["ABI_VERSION", "PRODUCTS", "DTYPES", "BskCall", "KernelLibrary", "KernelError"]

#: Must equal BSK_ABI_VERSION of the library loaded.
ABI_VERSION = 1
PRODUCTS = {"fprop": 0, "bprop": 1, "updat": 2}
DTYPES = {"fp16": 0, "bf16": 1, "fp32": 2}
STATUS = {1: "invalid call", 2: "unsupported", 3: "no driver", 4: "CUDA error"}


class BskCall(ctypes.Structure):
    """``bsk_call``: one product (see bsk.h for the fields)."""

    _fields_ = [(name, ctypes.c_int32) for name in
                ("product", "dtype", "block_size", "axis", "group", "split")] + \
               [(name, ctypes.c_int64) for name in
                ("n_tokens", "c_blocks", "k_blocks", "blocks", "table_rows")] + \
               [(name, ctypes.c_uint64) for name in
                ("x", "dy", "w", "y", "dx", "dw", "headers", "entries", "groups")]


class KernelError(RuntimeError):
    """A runtime call failed; ``status`` is its BSK_ERR_* code."""

    def __init__(self, status, message):
        super().__init__(f"{STATUS.get(status, status)}: {message}")
        self.status = status


class KernelLibrary:
    """A loaded runtime library (standalone, or the TensorFlow op library)."""

    def __init__(self, path):
        self.path = str(path)
        lib = ctypes.CDLL(self.path)
        for name, res, args in (
                ("bsk_abi_version", ctypes.c_int, []),
                ("bsk_spec_count", ctypes.c_int, []),
                ("bsk_manifest", ctypes.c_char_p, []),
                ("bsk_select", ctypes.c_int, [ctypes.POINTER(BskCall), ctypes.c_int, ctypes.c_int]),
                ("bsk_updat_split", ctypes.c_int,
                 [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]),
                ("bsk_run", ctypes.c_int,
                 [ctypes.POINTER(BskCall), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
                ("bsk_run_spec", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(BskCall),
                                                ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self._lib = lib
        if lib.bsk_abi_version() != ABI_VERSION:
            raise KernelError(1, f"{self.path} has runtime ABI {lib.bsk_abi_version()}; this "
                                 f"module speaks {ABI_VERSION}")
        self.manifest = json.loads(lib.bsk_manifest().decode())
        self.specs = self.manifest["specializations"]
        if len(self.specs) != lib.bsk_spec_count():
            raise KernelError(1, f"{self.path}: the manifest lists {len(self.specs)} kernels, the "
                                 f"table {lib.bsk_spec_count()}")

    def select(self, call, arch, atomic=False):
        """Index of the spec serving ``call`` on ``sm_{arch}``, or -1."""
        return self._lib.bsk_select(ctypes.byref(call), arch, int(atomic))

    def updat_split(self, spec, n_tokens, table_rows, sms):
        return self._lib.bsk_updat_split(spec, n_tokens, table_rows, sms)

    def _check(self, status, message):
        if status:
            raise KernelError(status, message.value.decode(errors="replace"))

    def run(self, call, stream=0):
        """Run ``call`` on ``stream`` (an int CUstream handle); raise :class:`KernelError`."""
        message = ctypes.create_string_buffer(1024)
        self._check(self._lib.bsk_run(ctypes.byref(call), stream, message, 1024), message)

    def run_spec(self, spec, call, stream=0):
        """Run ``call`` with specialisation ``spec`` (an index into :attr:`specs`)."""
        message = ctypes.create_string_buffer(1024)
        self._check(self._lib.bsk_run_spec(spec, ctypes.byref(call), stream, message, 1024), message)
