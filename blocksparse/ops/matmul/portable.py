"""Tables of the portable path: ``y = x @ W`` with framework ops only, for any block size.

The portable path never gathers activations per block.  It multiplies each input block row of
``x`` by *all* the weight blocks of its layout row at once -- one dense batched matmul over the
rows, ``[m*bs, bs] @ [bs, N]`` per row with ``m`` blocks -- and then adds the ``bs``-row slices of
the products that belong to each output block (a segment sum: ``embedding_bag(mode="sum")`` in
PyTorch, ``unsorted_segment_sum`` in TensorFlow).  Rows holding the same number of blocks share one
batched matmul, so a layout with a fixed number of blocks per row (butterfly, banded,
block-diagonal, :func:`blocksparse.layouts.butterfly.random_row_layout`) costs one matmul and one
segment sum; other layouts one matmul per distinct row length.

Activations are taken feature-major, ``xt = x.T`` viewed as ``(CB, bs, N)``: the product of row
``c`` is then ``(m*bs, N)``, whose ``bs``-row slices are contiguous ``(bs, N)`` slabs that the segment
sum adds whole.  Tables (all ``int64``, read-only), for a layout with ``blocks`` blocks:

``groups``     one :class:`RowGroup` per distinct row length ``m`` (rows with no block are left out)
``order``      ``(blocks,)``: the weight block behind each row of the product *table* -- the
               concatenation, group after group, of ``group.blocks`` flattened row by row
``table_cols`` ``(blocks,)``: the output block column ``k`` of each table row
``bag_index``  ``(blocks,)``: table rows sorted by output column (stable), the bags of the sum
``bag_offsets`` ``(KB,)``: where the bag of column ``k`` starts in ``bag_index`` (empty bags allowed)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RowGroup", "RowTables", "row_tables"]


def _frozen(a):
    a = np.ascontiguousarray(a, dtype=np.int64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class RowGroup:
    """Layout rows with the same number ``m`` of blocks.

    ``rows``: ``(r,)`` their indices ``c``; ``blocks``: ``(r, m)`` the weight block ids of each row,
    in order of output column; ``all_rows``: the group is every row ``0 .. CB-1`` in order (no
    gather of activations needed); ``first``: ``blocks`` flattened is the run ``first, first + 1,
    ...`` of block ids (a slice of the packed weight serves, no gather), else ``-1``.
    """

    rows: np.ndarray
    blocks: np.ndarray
    all_rows: bool
    first: int

    @property
    def m(self):
        return int(self.blocks.shape[1])


@dataclass(frozen=True)
class RowTables:
    """Tables of the portable path for one layout; see the module docstring."""

    CB: int
    KB: int
    block_size: int
    groups: tuple
    order: np.ndarray
    table_cols: np.ndarray
    bag_index: np.ndarray
    bag_offsets: np.ndarray

    @property
    def blocks(self):
        return int(self.order.shape[0])

    @property
    def identity_order(self):
        """The table rows are the weight blocks in storage order (no gather of weight gradients)."""
        return bool(np.array_equal(self.order, np.arange(self.blocks)))


def row_tables(layout):
    """The :class:`RowTables` of a :class:`blocksparse.layout.Layout` (any block order)."""
    c, k = layout.coords[:, 0], layout.coords[:, 1]
    by_row = np.lexsort((k, c))                       # blocks sorted by (c, k)
    counts = np.bincount(c, minlength=layout.CB)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    groups = []
    for m in np.unique(counts[counts > 0]):
        rows = np.flatnonzero(counts == m)
        blocks = by_row[starts[rows][:, None] + np.arange(m)[None, :]]
        flat = blocks.ravel()
        run = np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size))
        groups.append(RowGroup(_frozen(rows), _frozen(blocks), bool(rows.shape[0] == layout.CB),
                               int(flat[0]) if run else -1))
    order = np.concatenate([g.blocks.ravel() for g in groups])
    table_cols = k[order]
    bag_index = np.argsort(table_cols, kind="stable")
    bag_offsets = np.searchsorted(table_cols[bag_index], np.arange(layout.KB))
    return RowTables(layout.CB, layout.KB, layout.block_size, tuple(groups), _frozen(order),
                     _frozen(table_cols), _frozen(bag_index), _frozen(bag_offsets))
