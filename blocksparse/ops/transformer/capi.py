"""ctypes view of the transformer family's C entry points (``src/ops/transformer.h``) in a kernel
library: what the TensorFlow ops call, for the tests and GPU checks."""
from __future__ import annotations

import ctypes

from ...aot.abi import KernelLibrary
from ..norms.capi import DTYPES

__all__ = ["DTYPES", "PRODUCTS", "TransformerCall", "TransformerRuntime"]

#: ``BSK_BST_*``
PRODUCTS = {"nt": 0, "nn": 1, "tn": 2, "softmax": 3, "softmax_grad": 4}


class TransformerCall(ctypes.Structure):
    """``bsk_transformer_call`` (see transformer.h for the fields)."""

    _fields_ = [(name, ctypes.c_int32) for name in ("product", "dtype", "block_size", "masked", "autoregress",
                                                    "ar_key")] + \
               [(name, ctypes.c_int64) for name in ("batch", "heads", "lut_heads", "blocks", "q_blocks", "k_blocks",
                                                    "features")] + [("scale", ctypes.c_float)] + \
               [(name, ctypes.c_uint64) for name in ("a", "b", "out", "coords", "row_offsets", "col_offsets",
                                                     "col_blocks", "mask_index", "mask_bits")]


class TransformerRuntime:
    """The transformer entry points of ``library`` (a :class:`KernelLibrary` or its path)."""

    def __init__(self, library):
        self.library = library if isinstance(library, KernelLibrary) else KernelLibrary(library)
        self.specs = self.library.specs
        lib = self.library.library
        pointer = ctypes.POINTER(TransformerCall)
        self._select = lib("bsk_transformer_select", (ctypes.c_int, [pointer, ctypes.c_int]))
        self._run = lib("bsk_transformer_run", (ctypes.c_int, [pointer, ctypes.c_void_p, ctypes.c_char_p,
                                                               ctypes.c_size_t]))

    def select(self, call, arch):
        """Index of the spec serving ``call`` (a :class:`TransformerCall`) on ``sm_{arch}``, or -1."""
        return self._select(ctypes.byref(call), arch)

    def run(self, call, stream=0):
        """Run ``call`` on ``stream`` (an int CUstream handle); raise ``KernelError``."""
        message = ctypes.create_string_buffer(1024)
        self.library.check(self._run(ctypes.byref(call), stream, message, 1024), message)
