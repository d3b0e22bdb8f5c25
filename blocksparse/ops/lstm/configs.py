"""Tile table of the LSTM gate kernels -- the one place that lists it.

The kernels are elementwise over ``(N, K)``: a program takes ``BN`` tokens x ``BK`` features of
the cell state and the four gates.  ``BK`` covers up to 128 contiguous features (512 bytes of
float32, 256 of bfloat16 per row and tensor); ``BN`` fills ``TILE`` elements.  The backward runs
persistent programs (``programs_per_sm`` per SM) when it sums ``dbias`` over tokens, each into its
own row of a partial buffer (deterministic), each loading its next tile while it works on the
current one.

The backward holds seven tensors' tiles twice (the next one loads while the current one is worked
on): at 16 elements a thread per tensor (``TILE``) its compiled kernel took 255 registers and
spilled 232 bytes (bf16) / 320 (fp32) a thread, so it takes ``BWD_TILE``, 4 elements a thread
(128-143 registers, no spills; ``python -m blocksparse.aot.resources lstm:lstm_bwd_bf16_bias_k128_sm90``).

Measured by ``bench/tune_norms.py`` on an H200 (bf16, 8192 tokens, merged gates with a bias;
fraction of the HBM copy bandwidth, table vs the best variant swept): forward 0.75 / 0.75 (1024
features) and 0.88 / 0.88 (4096); backward 0.72 / 0.72 and 0.82 / 0.82 (0.36 and 0.41 with the
spilling tile).
"""
from __future__ import annotations

from dataclasses import dataclass

import triton

__all__ = ["GatesConfig", "lstm_gates_config", "TILE", "BWD_TILE"]

#: Elements per tensor in one program's tile: forward, backward.
TILE = 2048
BWD_TILE = 512


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
    return GatesConfig(BN=max(1, (BWD_TILE if backward else TILE) // bk), BK=bk, num_warps=4 if backward else 8)
