"""Host-side state of the attention custom ops: layout handles and memoised device tables.

The custom ops take an integer *layout handle*, not tables: ``torch.compile`` then sees only
tensors and scalars at the op boundary, and the tables are built eagerly inside the op, once per
``(causal, device)``.  Handles intern prepared layouts by content: equal layouts share one handle
and one set of tables while an object that prepared it lives (a layout is a few kilobytes to megabytes of
numpy, built once).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from ...ops.attention.blocklist import block_lists, pair_index
from .._registry import Registry


@dataclass(frozen=True)
class DeviceList:
    """One direction's block list on a device (see :mod:`blocksparse.ops.attention.blocklist`)."""

    headers: torch.Tensor
    entries: torch.Tensor
    order: torch.Tensor
    heads: int


@dataclass(frozen=True)
class DeviceTables:
    """Everything the kernels read besides the activations."""

    rows: DeviceList
    cols: DeviceList
    pairs: torch.Tensor      # int32 (E,): each row entry's index among the column entries
    span: int                # the most column entries of one layout head
    masks: torch.Tensor      # uint8 (P, BS, BS); one dummy byte without element masks
    has_masks: bool


class LayoutState:
    """A prepared layout (``layout`` bool ``(HL, NB, NB)``, ``block_size``, optional element masks
    ``mask_index`` / ``masks``) with its memoised tables."""

    def __init__(self, layout, block_size, mask_index=None, masks=None):
        self.layout = layout
        self.block_size = block_size
        self.mask_index = mask_index
        self.masks = masks
        self._lists = {}
        self._device = {}
        self._lock = threading.Lock()

    @property
    def heads(self):
        return self.layout.shape[0]

    @property
    def seq_len(self):
        return self.layout.shape[1] * self.block_size

    def density(self, causal):
        """The kept fraction of the layout's blocks (above the diagonal dropped where ``causal``)."""
        key = ("density", causal)
        if key not in self._device:
            kept = np.tril(self.layout) if causal else self.layout
            self._device[key] = float(kept.mean())
        return self._device[key]

    def lists(self, causal):
        """``(rows, cols)`` :class:`~blocksparse.ops.attention.blocklist.BlockList` (numpy)."""
        with self._lock:
            if causal not in self._lists:
                self._lists[causal] = block_lists(self.layout, causal, self.mask_index)
            return self._lists[causal]

    def tables(self, causal, device):
        """The :class:`DeviceTables` on ``device``."""
        key = ("tables", causal, str(device))
        if key not in self._device:
            rows, cols = self.lists(causal)
            has_masks = self.masks is not None and self.masks.shape[0] > 0
            masks = self.masks if has_masks else np.zeros((1,), np.uint8)
            self._device[key] = DeviceTables(
                _device_list(rows, device), _device_list(cols, device),
                torch.from_numpy(np.array(pair_index(rows, cols))).to(device), _span(cols),
                torch.from_numpy(np.array(masks, dtype=np.uint8)).to(device), has_masks)
        return self._device[key]

    def dense_mask(self, causal, device):
        """The element mask ``(HL, S, S)`` (bool) the layout, element masks and ``causal`` describe:
        what the reference path applies."""
        key = ("dense", causal, str(device))
        if key not in self._device:
            bs = self.block_size
            lay = torch.from_numpy(np.array(self.layout)).to(device)
            dense = lay.repeat_interleave(bs, 1).repeat_interleave(bs, 2)
            if self.masks is not None and self.masks.shape[0]:
                h, i, j = np.nonzero(self.mask_index >= 0)
                blocks = torch.from_numpy(self.masks[self.mask_index[h, i, j]] != 0).to(device)
                view = dense.view(self.heads, lay.shape[1], bs, lay.shape[2], bs)
                view[torch.from_numpy(h), torch.from_numpy(i), :, torch.from_numpy(j), :] &= blocks
            if causal:
                dense &= torch.ones(dense.shape[1:], dtype=torch.bool, device=device).tril()
            self._device[key] = dense
        return self._device[key]


def _span(lists):
    count = lists.headers[:, 1].astype(np.int64) + lists.headers[:, 2]
    return int(count.reshape(lists.heads, lists.blocks).sum(axis=1).max(initial=0))


def _device_list(lists, device):
    t = [torch.from_numpy(np.array(a)).to(device) for a in (lists.headers, lists.entries, lists.order)]
    return DeviceList(*t, heads=lists.heads)


_registry = Registry("attention layout", "the AttentionLayout")


def handle(key: str, make_state, owner) -> int:
    """The handle of the prepared layout with content digest ``key`` (``make_state()`` builds its
    :class:`LayoutState` the first time): the same in every process; kept while ``owner`` lives."""
    return _registry.handle((key,), make_state, owner)


def keep(layout_handle: int):
    """What keeps the state behind ``layout_handle`` findable while held (see :meth:`Registry.keep`)."""
    return _registry.keep(layout_handle)


def state(layout_handle: int) -> LayoutState:
    """The layout state behind a handle from :func:`handle`."""
    return _registry.state(layout_handle)
