"""The channel side of the block-sparse convolution: ``BCK``, validated, and the filter's layout.

``BCK`` lists blocks; block ``b`` is a pair ``(cs, ks)`` of channel index lists: it connects every
input channel in ``cs`` to every output channel in ``ks`` through a dense ``len(ks) x len(cs)``
filter of ``TRS`` taps.  Lists may hold any channels in any order and differ in length from block
to block; two blocks may share input channels or output channels (their contributions add up), but
never the same (input, output) pair.  ``C = max(c) + 1`` and ``K = max(k) + 1``: a channel no
block lists is an unused input or an output that is zero (edge bias aside).

The filter ``F`` holds every block's filter.  Block ``b``'s is ``(len(ks), len(cs)) + TRS`` for a
convolution (output channels first, ``KCTRS``) and ``(len(cs), len(ks)) + TRS`` for a transposed
convolution (input channels first, like PyTorch's ``conv_transpose`` weights).  ``F`` is either
those blocks stacked, ``(blocks,) + block shape``, when all blocks have one shape, or all of them
flattened and concatenated in block order, ``(size,)`` (always accepted).
"""
from __future__ import annotations

import numbers
import numpy as np

__all__ = ["ConvBlocks", "parse_bck"]

#: Channel indices must stay below this (they are used as int32 offsets by kernels).
MAX_CHANNELS = 2 ** 31 - 1


def _channel_list(value, b, side):
    name = f"BCK[{b}][{0 if side == 'input' else 1}] ({side} channels of block {b})"
    if not isinstance(value, np.ndarray):  # a framework tensor: its values (torch's, or TensorFlow's eager)
        value = value.tolist() if hasattr(value, "tolist") else value.numpy() if hasattr(value, "numpy") else value
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence of ints; got {value!r}")
    arr = np.asarray(value)
    if arr.size == 0:
        raise ValueError(f"{name} is empty: every block needs at least one {side} channel")
    # an array of an integer dtype, or ints one by one (a bool among them is not a channel index)
    ints = np.issubdtype(arr.dtype, np.integer) if isinstance(value, np.ndarray) else \
        all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value)
    if arr.ndim != 1 or not ints:
        raise TypeError(f"{name} must be a flat sequence of ints; got {value!r}")
    bad = [v for v in arr.tolist() if not 0 <= v < MAX_CHANNELS]  # Python ints: no wrap-around
    if bad:
        raise ValueError(f"{name} holds out-of-range channel index {bad[0]}; indices must be in "
                         f"[0, {MAX_CHANNELS})")
    arr = arr.astype(np.int64)
    uniq, counts = np.unique(arr, return_counts=True)
    if uniq.size != arr.size:
        raise ValueError(f"{name} lists channel {int(uniq[counts > 1][0])} twice")
    arr.setflags(write=False)
    return arr


def _check_pairs(cs, ks, K):
    """Raise if two blocks connect the same (input, output) channel pair."""
    pairs = np.concatenate([(c[:, None] * K + k[None, :]).ravel() for c, k in zip(cs, ks)])
    owner = np.repeat(np.arange(len(cs)), [c.size * k.size for c, k in zip(cs, ks)])
    order = np.argsort(pairs, kind="stable")
    same = np.flatnonzero(pairs[order][1:] == pairs[order][:-1])
    if same.size == 0:
        return
    first, second = int(owner[order][same[0]]), int(owner[order][same[0] + 1])
    c, k = divmod(int(pairs[order][same[0]]), K)
    if np.array_equal(np.sort(cs[first]), np.sort(cs[second])) and \
            np.array_equal(np.sort(ks[first]), np.sort(ks[second])):
        raise ValueError(f"BCK blocks {first} and {second} are the same block (same input and output "
                         "channels); list each block once")
    raise ValueError(f"BCK blocks {first} and {second} both connect input channel {c} to output channel "
                     f"{k}; every (input, output) channel pair may belong to one block only")


def parse_bck(BCK):
    """Validate ``BCK`` (see the module) into ``(cs, ks)``: per-block int64 arrays."""
    if isinstance(BCK, (str, bytes)) or not hasattr(BCK, "__len__"):
        raise TypeError(f"BCK must be a sequence of (input channels, output channels) pairs; got {BCK!r}")
    if len(BCK) == 0:
        raise ValueError("BCK must hold at least one block; got none")
    cs, ks = [], []
    for b, block in enumerate(BCK):
        if isinstance(block, (str, bytes)) or not hasattr(block, "__len__") or len(block) != 2:
            raise TypeError(f"BCK[{b}] must be a pair (input channels, output channels); got {block!r}")
        cs.append(_channel_list(block[0], b, "input"))
        ks.append(_channel_list(block[1], b, "output"))
    _check_pairs(cs, ks, max(int(k.max()) for k in ks) + 1)
    return tuple(cs), tuple(ks)


class ConvBlocks:
    """Validated blocks with the filter's layout (see the module), all derived at construction (so
    that traced code, e.g. under ``torch.compile``, reads plain ints and ready arrays).

    ``cs[b]`` / ``ks[b]``: input / output channels of block ``b``; ``trs``: taps per filter;
    ``transposed``: the filter layout of a transposed convolution (input channels first).

    Attributes: ``blocks``, ``C``, ``K``, ``pairs`` (connected (input, output) channel pairs),
    ``density`` (``pairs / (C * K)``), ``uniform`` (all block filters of one shape: ``F`` may be
    stacked), ``sizes`` (elements of each block's filter), ``offsets`` (start of each block's
    filter in the flat ``F``, the total last),
    ``size``, ``dense_shape`` (``(K, C, trs)``, or ``(C, K, trs)`` when transposed),
    ``dense_index`` (``(size,)``: where each flat ``F`` element sits in the raveled dense filter),
    ``norm_segments`` (see :meth:`_norm_segments`).
    """

    def __init__(self, cs, ks, trs, transposed=False):
        self.cs, self.ks, self.trs, self.transposed = tuple(cs), tuple(ks), int(trs), bool(transposed)
        self.blocks = len(self.cs)
        self.C = max(int(c.max()) for c in self.cs) + 1
        self.K = max(int(k.max()) for k in self.ks) + 1
        self.pairs = sum(c.size * k.size for c, k in zip(self.cs, self.ks))
        self.density = self.pairs / (self.C * self.K)
        self.uniform = len({self.channel_shape(b) for b in range(self.blocks)}) == 1
        self.sizes = [self.pairs_of(b) * self.trs for b in range(self.blocks)]
        self.offsets = frozen_int64(np.concatenate([[0], np.cumsum(self.sizes)]))
        self.size = int(self.offsets[-1])
        self.dense_shape = ((self.C, self.K) if self.transposed else (self.K, self.C)) + (self.trs,)
        self.dense_index = self._dense_index()
        self.norm_segments = self._norm_segments()

    def pairs_of(self, b):
        return self.cs[b].size * self.ks[b].size

    def channel_shape(self, b):
        """Leading two dims of block ``b``'s filter."""
        c, k = self.cs[b].size, self.ks[b].size
        return (c, k) if self.transposed else (k, c)

    def flat_index(self, b):
        """``channel_shape(b) + (trs,)`` array: where each element of block ``b`` sits in the flat ``F``."""
        return np.arange(self.offsets[b], self.offsets[b + 1]).reshape(self.channel_shape(b) + (self.trs,))

    def _dense_index(self):
        _, cols, trs = self.dense_shape
        parts = []
        for b in range(self.blocks):
            rows_b, cols_b = (self.cs[b], self.ks[b]) if self.transposed else (self.ks[b], self.cs[b])
            cell = (rows_b[:, None] * cols + cols_b[None, :]) * trs
            parts.append((cell[:, :, None] + np.arange(trs)).ravel())
        return frozen_int64(np.concatenate(parts))

    def _norm_segments(self):
        """``(segment of each flat F element, output channel of each segment)``.

        ``l2_normalize`` scales each block's filter per output channel: one segment per (block,
        output channel of the block), holding that channel's input channels and taps.
        """
        seg = np.empty(self.size, dtype=np.int64)
        channel = []
        for b in range(self.blocks):
            index = self.flat_index(b)
            if self.transposed:  # (Cb, Kb, trs): output channel on axis 1
                index = index.transpose(1, 0, 2)
            seg[index.reshape(index.shape[0], -1)] = len(channel) + np.arange(index.shape[0])[:, None]
            channel.extend(self.ks[b].tolist())
        return frozen_int64(seg), frozen_int64(channel)


def frozen_int64(values):
    """``values`` as a read-only contiguous int64 array."""
    array = np.ascontiguousarray(values, dtype=np.int64)
    array.setflags(write=False)
    return array
