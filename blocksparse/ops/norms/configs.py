"""Tile tables of the layer-norm kernels -- the one place that lists them (no autotuning at call time).

A program holds a ``[BN tokens, BC features]`` tile.  When a whole segment fits (``BC >= CS``) the
tile is loaded once and kept in registers (``one_chunk``); longer segments are walked in chunks of
``BC`` features, twice (statistics, then output), the second read served by L2.

* ``axis=1`` -- ``(N, C)`` activations, features contiguous: a tile spans the segment (up to
  ``MAX_ROW`` features) and enough rows to fill ``TILE`` elements.
* ``axis=0`` -- ``(C, N)``, tokens contiguous: every feature row of a tile reads ``TOKEN_BYTES``
  contiguous bytes (coalesced over tokens), so ``BN`` depends on the element size and long
  segments are chunked.

The backward runs persistent programs (``programs_per_sm`` per SM), each folding its tokens' ``dg``
and ``db`` into one row of a partial buffer (deterministic; summed by
:func:`blocksparse.ops.common.reduce.sum_rows_kernel`).  Those rows cost ``8 P / (3 N e)`` of the
backward's traffic (``P`` programs, ``N`` tokens, ``e``-byte elements): few programs, enough to
keep ~64 KB of loads in flight per SM.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton

__all__ = ["NormConfig", "layer_norm_config", "TILE", "MAX_ROW", "TOKEN_BYTES"]

#: Elements per program tile (per tensor held).
TILE = 8192
#: Longest (power-of-two) segment a ``(N, C)`` tile holds whole.
MAX_ROW = 16384
#: Contiguous bytes per feature row of a ``(C, N)`` tile.
TOKEN_BYTES = 64


@dataclass(frozen=True)
class NormConfig:
    """``BN`` tokens x ``BC`` features per tile (powers of two); ``num_warps``; backward only:
    ``programs_per_sm`` persistent programs per SM."""

    BN: int
    BC: int
    num_warps: int
    programs_per_sm: int = 2

    def one_chunk(self, segment_features):
        """Whether a segment of ``segment_features`` fits one tile (kept in registers)."""
        return self.BC >= segment_features


def _warps(elements, backward):
    # 16 (forward) or 8 (backward: more live values) elements per thread, 4..16 warps
    per_thread = 8 if backward else 16
    return max(4, min(16, elements // (32 * per_thread)))


def layer_norm_config(axis, segment_features, element_size, backward=False):
    """The tile for segments of ``segment_features`` features of ``element_size``-byte activations."""
    row = triton.next_power_of_2(segment_features)
    if axis == 1:
        bc = min(row, MAX_ROW)
        bn = max(1, TILE // bc)
    else:
        bn = TOKEN_BYTES // element_size
        bc = min(row, TILE // bn)
    return NormConfig(BN=bn, BC=bc, num_warps=_warps(bn * bc, backward),
                      programs_per_sm=2 if bn * bc <= TILE else 1)
