"""Which implementation computes the transformer ops of one call.

The frontend asks :func:`select` when it builds an op and uses the :class:`Products` it gets for the
op and its gradient: :data:`REFERENCE` (TensorFlow ops, any device, XLA included) or, on a GPU, the
compiled op library's kernels (:mod:`.gpu`: the Triton kernels of :mod:`blocksparse.ops.transformer`
compiled ahead of time).  The kernels take block sizes 16 to 128, float32, float16 and bfloat16, and
products whose head dimension is a known multiple of 16; other calls take the reference path
silently.  :func:`select` asks :func:`blocksparse._tf.dispatch.gpu_library` with that eligibility
(``BLOCKSPARSE_BACKEND`` as for every family), then whether the library holds the kernels for the
call; where it does not, the reference path serves (one warning per GPU architecture;
``BLOCKSPARSE_BACKEND=triton`` raises :class:`~blocksparse._tf.dispatch.BackendUnavailableError`).
"""
from dataclasses import dataclass
from typing import Callable

from ...ops.transformer.aot import BLOCK_SIZES
from .. import tf
from ..dispatch import gpu_implementation
from . import reference

__all__ = ["Products", "REFERENCE", "eligible", "select"]

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


def eligible(block_size, dtype, head_dim=0):
    """Whether kernels could take the call (see :func:`select`)."""
    return block_size in BLOCK_SIZES and dtype in _KERNEL_DTYPES and head_dim is not None and head_dim % 16 == 0


def select(block_size, dtype, head_dim=0):
    """The implementation for ops on blocks of ``block_size`` with inputs of ``dtype``; ``head_dim``:
    the products' head dimension (None where unknown when the op is built; 0 for the softmax)."""
    from . import gpu

    dtype = tf.as_dtype(dtype)
    what = (f"the block-sparse transformer {f'products of head_dim {head_dim}' if head_dim else 'softmax'} on "
            f"{dtype.name} blocks of {block_size}")
    impl = gpu_implementation(eligible(block_size, dtype, head_dim), what,
                              lambda library, arch: gpu.products(library, arch, block_size, dtype, head_dim))
    return impl or REFERENCE
