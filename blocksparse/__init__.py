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

#: Names the original package exported at its top level, imported (with their framework) on first use.
_LAZY = {"BlocksparseTransformer": "transformer"}


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
