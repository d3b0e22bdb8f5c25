"""Tile configurations of the matmul kernels -- the one place that lists them.

The JIT path (PyTorch) picks a configuration per call from these tables; the ahead-of-time compiler
(TensorFlow GPU path) compiles exactly the specialisations listed by :func:`aot_specializations`.
The numbers come from the sweep in ``bench/tune_bsmm.py`` on an H200 (``bench/results/``).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["XpropConfig", "UpdatConfig", "xprop_config", "updat_config", "KERNEL_BLOCK_SIZES",
           "INTERPRETER_XPROP", "INTERPRETER_UPDAT"]

#: Block sizes the Triton kernels handle; smaller blocks take the reference path.
KERNEL_BLOCK_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True)
class XpropConfig:
    """fprop/bprop tile: ``BM`` tokens x ``G`` output blocks per program; the TMA kernel also
    walks each block's reduction in steps of ``BK`` (0: the whole block), may give each ``BN``
    features of an output block their own program (0: the whole block), unrolls its loop
    ``UNROLL`` times and may warp-specialise it."""

    BM: int
    G: int
    num_warps: int
    num_stages: int
    BK: int = 0
    UNROLL: int = 1
    WARP_SPEC: bool = False
    BN: int = 0


@dataclass(frozen=True)
class UpdatConfig:
    """updat tile: ``G`` blocks of one layout row x ``BK`` tokens per step; the TMA kernel may
    stack the ``G`` blocks into one product (``STACK``)."""

    G: int
    BK: int
    num_warps: int
    num_stages: int
    STACK: bool = False


#: Small tiles for Triton's CPU interpreter (tests): its cost grows with tile area.
INTERPRETER_XPROP = XpropConfig(BM=16, G=1, num_warps=4, num_stages=1)
INTERPRETER_UPDAT = UpdatConfig(G=1, BK=16, num_warps=4, num_stages=1)

# Compute-bound (many tokens) and memory-bound (few tokens) tables, keyed by block size.
_XPROP_LARGE = {
    16: XpropConfig(BM=128, G=4, num_warps=4, num_stages=4),
    32: XpropConfig(BM=128, G=2, num_warps=4, num_stages=4),
    64: XpropConfig(BM=128, G=1, num_warps=4, num_stages=4),
    128: XpropConfig(BM=128, G=1, num_warps=8, num_stages=3),
}
_XPROP_SMALL = {
    16: XpropConfig(BM=64, G=4, num_warps=4, num_stages=4),
    32: XpropConfig(BM=64, G=2, num_warps=4, num_stages=4),
    64: XpropConfig(BM=64, G=1, num_warps=4, num_stages=4),
    128: XpropConfig(BM=64, G=1, num_warps=4, num_stages=3),
}
_UPDAT = {
    16: UpdatConfig(G=8, BK=64, num_warps=4, num_stages=4),
    32: UpdatConfig(G=4, BK=64, num_warps=4, num_stages=4),
    64: UpdatConfig(G=2, BK=64, num_warps=4, num_stages=4),
    128: UpdatConfig(G=1, BK=64, num_warps=8, num_stages=3),
}

#: Token count below which a product is memory bound (weights dominate the bytes).
SMALL_N = 512


def xprop_config(block_size, n_tokens, *, interpret=False):
    """Tile configuration of fprop/bprop for ``n_tokens`` tokens."""
    if interpret:
        return INTERPRETER_XPROP
    table = _XPROP_SMALL if n_tokens <= SMALL_N else _XPROP_LARGE
    return table[block_size]


def updat_config(block_size, n_tokens, *, interpret=False):
    """Tile configuration of updat for ``n_tokens`` tokens."""
    if interpret:
        return INTERPRETER_UPDAT
    return _UPDAT[block_size]
