"""Tile table of the LSTM gate kernels -- the one place that lists it.

The kernels are elementwise over ``(N, K)``: a program takes ``BN`` tokens x ``BK`` features of
the cell state and the four gates.  ``BK`` covers up to 128 contiguous features (512 bytes of
float32, 256 of bfloat16 per row and tensor); ``BN`` fills ``TILE`` elements.  The backward runs
persistent programs (``programs_per_sm`` per SM) when it sums ``dbias`` over tokens, each into its
own row of a partial buffer (deterministic).
"""
from __future__ import annotations

from dataclasses import dataclass

import triton

__all__ = ["GatesConfig", "lstm_gates_config", "TILE"]

#: Elements per tensor in one program's tile.
TILE = 2048


@dataclass(frozen=True)
class GatesConfig:
    """``BN`` tokens x ``BK`` features per program (powers of two), ``num_warps``;
    backward with a bias: ``programs_per_sm`` persistent programs per SM."""

    BN: int
    BK: int
    num_warps: int
    programs_per_sm: int = 4


def lstm_gates_config(K, backward=False):
    """The tile for a cell of ``K`` features."""
    bk = min(128, triton.next_power_of_2(K))
    return GatesConfig(BN=max(1, TILE // bk), BK=bk, num_warps=8 if backward else 4)
