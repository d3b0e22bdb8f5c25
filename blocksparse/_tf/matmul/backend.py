"""Which implementation computes the three products of one block-sparse matmul.

Every caller (the forward op, its gradient, :func:`blocksparse.matmul.group_param_grads`) asks
:func:`select` and uses the :class:`~.products.Products` it gets, so a choice made when an op is
built holds for its gradient too.  Two implementations: the reference path (TensorFlow ops,
anywhere) and the GPU path (the compiled op library's ``BlocksparseMatmul``,
``BlocksparseMatmulDX``, ``BlocksparseMatmulDW``; :mod:`.gpu`).
"""
from ...ops.matmul.configs import KERNEL_BLOCK_SIZES
from .. import tf
from ..dispatch import BackendUnavailableError, gpu_library, no_kernels
from .products import REFERENCE, Products

__all__ = ["BackendUnavailableError", "Products", "REFERENCE", "select"]

_KERNEL_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


def select(layout, axis, dtype):
    """The implementation for a product of ``layout`` on ``axis`` with inputs of ``dtype``
    (see :mod:`blocksparse._tf.dispatch` for how ``BLOCKSPARSE_BACKEND`` decides).  Block size 8
    always takes the reference path (the kernels start at 16), as in the PyTorch frontend."""
    eligible = layout.block_size in KERNEL_BLOCK_SIZES and tf.as_dtype(dtype) in _KERNEL_DTYPES
    found = gpu_library(eligible)
    if found is None:
        return REFERENCE
    library, arch = found
    from . import gpu

    products = gpu.products(library, arch, layout, axis, dtype)
    if products is None:
        no_kernels(library, arch, f"{tf.as_dtype(dtype).name} blocks of {layout.block_size} on axis {axis}")
        return REFERENCE
    return products
