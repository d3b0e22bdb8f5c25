"""The grouped-convolution plan: the blocks rearranged into a few dense grouped convolutions.

Blocks that write the same output channels (in the same order) form a *column*: one dense filter
over the concatenation of their input channels.  Columns with the same (input, output) widths form
a *bucket*, computed by one grouped convolution (``groups`` = its columns): its input is the
columns' input channels gathered one after the other, its weight the columns' filters stacked, its
output the columns' output channels.  The buckets' outputs are put in place by one permutation when
every output channel is written exactly once, else added up (``index_add``), which also handles
outputs written by several columns and outputs no block writes.

For a layout of equal-size blocks whose output block columns hold the same number of blocks (a
"balanced" layout) this is a single grouped convolution with no output shuffle at all: its cost is
the gather of the input channels plus a convolution ``density`` times the dense one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .blocks import frozen_int64

__all__ = ["Bucket", "GroupedPlan", "grouped_plan", "worth_grouping", "GROUPED_MAX_DENSITY",
           "GROUPED_MIN_CHANNELS"]

#: The grouped path serves forward-only GPU calls up to this channel density, when every group has
#: at least ``GROUPED_MIN_CHANNELS`` input and output channels.  Measured on an H200
#: (``bench/results/conv-h200.md``, bf16, ResNet-like 3x3 layers): 128-channel blocks at density
#: 0.25 ran 1.2-1.5x faster forward than the dense masked cuDNN convolution; 32- and 64-channel
#: blocks, and density 0.5, ran slower.  1x1 layers (one tap) lost on every measured layout: they
#: never take it.
GROUPED_MAX_DENSITY = 0.25
GROUPED_MIN_CHANNELS = 128


def _span(index):
    """``(start, stop)`` when ``index`` is ``start, start + 1, ...``, else None."""
    if index.size and np.array_equal(index, np.arange(index[0], index[0] + index.size)):
        return int(index[0]), int(index[0] + index.size)
    return None


@dataclass(frozen=True, eq=False)
class Bucket:
    """One grouped convolution.

    ``inputs``: ``(groups * cin,)`` input channels, gathered in this order; ``outputs``:
    ``(groups * cout,)`` the output channel each of its outputs goes to; ``weight``: indices into the
    flat filter of the grouped weight, ``(groups * cout, cin, trs)`` for a convolution (PyTorch's
    grouped ``conv`` layout) or ``(groups * cin, cout, trs)`` for a transposed one.
    """

    groups: int
    cin: int
    cout: int
    inputs: np.ndarray
    outputs: np.ndarray
    weight: np.ndarray
    input_span: tuple | None   # (start, stop) when the gather is a plain slice of the input channels


@dataclass(frozen=True, eq=False)
class GroupedPlan:
    """Buckets, and how their concatenated outputs become the op's output channels.

    ``assemble``: ``"identity"`` (already in order), ``"permute"`` (``output = cat[:, order]``,
    every channel written once) or ``"add"`` (``index_add`` of the concatenation at ``order``).
    """

    buckets: tuple
    assemble: str
    order: np.ndarray
    channels: int


def grouped_plan(blocks):
    """The :class:`GroupedPlan` of a :class:`~.blocks.ConvBlocks`."""
    columns = {}
    for b, k in enumerate(blocks.ks):  # blocks writing the same outputs share one column
        columns.setdefault(k.tobytes(), []).append(b)
    buckets = {}
    for members in columns.values():
        cin = sum(blocks.cs[b].size for b in members)
        buckets.setdefault((cin, blocks.ks[members[0]].size), []).append(members)
    axis = 0 if blocks.transposed else 1  # the filter axis of the block's input channels
    out = []
    for (cin, cout), cols in buckets.items():
        weights = [np.concatenate([blocks.flat_index(b) for b in members], axis=axis) for members in cols]
        inputs = frozen_int64(np.concatenate([blocks.cs[b] for m in cols for b in m]))
        out.append(Bucket(groups=len(cols), cin=cin, cout=cout, inputs=inputs,
                          outputs=frozen_int64(np.concatenate([blocks.ks[m[0]] for m in cols])),
                          weight=frozen_int64(np.concatenate(weights, axis=0)), input_span=_span(inputs)))
    written = np.concatenate([bucket.outputs for bucket in out])
    if np.array_equal(written, np.arange(blocks.K)):
        return GroupedPlan(tuple(out), "identity", frozen_int64(written), blocks.K)
    if written.size == blocks.K and np.unique(written).size == blocks.K:
        return GroupedPlan(tuple(out), "permute", frozen_int64(np.argsort(written)), blocks.K)
    return GroupedPlan(tuple(out), "add", frozen_int64(written), blocks.K)


def worth_grouping(blocks, plan):
    """Whether the grouped path is expected to beat the dense masked convolution on a GPU."""
    narrowest = min(min(b.cin, b.cout) for b in plan.buckets)
    return blocks.trs > 1 and blocks.density <= GROUPED_MAX_DENSITY and narrowest >= GROUPED_MIN_CHANNELS
