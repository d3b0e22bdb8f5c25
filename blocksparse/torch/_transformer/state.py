"""Host-side state of the transformer ops: layout handles and their device tables.

The custom ops take an integer *handle* instead of the layout's tables, so that ``torch.compile``
sees only tensors and scalars at the op boundary; the tables are made once per device inside the
op.  Handles intern ``(layout, in-block masks)`` pairs: equal pairs share one handle and one set of
tables while an object that prepared them lives.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ...ops.transformer.lut import AttentionLayout, BlockMasks
from .._registry import Registry


class Tables(NamedTuple):
    """The tables of :mod:`blocksparse.ops.transformer.lut` on one device, flat ``int32``."""

    coords: torch.Tensor
    row_offsets: torch.Tensor
    col_offsets: torch.Tensor
    col_blocks: torch.Tensor
    mask_index: torch.Tensor   # one -1 per block without masks
    mask_bits: torch.Tensor    # at least one word, so that the kernels get a valid pointer


class _State:
    """A layout and its masks with memoised device tensors."""

    def __init__(self, layout: AttentionLayout, masks: BlockMasks | None):
        self.layout = layout
        self.masks = masks
        self._cache = {}
        # made here, not on first use: torch.compile cannot trace a cached_property's first read (its
        # lock), nor numpy becoming tensors inside a torch.func transform
        self._ids = tuple(_long(a, "cpu") for a in layout.flat_ids)
        self._masks = None if masks is None else (torch.from_numpy(masks.distinct()),
                                                  _long(masks.head_index(layout.heads), "cpu"))

    def _memo(self, key, make):
        if key not in self._cache:
            if torch.compiler.is_compiling():  # a traced call makes its tensors in the graph; none kept
                return make()
            self._cache[key] = make()
        return self._cache[key]

    def tables(self, device) -> Tables:
        def make():
            lay, masks = self.layout, self.masks
            index = masks.index if masks is not None else np.full((lay.lut_heads, lay.blocks), -1)
            bits = masks.bits if masks is not None and masks.bits.size else np.zeros(1)
            return Tables(*(_int32(a, device) for a in (lay.coords, lay.row_offsets, lay.col_offsets,
                                                       lay.col_blocks, index, bits)))
        return self._memo(("tables", str(device)), make)

    def flat_ids(self, device):
        """:attr:`AttentionLayout.flat_ids` on ``device`` (int64, for index_select)."""
        return self._memo(("ids", str(device)), lambda: tuple(t.to(device) for t in self._ids))

    def keep(self, device, masked, autoregress_at_key):
        """``(heads * blocks, bs, bs)`` booleans of the kept elements, or None when all are kept."""
        lay = self.layout
        base = None
        if masked and self.masks is not None:
            def make():  # the distinct masks (few) indexed per block, on the device
                distinct, index = self._masks
                return distinct.to(device)[index.to(device)]
            base = self._memo(("keep", str(device)), make)
        if autoregress_at_key is None:
            return base
        q_ids, k_ids = self.flat_ids(device)
        o = torch.arange(lay.block_size, device=device)
        q_pos = ((q_ids % lay.QB) * lay.block_size)[:, None, None] + o[:, None]
        k_pos = ((k_ids % lay.KB) * lay.block_size)[:, None, None] + o[None, :]
        rule = (k_pos <= q_pos) | (k_pos < autoregress_at_key)
        return rule if base is None else base & rule


def _int32(array, device):
    return torch.from_numpy(np.array(array, dtype=np.int32).reshape(-1)).to(device)  # a writable copy


def _long(array, device):
    return torch.from_numpy(np.array(array, dtype=np.int64)).to(device)


_registry = Registry("transformer layout", "the BlocksparseTransformer")


def handle(layout: AttentionLayout, masks: BlockMasks | None, owner) -> int:
    """The handle of ``(layout, masks)``: a digest of their content (equal pairs share one, in any
    process); kept while ``owner`` lives."""
    return _registry.handle((*layout.key, None if masks is None else masks.key), lambda: _State(layout, masks),
                            owner)


def keep(layout_handle: int):
    """What keeps the state behind ``layout_handle`` findable while held (see :meth:`Registry.keep`)."""
    return _registry.keep(layout_handle)


def state(layout_handle: int) -> _State:
    """The state behind a handle from :func:`handle`."""
    return _registry.state(layout_handle)
