"""Which implementation computes the transformer ops of one call.

The frontend asks :func:`select` when it builds an op and uses the :class:`Products` it gets for the
op and its gradient.  Today only the reference path (TensorFlow ops) exists; the GPU kernels of
:mod:`blocksparse.ops.transformer` are not compiled into the TensorFlow op library yet, so where
:func:`blocksparse._tf.dispatch.gpu_library` offers the library this says so (a warning, or an
error under ``BLOCKSPARSE_BACKEND=triton``) and the reference path serves.  Registering the kernels
means returning their :class:`Products` here.
"""
from dataclasses import dataclass
from typing import Callable

from ...ops.matmul.configs import KERNEL_BLOCK_SIZES
from .. import tf
from ..dispatch import gpu_library, no_kernels
from . import reference

__all__ = ["Products", "REFERENCE", "select"]

_KERNEL_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


@dataclass(frozen=True)
class Products:
    """An implementation of the ops (signatures as in :mod:`.reference`)."""

    name: str
    nt: Callable
    xn: Callable
    softmax: Callable
    softmax_grad: Callable


REFERENCE = Products("reference", reference.nt, reference.xn, reference.softmax, reference.softmax_grad)


def select(block_size, dtype):
    """The implementation for ops on blocks of ``block_size`` with inputs of ``dtype``."""
    eligible = block_size in KERNEL_BLOCK_SIZES and tf.as_dtype(dtype) in _KERNEL_DTYPES
    found = gpu_library(eligible)
    if found is not None:
        no_kernels(*found, "the block-sparse transformer ops (not compiled into the op library yet)")
    return REFERENCE
