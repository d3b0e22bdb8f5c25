"""The one place that decides which implementation computes the three products.

Every caller (the forward op, its gradient, :func:`blocksparse.matmul.group_param_grads`) asks
:func:`select` and uses the :class:`Products` it gets, so a choice made when an op is built holds
for its gradient too.  Two implementations: the reference path (TensorFlow ops, anywhere) and
the GPU path (the compiled op library's ``BlocksparseMatmul``, ``BlocksparseMatmulDX``,
``BlocksparseMatmulDW``, launching the kernels compiled ahead of time; :mod:`.gpu`, :mod:`.ops`).
"""
import warnings
from dataclasses import dataclass
from typing import Callable

from .. import _env
from ..kernels.configs import KERNEL_BLOCK_SIZES
from . import reference, tf

__all__ = ["BackendUnavailableError", "Products", "REFERENCE", "select"]

_KERNEL_DTYPES = (tf.float16, tf.bfloat16, tf.float32)
_warned_archs = set()


class BackendUnavailableError(RuntimeError):
    """``BLOCKSPARSE_BACKEND`` asks for an implementation this installation cannot provide."""


@dataclass(frozen=True)
class Products:
    """An implementation of the three products (signatures as in :mod:`.reference`).

    ``fprop(x, w, layout, axis) -> y``; ``bprop(dy, w, layout, axis) -> dx``;
    ``updat(x, dy, layout, axis, dw_dtype) -> dw``.
    """

    name: str
    fprop: Callable
    bprop: Callable
    updat: Callable


REFERENCE = Products("reference", reference.fprop, reference.bprop, reference.updat)


def _unavailable(why):
    return BackendUnavailableError(
        f"BLOCKSPARSE_BACKEND=triton asks for the GPU kernels (the compiled TensorFlow op "
        f"library), which cannot serve here: {why}. Unset BLOCKSPARSE_BACKEND, or set it to "
        "'auto' or 'reference', to use the reference path (TensorFlow ops only).")


def _no_gpu_here(gpu, arch):
    """Why ops built now cannot run on a GPU, or None."""
    if arch is None:
        return "TensorFlow sees no GPU"
    if gpu.in_xla():
        return "XLA (jit_compile=True) cannot run custom ops"
    if gpu.cpu_requested():
        return "the ops are placed on the CPU (a tf.device scope)"
    return None


def select(layout, axis, dtype):
    """The implementation for a product of ``layout`` on ``axis`` with inputs of ``dtype``.

    Honours ``BLOCKSPARSE_BACKEND`` (see :mod:`blocksparse._env`): ``reference`` always gives the
    reference path, and the op library is then never loaded; ``auto`` gives the GPU path where
    TensorFlow sees a GPU the library has kernels for (outside XLA and CPU device scopes), else the
    reference path -- with one warning when the library cannot be used; ``triton`` insists on the
    GPU path and raises :class:`BackendUnavailableError` where it cannot serve.  Block size 8
    always takes the reference path (the kernels start at 16), as in the PyTorch frontend.
    """
    choice = _env.backend()
    if (choice == "reference" or layout.block_size not in KERNEL_BLOCK_SIZES
            or tf.as_dtype(dtype) not in _KERNEL_DTYPES):
        return REFERENCE
    from . import gpu, ops

    arch = gpu.device_arch()
    why_not = _no_gpu_here(gpu, arch)
    if why_not:  # the library is not even loaded: it could not serve
        if choice == "auto":
            return REFERENCE
        raise _unavailable(why_not)
    library = ops.library(warn=choice == "auto")
    if library is None:
        if choice == "triton":
            raise _unavailable(f"the op library is not used: {ops.unavailable_reason()}")
        return REFERENCE
    products = gpu.products(library, arch, layout, axis, dtype)
    if products is None:
        archs = ", ".join(f"sm_{a}" for a in library.archs)
        why = (f"{library.path} has no kernels for this GPU (sm_{arch}) and "
               f"{tf.as_dtype(dtype).name} blocks of {layout.block_size} on axis {axis}; it was "
               f"built for {archs}")
        if choice == "triton":
            raise _unavailable(why)
        if arch not in _warned_archs:
            _warned_archs.add(arch)
            warnings.warn(f"blocksparse: the reference path (TensorFlow ops) computes the products: "
                          f"{why}", ops.OpLibraryWarning, stacklevel=3)
        return REFERENCE
    return products
