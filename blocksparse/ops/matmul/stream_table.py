"""Tables of the stream kernel (:mod:`.xprop_stream`): output groups, the entry stream, schedules.

Numpy only.  These are candidates of the second round of kernel work (issue 16), read by
:mod:`.xprop_stream` and swept by ``bench/tune_bsmm2.py``; the layout core's xprop table
(:mod:`blocksparse.layout`) stays the format of the production kernels.

Output groups
-------------
An *output* is a layout column ``k`` (fprop) or row ``c`` (bprop); its *inputs* are the rows
(columns) holding a block in it.  A program owning a group of ``G`` outputs loads the activation
tile of each input in the *union* of their inputs once and multiplies it by up to ``G`` weight
blocks.  The layout core groups adjacent outputs (``k // G``); on a random layout adjacent outputs
share few inputs, so most of the union's blocks are missing (``bench/README.md``: matrix work on
zero blocks made ``G = 2`` slower).  :func:`overlap_groups` instead pairs outputs that share many
inputs: greedy matching on the count of shared inputs, then pairs of pairs (for ``G = 4``) on the
inputs their unions share.  On random 128 x 128 layouts this raises the blocks served per loaded
activation tile, ``G = 4``, from 1.50 to 1.69 at density 0.25 and from 2.18 to 2.29 at 0.5.

The stream table
----------------
:class:`StreamTable` (all ``int32``, C-contiguous, read-only)::

    outs[g, j]    output index of lane j of group g, -1 where the group has fewer than G outputs
    entries[e] = (inp, group, last, block_0, ..., block_{G-1})         shape (E, 3 + G)
    offsets[g]    entries of group g are rows offsets[g] : offsets[g + 1]

``entries`` holds one row per (group, input) pair with any block, sorted by ``(group, inp)``;
``block_j`` is the weight block joining ``inp`` to output ``outs[g, j]``, -1 where there is none.
A group without any block gets one row with every ``block_j = -1`` (and ``inp = 0``), so that a
kernel still writes its zeros.  ``last`` is 1 on the last row of each group.

Schedules
---------
A call with ``T`` token tiles walks *steps* ``(m, e)``: token tile ``m``, entry ``e``; an *item* is
the steps of one output group for one token tile.  Steps are coded ``m * E + e`` (``int32``).
:func:`aligned_schedule` deals items round-robin to ``P`` programs (program ``p`` owns items
``p, p + P, ...`` in token-tile-major order, so programs running together share token tiles) and
lists each program's steps contiguously, ``cuts[p] : cuts[p + 1]``.  :func:`split_schedule` lists
all steps in token-tile-major order; a stream-K kernel cuts them into ``P`` equal ranges.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...layout import Layout

__all__ = ["GROUPS", "StreamTable", "adjacent_groups", "overlap_groups", "stream_table",
           "aligned_schedule", "split_schedule", "reuse"]

#: Output-group sizes the stream kernel has lanes for.
GROUPS = (1, 2, 4)


@dataclass(frozen=True)
class StreamTable:
    """The stream kernel's table of one product (format in the module docstring)."""

    outs: np.ndarray
    entries: np.ndarray
    offsets: np.ndarray

    @property
    def group(self):
        return int(self.outs.shape[1])

    @property
    def num_groups(self):
        return int(self.outs.shape[0])

    @property
    def num_entries(self):
        return int(self.entries.shape[0])


def _readonly(a):
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.setflags(write=False)
    return a


def _check_group(group):
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)):
        raise TypeError(f"group must be an int, one of {GROUPS}; got {type(group).__name__}")
    if int(group) not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}; got {group}")
    return int(group)


def _masks(layout, kind):
    """(inputs x outputs) 0/1 mask of ``kind``."""
    if kind not in ("fprop", "bprop"):
        raise ValueError(f"kind must be 'fprop' or 'bprop'; got {kind!r}")
    return layout.mask if kind == "fprop" else layout.mask.T


def adjacent_groups(num_out, group):
    """Outputs ``g*G .. g*G+G-1`` in group ``g`` (the layout core's grouping), shape ``(NG, G)``.

    >>> adjacent_groups(5, 2).tolist()
    [[0, 1], [2, 3], [4, -1]]
    """
    group = _check_group(group)
    padded = np.full(-(-num_out // group) * group, -1, dtype=np.int64)
    padded[:num_out] = np.arange(num_out)
    return _readonly(padded.reshape(-1, group))


def overlap_groups(mask, group):
    """Groups of ``group`` outputs (columns of ``mask``) that share many inputs (rows), ``(NG, G)``.

    Greedy matching, one level per doubling of the group: all pairs of current groups sorted by
    the number of inputs their unions share (ties: lower indices first), each taken while both
    members are free; an odd one out stays alone.  Deterministic.

    >>> overlap_groups(np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]]), 2).tolist()
    [[0, 2], [1, 3]]
    """
    group = _check_group(group)
    mask = np.asarray(mask, dtype=bool)
    members = [[k] for k in range(mask.shape[1])]
    unions = [mask[:, k] for k in range(mask.shape[1])]
    size = 1
    while size < group:
        n = len(members)
        stacked = np.stack(unions, axis=1).astype(np.int32)
        shared = stacked.T @ stacked
        first, second = np.triu_indices(n, 1)
        order = np.argsort(-shared[first, second], kind="stable")
        free = np.ones(n, dtype=bool)
        merged, merged_unions = [], []
        for a, b in zip(first[order], second[order]):
            if free[a] and free[b]:
                free[a] = free[b] = False
                merged.append(members[a] + members[b])
                merged_unions.append(unions[a] | unions[b])
        for a in np.flatnonzero(free):
            merged.append(members[a])
            merged_unions.append(unions[a])
        members, unions, size = merged, merged_unions, 2 * size
    out = np.full((len(members), group), -1, dtype=np.int64)
    for g, m in enumerate(sorted(members)):
        out[g, :len(m)] = sorted(m)
    return _readonly(out)


def reuse(layout, kind, groups):
    """Blocks served per activation tile loaded: ``blocks / union entries`` of ``groups``."""
    mask = _masks(layout, kind)
    union = sum(int(mask[:, g[g >= 0]].any(axis=1).sum()) for g in np.asarray(groups))
    return layout.blocks / union


def stream_table(layout: Layout, kind, groups):
    """The :class:`StreamTable` of ``kind`` (``"fprop"`` / ``"bprop"``) for output ``groups``
    (``(NG, G)``, every output exactly once, -1 padding), e.g. from :func:`overlap_groups`."""
    mask = _masks(layout, kind)
    num_inp, num_out = mask.shape
    groups = np.asarray(groups)
    if groups.ndim != 2:
        raise ValueError(f"groups must be a 2-D (groups, G) array; got shape {groups.shape}")
    group = _check_group(groups.shape[1])
    listed = np.sort(groups[groups >= 0])
    if not np.array_equal(listed, np.arange(num_out)):
        raise ValueError(f"groups must name each of the {num_out} outputs exactly once; "
                         f"got {listed.size} entries, {np.unique(listed).size} distinct")
    slot = np.full(num_out, -1, dtype=np.int64)
    slot[groups[groups >= 0]] = np.flatnonzero(groups.reshape(-1) >= 0)
    grp_of, lane_of = slot // group, slot % group

    c, k = layout.coords[:, 0].astype(np.int64), layout.coords[:, 1].astype(np.int64)
    out, inp = (k, c) if kind == "fprop" else (c, k)
    bgrp = grp_of[out]
    pair, row = np.unique(bgrp * num_inp + inp, return_inverse=True)
    rows = np.full((pair.size, 3 + group), -1, dtype=np.int64)
    rows[:, 0], rows[:, 1] = pair % num_inp, pair // num_inp
    rows[row, 3 + lane_of[out]] = np.arange(layout.blocks)
    empty = np.setdiff1d(np.arange(groups.shape[0]), rows[:, 1])
    dummies = np.full((empty.size, 3 + group), -1, dtype=np.int64)
    dummies[:, 0], dummies[:, 1] = 0, empty
    rows = np.concatenate([rows, dummies])
    rows = rows[np.lexsort((rows[:, 0], rows[:, 1]))]
    counts = np.bincount(rows[:, 1], minlength=groups.shape[0])
    offsets = np.concatenate([[0], np.cumsum(counts)])
    rows[:, 2] = 0
    rows[offsets[1:] - 1, 2] = 1
    return StreamTable(_readonly(groups), _readonly(rows), _readonly(offsets))


def aligned_schedule(table: StreamTable, token_tiles, programs):
    """``(steps, cuts)``: items dealt round-robin to ``programs``, each program's steps contiguous."""
    num_items = token_tiles * table.num_groups
    items = np.arange(num_items, dtype=np.int64)
    owner = items % programs
    order = np.argsort(owner, kind="stable")            # program-major, items ascending within
    m, g = items[order] // table.num_groups, items[order] % table.num_groups
    lengths = table.offsets[g + 1] - table.offsets[g]
    first = np.repeat(m * table.num_entries + table.offsets[g], lengths)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    steps = first + within
    per_program = np.bincount(owner, weights=table.offsets[items % table.num_groups + 1]
                              - table.offsets[items % table.num_groups], minlength=programs)
    cuts = np.concatenate([[0], np.cumsum(per_program.astype(np.int64))])
    return _checked_steps(steps), _readonly(cuts)


def split_schedule(table: StreamTable, token_tiles):
    """All steps in token-tile-major order (a stream-K kernel cuts them into equal ranges)."""
    return _checked_steps(np.arange(token_tiles * table.num_entries, dtype=np.int64))


def _checked_steps(steps):
    if steps.size and steps.max() >= 2**31:
        raise ValueError(f"too many steps for int32 codes: {int(steps.max()) + 1}; use fewer tokens per call")
    return _readonly(steps)
