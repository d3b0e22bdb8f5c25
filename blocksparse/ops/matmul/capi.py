"""ctypes view of the matmul family's C entry points (``src/ops/matmul.h``) in a kernel library:
what the TensorFlow ops call, for the tests and the GPU verification script."""
from __future__ import annotations

import ctypes

from ...aot.abi import KernelLibrary

__all__ = ["PRODUCTS", "DTYPES", "MatmulCall", "MatmulRuntime"]

PRODUCTS = {"fprop": 0, "bprop": 1, "updat": 2}
DTYPES = {"fp16": 0, "bf16": 1, "fp32": 2}


class MatmulCall(ctypes.Structure):
    """``bsk_matmul_call``: one product (see matmul.h for the fields)."""

    _fields_ = [(name, ctypes.c_int32) for name in
                ("product", "dtype", "block_size", "axis", "group", "split")] + \
               [(name, ctypes.c_int64) for name in
                ("n_tokens", "c_blocks", "k_blocks", "blocks", "table_rows")] + \
               [(name, ctypes.c_uint64) for name in
                ("x", "dy", "w", "y", "dx", "dw", "headers", "entries", "groups")]


_CALL = ctypes.POINTER(MatmulCall)
_MESSAGE = (ctypes.c_char_p, ctypes.c_size_t)


class MatmulRuntime:
    """The matmul entry points of ``library`` (a :class:`KernelLibrary` or its path)."""

    def __init__(self, library):
        self.library = library if isinstance(library, KernelLibrary) else KernelLibrary(library)
        self.specs = self.library.specs
        lib = self.library.library
        self._select = lib("bsk_matmul_select", (ctypes.c_int, [_CALL, ctypes.c_int, ctypes.c_int]))
        self._split = lib("bsk_matmul_updat_split",
                          (ctypes.c_int, [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]))
        self._run = lib("bsk_matmul_run", (ctypes.c_int, [_CALL, ctypes.c_void_p, *_MESSAGE]))
        self._run_spec = lib("bsk_matmul_run_spec", (ctypes.c_int, [ctypes.c_int, _CALL, ctypes.c_void_p,
                                                                    *_MESSAGE]))

    def select(self, call, arch, atomic=False):
        """Index of the spec serving ``call`` on ``sm_{arch}``, or -1."""
        return self._select(ctypes.byref(call), arch, int(atomic))

    def updat_split(self, spec, n_tokens, table_rows, sms):
        return self._split(spec, n_tokens, table_rows, sms)

    def run(self, call, stream=0):
        """Run ``call`` on ``stream`` (an int CUstream handle); raise ``KernelError``."""
        message = ctypes.create_string_buffer(1024)
        self.library.check(self._run(ctypes.byref(call), stream, message, 1024), message)

    def run_spec(self, spec, call, stream=0):
        """Run ``call`` with spec ``spec`` (an index into :attr:`specs`)."""
        message = ctypes.create_string_buffer(1024)
        self.library.check(self._run_spec(spec, ctypes.byref(call), stream, message, 1024), message)
