"""Serving a block size the kernels do not take by refining the layout.

A block of ``bs = r * s`` (``s`` a block size the kernels take, e.g. 48 = 3 x 16, 256 = 2 x 128) is
``r x r`` blocks of ``s``: the *refined* layout sets block ``(c*r + i, k*r + j)`` for every
``i, j < r`` of every block ``(c, k)``, and describes the same dense weight.  It is numbered block
by block of the coarse layout -- fine block ``b*r*r + i*r + j`` is part ``(i, j)`` of coarse block
``b`` -- so the packed weight is re-blocked by one transposing copy (no gather, no arithmetic)::

    w_fine = w.reshape(blocks, r, s, r, s).transpose(0, 1, 3, 2, 4).reshape(blocks * r * r, s, s)

and ``refined.dense(w_fine) == layout.dense(w)`` exactly; gradients flow back through the same
ops.  The parameter keeps the user's block size (one storage format whatever runs it).  Better
still, a *packed* refinement (``refine(..., packed=True)``: ``Layout.packing = r``) needs no copy:
fine block ``f`` is rows ``(f // r) * s ..`` and columns ``(f % r) * s ..`` of the coarse weight
viewed as ``(blocks * r * s, r * s)``, and the kernels read (fprop, bprop) and write (updat) it
there (their ``PACK`` constant; ``tests``: ``refined.dense(w) == layout.dense(w)``).  A refined
structured layout also groups well: the ``r`` fine columns of one block column have the same rows,
so output groups of ``G <= r`` adjacent columns carry no empty slots
(:mod:`blocksparse.ops.matmul.grouping`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...layout import BLOCK_SIZES, Layout

__all__ = ["Refinement", "refine", "refined_block_size"]


def refined_block_size(block_size, sizes=BLOCK_SIZES):
    """The largest of ``sizes`` that divides ``block_size`` (the block size itself when it is one
    of them), or None.

    >>> refined_block_size(48, (16, 32, 64, 128)), refined_block_size(256), refined_block_size(3)
    (16, 128, None)
    """
    fits = [s for s in sizes if block_size % s == 0]
    return max(fits) if fits else None


@dataclass(frozen=True)
class Refinement:
    """A layout of block size ``factor * layout.block_size`` described by ``layout`` (numbered
    coarse block by coarse block: see the module docstring)."""

    layout: Layout
    factor: int


def refine(layout, block_size, *, packed=False):
    """The :class:`Refinement` of ``layout`` into blocks of ``block_size`` (a divisor).  ``packed``:
    the refined layout addresses its weight in the coarse storage itself (``packing = factor``:
    the kernels read and write each part in place, no re-blocking copies)."""
    bs = layout.block_size
    if block_size < 1 or bs % block_size:
        raise ValueError(f"block_size must divide the layout's block size {bs}; got {block_size}")
    r = bs // block_size
    mask = np.repeat(np.repeat(layout.mask, r, axis=0), r, axis=1)
    c, k = layout.coords[:, 0], layout.coords[:, 1]
    i, j = np.divmod(np.arange(r * r), r)
    # coarse block b, part (i, j): fine block b*r*r + i*r + j at (c*r + i, k*r + j)
    coords = np.stack([(c[:, None] * r + i[None, :]).ravel(), (k[:, None] * r + j[None, :]).ravel()], axis=1)
    fine = Layout.numbered(mask, block_size, coords, any_block_size=block_size not in BLOCK_SIZES,
                           packing=r if packed else 1)
    return Refinement(fine, r)

