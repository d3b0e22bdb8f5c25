"""The implicit-GEMM plan of a block-sparse convolution (the tables of :mod:`.implicit_gemm`).

The kernel computes one tile of ``BM`` output pixels x up to ``BN`` output channels per program.
Output channels are grouped into *columns*: channels written by the same set of blocks (an output
block column of a block-aligned layout).  A column's reduction runs over the union of its blocks'
input channels -- disjoint, since a (c, k) pair belongs to one block -- times the filter taps, so
absent channel blocks are never read.

Everything is laid out so that the kernel only ever reads runs of consecutive channels:

* a column's input channels are sorted and cut into *runs* of consecutive channels, each run
  into chunks of at most ``BK``; the column's filter is packed with its rows in that sorted order
  (any ``BCK`` channel order works; block-aligned layouts give one run per block, or fewer);
* a column's output channels are sorted and cut into runs of consecutive channels, each run into
  tiles of at most ``BN``.

Tables (int32, row-major):

``steps``  ``(steps, 4)``: ``tap``, first input channel, channels (``<= BK``), and the offset in
           the packed filter of the row of this step's first channel at this tap.  One column's
           steps are consecutive: every tap (outer) x every chunk (inner).
``tiles``  ``(tiles, 6)``: first and one-past-last step of the tile's column, first output
           channel, channels (``<= BN``), the tile's position in its column (added to a step's
           row offset) and the column's width (the packed filter's row stride).
``weight`` ``(size,)`` int64: for each packed filter element, its index in the flat ``F``.  Column
           ``j``'s filter is ``(taps, cin_j, kw_j)``, output channels fastest, so a tile's
           ``[BK, BN]`` slice of one tap is rows of consecutive elements.

The same tables serve the input gradient of the convolution, with the roles swapped: output
channels are read, input channels written, through the transposed relation of the kernel.  Only
convolutions (not transposed ones) have plans.  Which layouts take this path by themselves is the
measured table :data:`IMPLICIT_MAX_DENSITY`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .blocks import frozen_int64

__all__ = ["ImplicitPlan", "implicit_plan", "worth_implicit", "IMPLICIT_MAX_DENSITY", "MAX_BN", "MAX_BK"]

#: The automatic path choice: ``(narrowest block width, "fwd" | "fwd+bwd") -> largest channel
#: density`` at which a GPU call takes the implicit-GEMM kernel.  A layout is looked up under the
#: largest width of the table not above its narrowest block (narrower than all: never); 0.0 means
#: never.  ``bench/conv_implicit.py`` prints this table as its measurements suggest (``--install``
#: writes it here); all zeros -- as measured on an H200, where the kernel was slower than cuDNN's
#: dense masked convolution on the geometric mean of every block width and density
#: (``bench/results/conv-implicit-h200.md``) -- leaves the measured choice of :mod:`.grouping` and
#: the dense masked convolution as it was.
IMPLICIT_MAX_DENSITY = {
    (32, "fwd"): 0.0, (32, "fwd+bwd"): 0.0,
    (64, "fwd"): 0.0, (64, "fwd+bwd"): 0.0,
    (128, "fwd"): 0.0, (128, "fwd+bwd"): 0.0,
}
#: Largest output-channel tile and input-channel chunk of the kernel.
MAX_BN, MAX_BK = 128, 64
_MIN_TILE = 16  # tl.dot's smallest dimension


@dataclass(frozen=True, eq=False)
class ImplicitPlan:
    """Tables of the kernel (see the module) and its channel tile sizes.

    ``covers``: every output channel is written (else the output starts as zeros); ``width``: the
    narrowest block (``min`` over blocks of input and output channels), for the path rule;
    ``align``: a power of two (at most 16) dividing every channel, count and offset of the tables,
    which the kernel is told so that it can vectorise its loads and stores.
    """

    steps: np.ndarray
    tiles: np.ndarray
    weight: np.ndarray
    block_n: int
    block_k: int
    covers: bool
    width: int
    align: int


def _runs(channels):
    """``[(first, count)]`` of the maximal runs of consecutive ints in sorted ``channels``."""
    breaks = np.flatnonzero(np.diff(channels) != 1) + 1
    return [(int(r[0]), int(r.size)) for r in np.split(channels, breaks)]


def _pow2(n, low, high):
    return int(min(high, max(low, 1 << (int(n) - 1).bit_length())))


def _columns(writes, channels):
    """``{blocks writing a channel: sorted channels}`` (``writes[b]``: block ``b``'s written channels)."""
    writers = [[] for _ in range(channels)]
    for b, ks in enumerate(writes):
        for k in ks.tolist():
            writers[k].append(b)
    columns = {}
    for k, members in enumerate(writers):
        if members:
            columns.setdefault(tuple(members), []).append(k)
    return {members: np.array(ks, dtype=np.int64) for members, ks in columns.items()}


def _column_filter(side, members, outs):
    """``(sorted input channels, (taps, cin, kw) flat-F indices)`` of one column."""
    reads, writes, filters = side
    ins = np.sort(np.concatenate([reads[b] for b in members]))
    packed = np.empty((filters(members[0]).shape[2], ins.size, outs.size), dtype=np.int64)
    for b in members:
        index = filters(b)                                   # (written, read, taps) of block b
        rows = np.searchsorted(ins, reads[b])                # the block's read channels, sorted order
        kpos = np.argsort(writes[b])[np.searchsorted(np.sort(writes[b]), outs)]
        packed[:, rows, :] = index[kpos].transpose(2, 1, 0)  # (taps, read, kw)
    return ins, packed


def implicit_plan(blocks, gradient=False):
    """The :class:`ImplicitPlan` of a :class:`~.blocks.ConvBlocks` (None when transposed): of the
    convolution (reads input channels ``cs``, writes output channels ``ks``) or, with ``gradient``,
    of its input gradient (reads ``ks``, writes ``cs``: the kernel's transposed relation)."""
    if blocks.transposed:
        return None
    if gradient:
        side = (blocks.ks, blocks.cs, lambda b: blocks.flat_index(b).transpose(1, 0, 2))
    else:
        side = (blocks.cs, blocks.ks, blocks.flat_index)
    columns = _columns(side[1], blocks.C if gradient else blocks.K)
    widest_run = max(count for outs in columns.values() for _, count in _runs(outs))
    longest_run = max(count for cs in side[0] for _, count in _runs(np.sort(cs)))
    block_n, block_k = _pow2(widest_run, _MIN_TILE, MAX_BN), _pow2(longest_run, _MIN_TILE, MAX_BK)
    steps, tiles, weight, offset = [], [], [], 0
    for members, outs in columns.items():
        ins, packed = _column_filter(side, members, outs)
        first = len(steps)
        runs = _runs(ins)
        rows = np.cumsum([0] + [count for _, count in runs])
        chunks = [(start + c, min(block_k, count - c), int(row) + c)
                  for (start, count), row in zip(runs, rows) for c in range(0, count, block_k)]
        for tap in range(blocks.trs):
            steps.extend((tap, start, count, offset + (tap * ins.size + row) * outs.size)
                         for start, count, row in chunks)
        position = 0
        for start, count in _runs(outs):
            for k in range(0, count, block_n):
                tiles.append((first, len(steps), start + k, min(block_n, count - k), position + k, outs.size))
            position += count
        weight.append(packed.ravel())
        offset += packed.size
    if offset >= 2 ** 31:
        raise ValueError(f"the filter has {offset} elements; the implicit-GEMM kernel takes fewer than 2**31")
    written = sum(outs.size for outs in columns.values())
    width = min(min(c.size, k.size) for c, k in zip(blocks.cs, blocks.ks))
    steps, tiles = _frozen_int32(steps, 4), _frozen_int32(tiles, 6)
    align = int(np.gcd.reduce(np.concatenate([steps[:, 1:].ravel(), tiles[:, 2:].ravel(), [16]])))
    return ImplicitPlan(steps=steps, tiles=tiles, weight=frozen_int64(np.concatenate(weight)), block_n=block_n,
                        block_k=block_k, covers=written == (blocks.C if gradient else blocks.K), width=width,
                        align=align & -align)


def _frozen_int32(rows, width):
    array = np.array(rows, dtype=np.int32).reshape(-1, width)
    array.setflags(write=False)
    return array


def dense_input_grad(geometry):
    """Whether the implicit path takes its input gradient from the dense masked convolution (cuDNN)
    rather than the transposed kernel: strided layers.  The transposed kernel runs every tap for
    every input pixel and masks those that land between strided positions -- ``prod(strides)``
    times the useful work.  Measured on an H200 (bf16 3x3 stride 2,
    ``bench/results/raw/conv-launch-h200.json``): 5.6-6.0x its own forward's GPU time and 4.5-13x
    the dense cuDNN forward's, against 0.99-1.02x its forward's at stride 1."""
    return any(a.stride > 1 for a in geometry.axes)


def worth_implicit(plan, density, training):
    """Whether the implicit-GEMM kernel is expected to beat the other GPU paths
    (:data:`IMPLICIT_MAX_DENSITY`); ``training``: a gradient will be taken."""
    if plan is None:
        return False
    mode = "fwd+bwd" if training else "fwd"
    widths = [w for w, m in IMPLICIT_MAX_DENSITY if m == mode and w <= plan.width]
    return bool(widths) and density <= IMPLICIT_MAX_DENSITY[(max(widths), mode)]
