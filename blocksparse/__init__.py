"""blocksparse: block-sparse matrix multiplication and friends for TensorFlow and PyTorch.

The public API follows the original OpenAI package: ``blocksparse.matmul.BlocksparseMatMul`` (and
the rest of ``blocksparse.matmul``) for TensorFlow, ``blocksparse.torch`` for PyTorch.  Importing
``blocksparse`` itself imports no framework.  :func:`build_info` describes the build (the compiled
TensorFlow GPU kernels, when this is a platform wheel).
"""
from ._manifest import build_info
from ._version import PATCH as _PATCH  # noqa: F401
from .layout import BLOCK_SIZES, Layout

__all__ = ["BLOCK_SIZES", "Layout", "__version__", "build_info"]

#: Names the original package exported at its top level (those this package has), imported (with
#: their framework) on first use: ``import blocksparse as bs; bs.float_cast(...)`` as its examples do.
_LAZY = {
    **dict.fromkeys(["add", "multiply", "subtract", "divide", "maximum", "minimum", "negative", "reciprocal",
                     "square", "sqrt", "exp", "log", "sigmoid", "tanh", "relu", "elu", "gelu", "swish",
                     "fast_gelu", "float_cast", "dropout", "add_n8"], "ewops"),
    **dict.fromkeys(["fused_lstm_gates", "split4", "concat4"], "lstm"),
    **dict.fromkeys(["BlocksparseMatMul", "SparseProj", "group_param_grads"], "matmul"),
    **dict.fromkeys(["layer_norm", "batch_norm"], "norms"),
    "cwise_linear": "conv",
    **dict.fromkeys(["BlocksparseTransformer", "clear_bst_constants"], "transformer"),
}


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _installed_version():
    from importlib import metadata
    try:
        return metadata.version("blocksparse")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


__version__ = _installed_version()
