"""Block lists: the lookup tables the fused attention kernels walk (numpy only).

Terms
-----
The layout is a 0/1 array ``(HL, NB, NB)``: ``HL`` layout heads (1: shared by every query head,
else one per query head), ``NB = S // BS`` blocks of ``BS`` tokens along the sequence; block
``(h, i, j)`` lets query block ``i`` attend to key block ``j`` in head ``h``.  ``causal=True``
first drops the blocks above the diagonal (``j > i``).

An attended block is *partial* when some of its elements are masked: a diagonal block under
``causal`` (query ``t`` sees keys ``<= t``), or a block with an element mask (``mask_index >= 0``).
Every other attended block is *full*: the kernels run it without any masking work.

Formats (a contract: the kernels read these bytes; change them only together)
-----------------------------------------------------------------------------
Two directions share one format.  *Rows* (forward and ``dq``): for every query block ``i``, the
key blocks it attends to.  *Columns* (``dk``/``dv``): for every key block ``j``, the query blocks
that attend to it.  ``blk`` below is ``i`` for rows and ``j`` for columns; ``other`` the other one.
All arrays are ``int32``, C-contiguous, read-only.

``headers``  shape ``(HL * NB, 3)``; row ``h * NB + blk``::

    headers[h * NB + blk] = (start, n_full, n_partial)

  The list of ``blk`` in layout head ``h`` is ``entries[start : start + n_full + n_partial]``:
  its ``n_full`` full blocks first, then its ``n_partial`` partial ones, each run in ascending
  ``other``.  Lists are stored one after another in order of ``(h, blk)``; an empty list (a query
  block that attends to nothing: its output rows are zeros) has ``n_full == n_partial == 0``.

``entries``  shape ``(E, 2)``, ``E`` = the number of attended blocks::

    entries[e] = (other, mask)

  ``other`` the block index along the other axis; ``mask`` the row of the element-mask table
  (``masks[mask]``, shape ``(BS, BS)``, indexed ``[query in block, key in block]`` in both
  directions), or ``-1`` (no element mask; always ``-1`` for full blocks).

``order``  shape ``(NB,)``: the order in which programs take the blocks: a permutation of
  ``0 .. NB-1``, most entries (summed over layout heads) first, ties in ascending order.  The
  longest lists start first, so the last wave of programs holds the shortest.

``pair_index(rows, cols)`` ``(E,)``: for every row entry, the index of the same block among the column
entries (the backward's ``dS`` scratch is laid out by column entries; its dq pass walks rows).

Example, ``NB = 2``, ``causal=True``, layout ``[[1, 1], [1, 1]]`` (one head): the block above the
diagonal is dropped, both diagonal blocks are partial::

    rows.headers = [[0, 0, 1], [1, 1, 1]]     rows.entries = [[0, -1], [0, -1], [1, -1]]
    cols.headers = [[0, 1, 1], [2, 0, 1]]     cols.entries = [[1, -1], [0, -1], [1, -1]]
    rows.order = [1, 0]                       cols.order = [0, 1]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BlockList", "block_lists", "pair_index"]


@dataclass(frozen=True)
class BlockList:
    """One direction's tables (rows or columns); the format is in the module docstring."""

    headers: np.ndarray
    entries: np.ndarray
    order: np.ndarray

    @property
    def heads(self):
        """Layout heads ``HL``."""
        return self.headers.shape[0] // self.order.shape[0]

    @property
    def blocks(self):
        """Blocks along the sequence ``NB``."""
        return self.order.shape[0]

    @property
    def max_count(self):
        """The longest list (entries of one block in one head)."""
        return int((self.headers[:, 1] + self.headers[:, 2]).max(initial=0))


def block_lists(layout, causal=False, mask_index=None):
    """The row and column :class:`BlockList` of a layout.

    Parameters
    ----------
    layout : ndarray of bool, shape (HL, NB, NB)
        The block layout (checked by the caller).
    causal : bool
        Drop the blocks above the diagonal; the diagonal blocks become partial.
    mask_index : ndarray of int, shape (HL, NB, NB), optional
        Row of the element-mask table of each block, ``-1`` for none.

    Returns
    -------
    (rows, cols) : tuple of BlockList
    """
    lay = np.asarray(layout, dtype=bool)
    hl, nb, nb_k = lay.shape
    if nb != nb_k:
        raise ValueError(f"layout must be square in its last two axes; got shape {lay.shape}")
    if causal:
        lay = lay & np.tri(nb, dtype=bool)[None]
    mid = np.full(lay.shape, -1, np.int32) if mask_index is None else np.asarray(mask_index, np.int32)
    h, i, j = np.nonzero(lay)
    m = mid[h, i, j]
    partial = (m >= 0) | ((i == j) if causal else False)
    return _direction(h, i, j, m, partial, hl, nb), _direction(h, j, i, m, partial, hl, nb)


def pair_index(rows, cols):
    """``(E,)`` int32: for each entry of ``rows``, the index of the same block among ``cols``' entries."""
    def codes(lists, row_major):
        count = lists.headers[:, 1] + lists.headers[:, 2]
        head_blk = np.repeat(np.arange(count.shape[0], dtype=np.int64), count)
        h, blk = np.divmod(head_blk, lists.blocks)
        other = lists.entries[:, 0].astype(np.int64)
        i, j = (blk, other) if row_major else (other, blk)
        return (h * lists.blocks + i) * lists.blocks + j

    col_codes = codes(cols, False)
    sort = np.argsort(col_codes, kind="stable")
    return _frozen(sort[np.searchsorted(col_codes, codes(rows, True), sorter=sort)])


def _direction(h, blk, other, mask, partial, hl, nb):
    """Tables listing ``other`` per ``(h, blk)``, full entries before partial ones."""
    sort = np.lexsort((other, partial, blk, h))
    row = (h * nb + blk)[sort]
    n_full = np.bincount(row, weights=~partial[sort], minlength=hl * nb).astype(np.int32)
    n_part = np.bincount(row, weights=partial[sort], minlength=hl * nb).astype(np.int32)
    count = n_full + n_part
    start = (np.cumsum(count) - count).astype(np.int32)
    headers = np.stack([start, n_full, n_part], axis=1)
    entries = np.stack([other[sort], mask[sort]], axis=1).astype(np.int32).reshape(-1, 2)
    work = count.reshape(hl, nb).sum(axis=0)
    order = np.lexsort((np.arange(nb), -work)).astype(np.int32)
    return BlockList(*(_frozen(a) for a in (headers, entries, order)))


def _frozen(a):
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.setflags(write=False)
    return a
