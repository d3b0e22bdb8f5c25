"""An implementation of the three products of the block-sparse matmul, as one record."""
from dataclasses import dataclass
from typing import Callable

from . import reference

__all__ = ["Products", "REFERENCE"]


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
