"""ctypes view of the norms and LSTM families' C entry points (``src/ops/norms.h``) in a kernel
library: what the TensorFlow ops call, for the tests and GPU checks."""
from __future__ import annotations

import ctypes

from ...aot.abi import KernelLibrary

__all__ = ["DTYPES", "LayerNormCall", "LstmGatesCall", "NormsRuntime"]

DTYPES = {"fp16": 0, "bf16": 1, "fp32": 2}


class LayerNormCall(ctypes.Structure):
    """``bsk_layer_norm_call`` (see norms.h for the fields)."""

    _fields_ = [(name, ctypes.c_int32) for name in ("dtype", "axis", "relu", "segments")] + \
               [(name, ctypes.c_int64) for name in ("n_tokens", "features")] + [("epsilon", ctypes.c_float)] + \
               [(name, ctypes.c_uint64) for name in
                ("x", "g", "b", "y", "mean", "rstd", "dy", "dx", "dg", "db", "workspace")] + \
               [("params", ctypes.c_int32)]


class LstmGatesCall(ctypes.Structure):
    """``bsk_lstm_gates_call`` (see norms.h for the fields)."""

    _fields_ = [(name, ctypes.c_int32) for name in ("dtype", "merged")] + \
               [(name, ctypes.c_int64) for name in ("n_tokens", "features")] + [("forget_bias", ctypes.c_float)] + \
               [(name, ctypes.c_uint64) for name in
                ("c", "i", "j", "f", "o", "bias", "c_next", "h_next", "dc_next", "dh_next", "dc", "di", "dj",
                 "df", "d_o", "dbias", "workspace")] + \
               [("params", ctypes.c_int32)]


class NormsRuntime:
    """The layer-norm and LSTM-gate entry points of ``library`` (a :class:`KernelLibrary` or its path)."""

    def __init__(self, library):
        self.library = library if isinstance(library, KernelLibrary) else KernelLibrary(library)
        self.specs = self.library.specs
        lib = self.library.library
        self._select, self._workspace, self._run = {}, {}, {}
        for which, call in (("layer_norm", LayerNormCall), ("lstm_gates", LstmGatesCall)):
            pointer = ctypes.POINTER(call)
            self._select[which] = lib(f"bsk_{which}_select", (ctypes.c_int, [pointer, ctypes.c_int, ctypes.c_int]))
            self._workspace[which] = lib(f"bsk_{which}_workspace", (ctypes.c_int, [
                pointer, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]))
            self._run[which] = lib(f"bsk_{which}_run", (ctypes.c_int, [
                pointer, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]))
        self._sum_rows_select = lib("bsk_sum_rows_select", (ctypes.c_int, [
            ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]))

    @staticmethod
    def _which(call):
        return "layer_norm" if isinstance(call, LayerNormCall) else "lstm_gates"

    def select(self, call, backward, arch):
        """Index of the spec serving ``call`` (a :class:`LayerNormCall` or :class:`LstmGatesCall`)
        on ``sm_{arch}``, or -1."""
        return self._select[self._which(call)](ctypes.byref(call), int(backward), arch)

    def select_sum_rows(self, family, arch, out_dtype, has_b, rows, columns):
        """Index of the spec that sums ``rows`` partial rows of ``columns`` for ``family`` (``out_dtype``
        a key of :data:`DTYPES`), or -1."""
        return self._sum_rows_select(family.encode(), arch, DTYPES[out_dtype], int(has_b), rows, columns)

    def workspace(self, call, stream=0):
        """Bytes the backward of ``call`` needs in ``call.workspace`` on ``stream``'s GPU."""
        size, message = ctypes.c_size_t(), ctypes.create_string_buffer(1024)
        self.library.check(self._workspace[self._which(call)](ctypes.byref(call), stream, ctypes.byref(size),
                                                              message, 1024), message)
        return size.value

    def run(self, call, backward, stream=0):
        """Run the forward or backward of ``call`` on ``stream`` (an int CUstream handle); raise
        ``KernelError``."""
        message = ctypes.create_string_buffer(1024)
        self.library.check(self._run[self._which(call)](ctypes.byref(call), int(backward), stream, message, 1024),
                           message)
