"""The one place that decides which implementation computes the three products.

Every caller (the forward op, its gradient, :func:`blocksparse.matmul.group_param_grads`) asks
:func:`select` and uses the :class:`Products` it gets, so a choice made when an op is built holds
for its gradient too.  Today there is one implementation, the reference path.  The compiled GPU
op library (custom ops ``BlocksparseMatmul``, ``BlocksparseMatmulDX``, ``BlocksparseMatmulDW``
reading the layout core's lookup tables) will be chosen here, on a GPU, when it is loaded.
"""
from dataclasses import dataclass
from typing import Callable

from .. import _env
from . import reference

__all__ = ["BackendUnavailableError", "Products", "REFERENCE", "select"]


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


def select(layout, axis, dtype):
    """The implementation for a product of ``layout`` on ``axis`` with inputs of ``dtype``.

    Honours ``BLOCKSPARSE_BACKEND`` (see :mod:`blocksparse._env`): ``auto`` and ``reference``
    give the reference path; ``triton`` needs the compiled TensorFlow op library.
    """
    del layout, axis, dtype  # the GPU path will look at them; the reference path takes anything
    choice = _env.backend()
    if choice == "triton":
        raise BackendUnavailableError(
            "BLOCKSPARSE_BACKEND=triton asks for the compiled TensorFlow op library (the GPU "
            "kernels), which is not available in this installation of blocksparse. Unset "
            "BLOCKSPARSE_BACKEND, or set it to 'auto' or 'reference', to use the reference path "
            "(TensorFlow ops only).")
    return REFERENCE
