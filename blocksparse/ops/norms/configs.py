"""Tile tables of the layer-norm kernels -- the one place that lists them (no autotuning at call time).

A program holds a ``[BN tokens, BC features]`` tile.  When a whole segment fits (``BC >= CS``) the
tile is loaded once and kept in registers (``one_chunk``); longer segments are walked in chunks of
``BC`` features, twice (statistics, then output), the second read served by L2.

* ``axis=1`` -- ``(N, C)`` activations, features contiguous: a tile spans the segment (up to
  ``MAX_ROW`` features) and enough rows to fill ``TILE`` elements (the forward: two rows of 4096
  features or more, up to ``4 * TILE``), ``THREAD_ELEMENTS`` a thread.  Programs are persistent
  and load their next tile while they work on the current one, so the loads of one tile are in
  flight during the other's arithmetic: ``FEW_PROGRAMS`` a SM for ``TILE``-sized tiles, one for
  larger.
* ``axis=0`` -- ``(C, N)``, tokens contiguous: every feature row of a tile reads ``TOKEN_BYTES``
  contiguous bytes (coalesced over tokens), so ``BN`` depends on the element size; a tile holds
  ``TOKEN_TILE`` elements and longer segments are chunked.  The forward runs a program per tile.

The ``(C, N)`` backward of segments longer than its one-chunk tiles runs in two launches over
feature slices instead (:mod:`.split_bwd`, :data:`SPLIT_BWD`): many programs, rows of ``BN`` tokens,
one reduction per program rather than one per chunk.  The forward does the same in three launches
(:mod:`.split_fwd`, :data:`SPLIT_FWD`) on large calls (:data:`SPLIT_FWD_MIN_ELEMENTS`), where the
chunked tile's second walk no longer hits L2.

The backward's tiles are half as large in both layouts (``MAX_ROW // 2`` features, ``TOKEN_TILE //
2`` elements): it holds ``x``, ``dy`` and the next tile's, and the full sizes spill registers
(2-3 KB a thread; one such float32 ``(C, N)`` backward ran at 0.08 of HBM bandwidth);
``blocksparse.aot.resources`` reads the spills of any tile from its cubin, without a GPU.

The backward folds each program's ``dg`` and ``db`` into one row of a partial buffer
(deterministic; summed by :func:`blocksparse.ops.common.reduce.sum_rows_kernel`).  Those rows cost
``8 P / (3 N e)`` of the backward's traffic (``P`` programs, ``N`` tokens, ``e``-byte elements):
few programs.

Measured by ``bench/tune_norms.py`` on an H200 (fraction of the HBM copy bandwidth, the rule's
tile vs the best variant swept).  8192 bf16 tokens: ``(N, C)`` forward 0.73 / 0.73 (1024
features) and 0.85 / 0.85 (8192), backward 0.54 / 0.54 and 0.73 / 0.75; ``(C, N)`` forward 0.51
and 0.46, backward 0.27 / 0.32 and 0.34 / 0.35 (its best tile, ``[32, 512]``, spills when a
segment fits it whole).  16384 tokens, ``(N, C)``: bf16 forward 0.69 -> 0.72 (1024; a copy of the
same bytes 0.74) and 0.74 -> 0.85 (4096; copy 0.88), backward 0.74 -> 0.79 (8192); float32 forward
0.79 -> 0.87 (1024) and 0.89 -> 0.94 (4096), backward 0.77 -> 0.81 (1024).  Those winners are
:data:`MEASURED`.  The relu kernels' backward also holds the bias (to recompute the mask): its
float32 4096-feature tile spilled 424 bytes a thread and ran at 0.63, ``[2, 4096]`` with 8 warps
0.95 (16384 tokens; also 8192 features: float32 0.60 -> 0.62, bf16 0.77 -> 0.80): :data:`MEASURED_RELU`.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton

__all__ = ["NormConfig", "SplitConfig", "layer_norm_config", "split_backward_config", "split_forward_config",
           "MEASURED", "MEASURED_RELU", "TILE", "MAX_ROW", "TOKEN_BYTES", "TOKEN_TILE", "UNALIGNED_TOKEN_TILES",
           "SPLIT_FWD", "SPLIT_FWD_MIN_ELEMENTS", "MERGE_WARPS"]

#: Elements per ``(N, C)`` program tile (at least one segment).
TILE = 4096
#: Longest (power-of-two) segment a ``(N, C)`` tile holds whole.
MAX_ROW = 16384
#: Elements per thread of a ``(N, C)`` tile.
THREAD_ELEMENTS = 32
#: Rows of a backward ``(N, C)`` tile from which threads take half as many elements.
MANY_ROWS = 16
#: Persistent programs per SM with ``TILE``-sized tiles (one with larger ones).
FEW_PROGRAMS = {False: 4, True: 2}
#: Contiguous bytes per feature row of a ``(C, N)`` tile.
TOKEN_BYTES = 64
#: Elements per ``(C, N)`` program tile.
TOKEN_TILE = 16384


@dataclass(frozen=True)
class NormConfig:
    """``BN`` tokens x ``BC`` features per tile (powers of two); ``num_warps``;
    ``programs_per_sm`` persistent programs per SM (0: one program per token tile)."""

    BN: int
    BC: int
    num_warps: int
    programs_per_sm: int = 2

    def one_chunk(self, segment_features):
        """Whether a segment of ``segment_features`` fits one tile (kept in registers)."""
        return self.BC >= segment_features

    def programs(self, tokens, segments, sms):
        """Programs per segment for ``tokens``: one per token tile, or at most ``programs_per_sm``
        per SM over all segments, program ``p`` taking tiles ``p, p + P, ...``."""
        tiles = triton.cdiv(tokens, self.BN)
        if self.programs_per_sm <= 0:
            return max(1, tiles)
        return max(1, min(tiles, self.programs_per_sm * sms // segments))


#: The largest y (and z) extent of a CUDA grid.
MAX_GRID_Y = 65535


@dataclass(frozen=True)
class SplitConfig:
    """The two-launch ``(C, N)`` backward (:mod:`.split_bwd`): programs of ``BN`` tokens walk slices
    of at most ``FS`` features ``R`` at a time; slices are halved (down to ``MIN_FS``) until the grid
    holds ``programs_per_sm`` programs a SM."""

    BN: int = 128
    R: int = 16
    num_warps: int = 4
    FS: int = 512
    MIN_FS: int = 64
    programs_per_sm: int = 2

    def slice_features(self, tokens, segment_features, segments, sms):
        """Features per slice for a call (a multiple of ``R``)."""
        tiles = triton.cdiv(tokens, self.BN) * segments
        fs = self.FS
        while fs > self.MIN_FS and tiles * triton.cdiv(segment_features, fs) < self.programs_per_sm * sms:
            fs //= 2
        while triton.cdiv(segment_features, fs) > MAX_GRID_Y:  # the slices are the grid's y
            fs *= 2
        return fs


#: The split backward's tiles (from a sweep of prototypes on an H100: ``BN`` 64-256, ``R`` 16-32, 4-8 warps,
#: slices of 64-2048 features).  Against the table's one-launch tile in the same run
#: (``bench/norms_split.py``, ``bench/results/raw/norms-split-bwd-h100.json``, CUDA graphs, N 4096-16384 x
#: C 1024-8192): 1.00-1.53x as fast, never slower; bf16 0.40-0.53 of the HBM copy bandwidth (from 0.30-0.44),
#: float32 0.43-0.57 (from 0.38-0.50).  It moves ``x`` and ``dy`` twice: its ceiling is 0.6.
SPLIT_BWD = SplitConfig()


#: The split forward's tiles, per element size (:mod:`.split_fwd`; see :data:`SPLIT_FWD_MIN_ELEMENTS`).
SPLIT_FWD = {2: SplitConfig(BN=128, R=16, num_warps=4, FS=2048, MIN_FS=256, programs_per_sm=4),
             4: SplitConfig(BN=64, R=16, num_warps=4, FS=2048, MIN_FS=256, programs_per_sm=4)}
#: Tokens x segment features from which an aligned ``(C, N)`` forward takes the split kernels, per
#: element size.  Swept on an H200 against the chunked tile (``bench/norms_split.py --forward``,
#: ``bench/results/raw/norms-split-fwd-sweep1-h200.json``; CUDA graphs, every tile checked against
#: float64), the fraction of the copy bandwidth of the best split tile (these) against the chunked
#: one: bf16 0.515 / 0.529 / 0.577 against 0.443 / 0.470 / 0.446 at 8192 x 8192 / 16384 x 4096 /
#: 16384 x 8192, but 0.44 / 0.42 against 0.455 / 0.436 at 8192 x 4096 / 4096 x 8192; float32 0.601 /
#: 0.604 / 0.621 against 0.537 / 0.612 / 0.537, and 0.56 against 0.61 at 8192 x 4096.
SPLIT_FWD_MIN_ELEMENTS = {2: 1 << 26, 4: 1 << 26}
#: Warps of the split forward's merge: it reads 8 bytes a token and slice, so one warp loads a token
#: tile as vectors.
MERGE_WARPS = 1


def split_forward_config(axis, tokens, segment_features, element_size, aligned=True):
    """The :class:`SplitConfig` where the forward runs in three launches -- large ``(C, N)``
    activations loaded as vectors (``aligned``) whose segments the table's tile walks in chunks --
    else None."""
    if axis != 0 or not aligned or element_size not in SPLIT_FWD or \
            tokens * segment_features < SPLIT_FWD_MIN_ELEMENTS[element_size]:
        return None
    cfg = layer_norm_config(axis, segment_features, element_size, aligned=aligned)
    return None if cfg.one_chunk(segment_features) else SPLIT_FWD[element_size]


def split_backward_config(axis, segment_features, element_size, relu=False, aligned=True):
    """The :class:`SplitConfig` where the backward runs in two launches -- ``(C, N)`` activations
    loaded as vectors (``aligned``) whose segments the table's tile walks in chunks -- else None."""
    if axis != 0 or not aligned:
        return None
    cfg = layer_norm_config(axis, segment_features, element_size, backward=True, relu=relu, aligned=aligned)
    return None if cfg.one_chunk(segment_features) else SPLIT_BWD


#: Tiles measured best on a GPU, over the rule below: ``(axis, features rounded up to a power of two,
#: element size, backward) -> NormConfig``.  Written by ``bench/tune_norms.py --install`` (a variant
#: enters where it beat the rule's tile by more than its margin); empty entries take the rule.
MEASURED = {
    (1, 1024, 2, False): NormConfig(BN=2, BC=1024, num_warps=4, programs_per_sm=8),
    (1, 1024, 4, False): NormConfig(BN=2, BC=1024, num_warps=4, programs_per_sm=0),
    (1, 1024, 4, True): NormConfig(BN=8, BC=1024, num_warps=8, programs_per_sm=1),
    (1, 4096, 2, False): NormConfig(BN=2, BC=4096, num_warps=4, programs_per_sm=4),
    (1, 4096, 4, False): NormConfig(BN=2, BC=4096, num_warps=4, programs_per_sm=0),
    (1, 8192, 2, True): NormConfig(BN=1, BC=8192, num_warps=16, programs_per_sm=1),
}


#: Tiles measured best for the kernels with the fused relu where they beat :data:`MEASURED`'s / the
#: rule's (same keys; ``tune_norms.py --relu --install``): its backward also holds the bias, to
#: recompute the mask, and the tile that fits without it spills.
MEASURED_RELU = {
    (1, 4096, 4, True): NormConfig(BN=2, BC=4096, num_warps=8, programs_per_sm=1),
    (1, 8192, 2, True): NormConfig(BN=1, BC=8192, num_warps=8, programs_per_sm=1),
    (1, 8192, 4, True): NormConfig(BN=1, BC=8192, num_warps=16, programs_per_sm=1),
}


def layer_norm_config(axis, segment_features, element_size, backward=False, relu=False, aligned=True):
    """The tile for segments of ``segment_features`` features of ``element_size``-byte activations
    (``relu``: the kernels with the fused relu): the measured one (:data:`MEASURED_RELU`,
    :data:`MEASURED`) where there is one, else the rule.  ``aligned=False``: a ``(C, N)`` token
    count (or row stride) that is not a multiple of 16 takes :data:`UNALIGNED_TOKEN_TILES` for
    float32 activations (16-bit ones keep the rule's tile: measured faster there)."""
    if axis == 0 and not aligned and element_size >= 4:
        return UNALIGNED_TOKEN_TILES[bool(backward)]
    row = triton.next_power_of_2(segment_features)
    key = (axis, row, element_size, bool(backward))
    measured = MEASURED_RELU.get(key) if relu else None
    if measured is None:
        measured = MEASURED.get(key)
    if measured is not None:
        return measured
    return _rule(axis, row, element_size, backward)


#: float32 ``(C, N)`` tiles (forward, backward) where the token count is not a multiple of 16: the
#: loads are scalar, an address and a predicate per element, so a thread holds 16 / 8 elements.  The
#: aligned tiles (64 / 32 elements a thread) spilled 0.7-2.3 KB a thread there; these spill nothing
#: (``blocksparse.aot.resources``).  Longer segments are chunked.  Timed on an H200 (4097 and 16383
#: tokens, 1024 and 4096 features): float32 forward 28 / 95 µs against 140 / 521 with the aligned
#: tile at 1024 features (7-8% slower at 4096), backward 0.80-0.91x the time.  16-bit activations
#: keep the aligned tile, which spills but was faster: these took 1.0-1.2x its time (forward
#: 1024 x 16383 bf16: 83 against 69 µs; backward 4096 x 16383: 668 against 585).
UNALIGNED_TOKEN_TILES = {False: NormConfig(BN=16, BC=256, num_warps=8, programs_per_sm=0),
                         True: NormConfig(BN=16, BC=128, num_warps=8, programs_per_sm=2)}


def _rule(axis, row, element_size, backward):
    if axis == 0:
        bn = TOKEN_BYTES // element_size
        bc = min(row, TOKEN_TILE // (2 if backward else 1) // bn)
        return NormConfig(BN=bn, BC=bc, num_warps=max(4, min(8, bn * bc // 1024)),
                          programs_per_sm=2 if backward else 0)
    bc = min(row, MAX_ROW // 2 if backward else MAX_ROW)
    tile = max(TILE, bc if backward else min(2 * bc, 4 * TILE))
    bn = max(1, tile // bc)
    # a backward tile of many short rows also holds their statistics: half the elements a thread
    per_thread = THREAD_ELEMENTS // (2 if backward and bn >= MANY_ROWS else 1)
    return NormConfig(BN=bn, BC=bc, num_warps=max(4, min(16, tile // (32 * per_thread))),
                      programs_per_sm=FEW_PROGRAMS[backward] if tile <= TILE else 1)
