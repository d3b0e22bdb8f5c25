"""Tile configs of the fused attention kernels, per head dim (a small table), and the rules that fit
them to a layout's block size.

A kernel tile never straddles layout blocks: every tile side divides the block size (a tile of
``BM`` query rows is a slice of one query block; ``BN`` keys a slice of one key block), so the
tables stay at block granularity and a full block's tiles need no masking.  A config's tiles are
shrunk to the block size where they are larger (block size 16/32/64 layouts).

The table is Hopper's (H200), chosen by ``bench/attention.py --sweep``; other GPUs take it too.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["DS_SCRATCH_MAX_BYTES", "HEAD_DIMS", "KERNEL_BLOCK_SIZES", "SPARSE_HEADS_FIRST", "BwdConfig", "FwdConfig", "bwd_config",
           "fwd_config"]

#: Head dims the kernels serve (powers of two: a tile's feature axis is one ``tl.arange``).
HEAD_DIMS = (16, 32, 64, 128)
#: Layout block sizes the kernels serve (``tl.dot`` needs tiles of at least 16).
KERNEL_BLOCK_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True)
class FwdConfig:
    """Forward: a program owns ``BM`` query rows and walks their key blocks ``BN`` keys at a time."""

    BM: int = 128
    BN: int = 64
    num_warps: int = 8
    num_stages: int = 3
    warp_specialize: bool = False   # tl.range(..., warp_specialize=): producer/consumer warps
    tma: bool = True                # tensor-descriptor loads where the GPU and tensors allow
    prefetch: bool = False          # the full blocks' walk reads its table one step ahead
    heads_first: bool = False       # grid (heads, tiles): every head's heaviest tiles start first

    def fit(self, block_size):
        """This config with tiles no larger than ``block_size``."""
        return replace(self, BM=min(self.BM, block_size), BN=min(self.BN, block_size))


@dataclass(frozen=True)
class BwdConfig:
    """Backward: ``dq`` programs own ``BM2`` query rows and walk keys ``BN2`` at a time; ``dk``/``dv``
    programs own ``BN1`` keys and walk the query blocks that attend to them ``BM1`` rows at a time.
    ``atomic_dq``: no dq programs; the dk/dv programs add dq with float32 atomics (``BM2`` then
    only tiles the pass that computes ``delta``); ``fused`` (without ``atomic_dq``): the dk/dv and dq
    programs run in one launch, after a pass that computes ``delta``; ``store_ds``: the dk/dv
    programs (after the delta pass) also write ``dS`` into a scratch of one block per attended block,
    and a dq launch sums ``dS k`` from it (where the scratch fits :data:`DS_SCRATCH_MAX_BYTES` and the
    batch is not ragged; else the config without it runs)."""

    BM1: int = 32
    BN1: int = 128
    BM2: int = 128
    BN2: int = 32
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = True
    atomic_dq: bool = False
    prefetch: bool = False          # the full blocks' walks read their tables one step ahead
    heads_first: bool = False       # grids (heads, tiles): every head's heaviest tiles start first
    fused: bool = False             # dk/dv and dq programs in one launch (after a delta pass)
    store_ds: bool = False          # dk/dv programs write dS; a dq launch after them reads it back

    def fit(self, block_size):
        """This config with tiles no larger than ``block_size``."""
        bs = block_size
        return replace(self, BM1=min(self.BM1, bs), BN1=min(self.BN1, bs), BM2=min(self.BM2, bs),
                       BN2=min(self.BN2, bs))


# From `bench/attention.py --sweep` on an H200 (bench/results/attention-sweep-h200.md: 15 forward
# and 16 backward configs per head dim, timed on causal 4k x 4, fixed 4k x 4 and fixed 16k x 1, bf16,
# every one checked against a float32 reference first).  D = 64 keeps a backward without
# prefetching: the second sweep found prefetching 8% faster summed over those shapes (and a 64 x 64
# forward 3%), but the eager comparison with both (bench/results/raw/attention-4k-d64-prefetch-h200.md)
# ran BigBird 4k forward + backward 1.47x slower (1.33 against 0.90 ms), causal 4k 7% faster.  Head dims 16 / 32 take the D = 64 tiles with fewer
# warps (not swept: their tiles are small).  `--sweep --table` (bench/results/raw/attention-heads-first-h200.md,
# attention-fused-bwd-h200.md) chose ``heads_first`` (grids (heads, tiles)) for the D = 64 forward
# (0.92x summed over its four shapes, 0.84-0.97x each; the D = 128 forward took 1.04x with it) and
# the one-launch backward (``fused``) for D = 128: 0.91x the two launches summed, 0.93-0.94x at 4k and
# 0.83x at fixed 16k (with heads_first too 0.96x).  The D = 64 backward keeps two launches (fused
# 1.02x; 0.94x at 16k only).
_FWD = {
    16: FwdConfig(BM=128, BN=64, num_warps=4, num_stages=3),
    32: FwdConfig(BM=128, BN=64, num_warps=4, num_stages=3),
    64: FwdConfig(BM=128, BN=64, num_warps=8, num_stages=3, prefetch=True, heads_first=True),
    128: FwdConfig(BM=128, BN=128, num_warps=8, num_stages=3, prefetch=True),
}
_BWD = {
    16: BwdConfig(BM1=64, BN1=64, BM2=64, BN2=64, num_warps=4, num_stages=3),
    32: BwdConfig(BM1=64, BN1=64, BM2=64, BN2=64, num_warps=4, num_stages=3),
    64: BwdConfig(BM1=64, BN1=64, BM2=64, BN2=64, num_warps=4, num_stages=3),
    128: BwdConfig(BM1=64, BN1=128, BM2=128, BN2=64, num_warps=8, num_stages=3, prefetch=True, fused=True),
}


#: The most bytes of ``dS`` scratch a ``store_ds`` backward allocates (one ``BS x BS`` tile in the
#: inputs' dtype per attended block, query head and batch element); above, it recomputes ``dS``
#: in dq programs instead.
DS_SCRATCH_MAX_BYTES = 4 << 30


def fwd_config(head_dim, block_size):
    """The forward config for ``head_dim`` (one of :data:`HEAD_DIMS`), fitted to ``block_size``."""
    return _FWD[head_dim].fit(block_size)


#: Head dim -> the largest kept fraction of a layout (after ``causal`` drops the blocks above the
#: diagonal) at which the backward's grids start every head's heaviest tiles first
#: (``heads_first``).  From ``bench/attention.py`` on an H200 (bench/results/raw/attention-d64-bwd-heads-first-h200.md):
#: at head dim 64 it took forward + backward of BigBird 16k from 1.31 to 1.04 ms and 64k from 5.43 to
#: 3.95 ms, "fixed" 16k from 1.30 to 1.20 ms, but causal layouts (half the blocks) 4-6% longer.
#: At head dim 128 (bench/results/raw/attention-d128-bwd-heads-first-h100.md, on an H100, the table's
#: backward and its heads-first twin interleaved): BigBird 16k (6.2% kept) 1.20 -> 1.03 ms, "fixed" 64k
#: (7.0%) 17.1 -> 16.7 ms, but BigBird 4k (24%) 0.99 -> 1.16 ms: only the sparsest layouts take it.
SPARSE_HEADS_FIRST = {64: 0.25, 128: 0.08}


def bwd_config(head_dim, block_size, density=None):
    """The backward config for ``head_dim``, fitted to ``block_size``; ``density``, the kept fraction
    of the layout, where known, picks the grid order (:data:`SPARSE_HEADS_FIRST`)."""
    cfg = _BWD[head_dim].fit(block_size)
    if density is not None and density <= SPARSE_HEADS_FIRST.get(head_dim, -1.0):
        cfg = replace(cfg, heads_first=True)
    return cfg
