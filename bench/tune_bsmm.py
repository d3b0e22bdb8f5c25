"""Variant sweep of the matmul kernels on a GPU: every variant checked against float64, then timed.

Produces the numbers behind ``blocksparse/ops/matmul/configs.py``.  One run:

    python bench/tune_bsmm.py --out bench/results/tune-h200.json
    python bench/tune_bsmm.py --narrow --out narrow.jsonl      # sweep 6: 8192 x 1024, bs 32 (~1 min)
    python bench/tune_bsmm.py --pixelfly --out pixelfly.jsonl  # sweep 7: the large pixelfly MLP (~1 min)
    python bench/tune_bsmm.py --native256 --out n256.jsonl     # sweep 11: its layers on their own 256-blocks
    python bench/tune_bsmm.py --prefetch --out prefetch.jsonl  # sweep 10: tables walked one step ahead (~2 min)
    python bench/tune_bsmm.py --prefetch-more --out prefetch.jsonl  # its blocks of 16 and float32 at 8192 tokens
    python bench/tune_bsmm.py --updat --out updat.jsonl        # sweep 12: bf16 updat tiles at blocks of 32 / 64
    python bench/tune_bsmm.py --pixelfly2 --out px2.jsonl      # sweep 13: fewer stages, two programs a SM (~2 min)
    python bench/tune_bsmm.py --bias-grad --out bias.jsonl     # sweep 14: the bias gradient in the updat (~1 min)
    python bench/tune_bsmm.py --short --out short.jsonl        # sweep 15: short columns, several programs a SM
    python bench/tune_bsmm.py --bm256 --out bm256.jsonl        # sweep 16: [256, 128] tiles at blocks of 128
    python bench/tune_bsmm.py --persist --out persist.jsonl    # sweep 17: persistent programs on regular layouts

(Sweeps 6 and 7 append a JSON line per variant; ``--start N`` resumes after a variant that lost the
CUDA context.)

Variants: the pointer-load kernels (:mod:`blocksparse.ops.matmul.xprop`, ``.updat``) and the TMA
kernels (``.xprop_tma``, ``.updat_tma``) over output-group size ``G``, tile sizes, warps and
pipeline stages; compute-bound (N = 8192) and memory-bound (N = 64) problems; alongside, the
ceilings of the same GPU: dense cuBLAS, HBM copy bandwidth and L2 read bandwidth.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402
from blocksparse.ops.matmul.configs import UpdatConfig as U  # noqa: E402
from blocksparse.ops.matmul.configs import XpropConfig as X  # noqa: E402

C = K = 4096

def _x(BM, G, w, s, BK=0, UNROLL=1, BN=0):
    return X(BM, G, w, s, BK=BK, UNROLL=UNROLL, BN=BN)


# Sweep 4.  Sweeps 1-3 (output groups, pointer vs TMA loads, tile sizes, reduction sub-steps,
# unrolling, warp specialisation, output slices, stacked updat, float32) are in git history, their
# results in bench/results/raw/.  Here: output groups G for few tokens (re-read activations, not
# matrix work, limit them) and pointer-kernel updat for float32.
SMALL_N = {  # fprop at N = 64: (impl, config, waves)
    16: [("tma", _x(64, 1, 4, 2), 8), ("tma", X(64, 2, 4, 3), 4), ("tma", X(64, 4, 4, 3), 4),
         ("tma", X(64, 4, 4, 3), 8)],
    32: [("tma", _x(64, 1, 4, 2), 8), ("tma", X(64, 2, 4, 3), 4), ("tma", X(64, 2, 4, 3), 8),
         ("tma", X(64, 4, 4, 3), 4), ("tma", X(64, 4, 4, 3), 8)],
    64: [("tma", _x(64, 1, 4, 6, BN=32), None), ("tma", _x(64, 2, 4, 4, BN=32), None),
         ("tma", X(64, 2, 4, 3), 4), ("tma", _x(64, 1, 4, 2), 8)],
    128: [("tma", _x(64, 1, 4, 6, BN=32), None), ("tma", _x(64, 2, 4, 4, BN=32), None),
          ("tma", _x(64, 2, 4, 3, BN=64), None)],
}
FP32_UPDAT = {64: [("ptr", U(2, 32, 8, 2)), ("ptr", U(2, 32, 4, 3)), ("ptr", U(1, 32, 4, 3))],
              128: [("ptr", U(1, 32, 8, 2)), ("ptr", U(1, 32, 4, 3)), ("ptr", U(1, 16, 8, 3))]}


# Sweep 6 (``--narrow``): layers of 1024 features (C = K = 1024) at N = 8192, bf16, bs 32,
# d = 0.25, where a column holds 8 blocks: the eager-latency issue's 8192 x 1024 step.  The
# tables' tiles come first; ``waves`` 0 on updat: one token slice, the 16-bit gradient written by
# the kernel (no atomics, zeroing or cast).
NARROW_XPROP = [("tma", X(256, 1, 8, 6)), ("tma", X(256, 1, 8, 4)), ("tma", X(128, 1, 4, 4)),
                ("tma", X(128, 1, 4, 6)), ("tma", X(128, 1, 8, 4)), ("tma", X(128, 1, 8, 6)),
                ("tma", X(64, 1, 4, 4)), ("tma", X(64, 1, 4, 6)), ("tma", X(128, 2, 8, 4)),
                ("tma", X(256, 2, 8, 4)), ("tma", _x(128, 1, 4, 4, UNROLL=2)),
                ("ptr", X(128, 1, 4, 4, TMA=False)), ("ptr", X(64, 1, 4, 3, TMA=False))]
NARROW_UPDAT = [("ptr", U(8, 64, 8, 3), 2), ("ptr", U(8, 64, 8, 3), 1), ("ptr", U(8, 64, 8, 3), 4),
                ("ptr", U(4, 64, 8, 3), 2), ("ptr", U(4, 64, 4, 3), 2), ("ptr", U(8, 32, 8, 3), 2),
                ("ptr", U(8, 128, 8, 3), 2), ("ptr", U(4, 64, 8, 3), 0), ("ptr", U(2, 64, 4, 3), 0),
                ("tma", U(1, 64, 4, 3), 2), ("tma", U(1, 64, 4, 3), 0), ("tma", U(1, 64, 4, 4), 0),
                ("tma", U(2, 64, 4, 4), 0), ("tma", U(1, 128, 8, 3), 0)]


# Sweep 7 (``--pixelfly``): the large pixelfly MLP's layers (block 256, butterfly 64: 2048 -> 8192
# at d = 0.5, 8192 -> 4096 at d = 0.31), refined to blocks of 128 as the layers run them, N = 8192,
# bf16: the kernel library's tiles (G = 1) first, then the JIT's grouped one and others.
PIXELFLY_XPROP = [("tma", _x(128, 1, 4, 6, BK=64)), ("tma", _x(128, 2, 8, 4, BK=64)),
                  ("tma", _x(256, 1, 8, 4, BK=64)), ("tma", _x(128, 1, 8, 4, BK=64)),
                  ("tma", _x(128, 1, 4, 4, BK=64)), ("tma", _x(128, 1, 8, 6, BK=32)),
                  ("tma", _x(256, 2, 8, 3, BK=64, BN=64))]
PIXELFLY_UPDAT = [("tma", U(1, 64, 4, 5), 2), ("tma", U(1, 64, 8, 4), 2), ("tma", U(2, 64, 8, 3), 2),
                  ("tma", U(1, 32, 4, 6), 2), ("tma", U(1, 64, 4, 5), 0), ("tma", U(1, 64, 4, 5), 4)]
PIXELFLY_LAYERS = ((2048, 8192), (8192, 4096))

# Sweep 13 (``--pixelfly2``): the same layers (the first one's bprop too: the benchmark's input needs
# its gradient), tiles of bs 128 with fewer stages, so that two or more programs share a SM and one's
# epilogue overlaps another's loads (the tables' 6-stage tile holds a SM alone), against the tables'.
PIXELFLY2_XPROP = [("tma", _x(128, 1, 4, 6, BK=64)), ("tma", _x(128, 1, 4, 3, BK=64)),
                   ("tma", _x(128, 1, 4, 2, BK=64)), ("tma", X(128, 1, 4, 3, BK=64, PREFETCH=True)),
                   ("tma", X(128, 1, 4, 4, BK=64, PREFETCH=True)), ("tma", _x(64, 1, 4, 4, BK=64)),
                   ("tma", _x(64, 1, 4, 3, BK=64)), ("tma", X(64, 1, 4, 4, BK=64, PREFETCH=True)),
                   ("tma", _x(128, 1, 8, 3, BK=64)), ("tma", _x(128, 1, 4, 5, BK=64))]
PIXELFLY2_UPDAT = [("tma", U(1, 64, 4, 5), 2), ("tma", U(1, 64, 4, 3), 2), ("tma", U(1, 64, 4, 4), 2),
                   ("tma", U(2, 64, 8, 3), 2), ("tma", U(1, 64, 8, 3), 2), ("tma", U(1, 32, 4, 4), 2)]

# Sweep 11 (``--native256``): the same layers run on their own 256-blocks (no refinement, no
# re-blocking copies): [BM, 256] output tiles, one weight tile ``[BK, 256]`` a step (cuBLAS's
# 128 x 256 shape), against the library's refined tile, timed in the same run.
NATIVE256_XPROP = [("tma", _x(128, 1, 8, 3, BK=64)), ("tma", _x(128, 1, 8, 4, BK=64)),
                   ("tma", X(128, 1, 8, 3, BK=64, PREFETCH=True)), ("tma", X(128, 1, 8, 4, BK=64, PREFETCH=True)),
                   ("tma", _x(64, 1, 4, 4, BK=64)), ("tma", _x(128, 1, 8, 5, BK=32)),
                   ("tma", _x(256, 1, 8, 4, BK=64, BN=128)), ("tma", _x(128, 1, 4, 6, BK=64, BN=128)),
                   ("tma", X(128, 1, 4, 6, BK=64, BN=128, PREFETCH=True))]
NATIVE256_UPDAT = [("tma", U(1, 64, 8, 3), 0), ("tma", U(1, 32, 8, 4), 0), ("tma", U(1, 64, 16, 3), 0)]

# Sweep 12 (``--updat``): the bf16 updat at N = 8192, C = K = 4096, blocks of 32 and 64, d = 0.25 and
# 0.5 (issue 16: the updat within 10% of fprop's speed; 0.29 against 0.34 at bs 32, 0.45 against 0.60
# at bs 64): the tables' tiles first, fprop's as the yardstick of the same run, then output groups
# G (one activation tile for G blocks of a layout row), warps, stages and token steps.
UPDAT_SWEEP = {32: [("ptr", U(8, 64, 8, 3), 2), ("tma", U(1, 64, 4, 3), 2), ("tma", U(2, 64, 4, 3), 2),
                    ("tma", U(4, 64, 8, 3), 2), ("tma", U(2, 64, 8, 4), 2), ("tma", U(4, 32, 8, 4), 2),
                    ("ptr", U(4, 64, 8, 3), 2), ("ptr", U(16, 64, 8, 3), 2), ("ptr", U(8, 64, 8, 3), 4)],
               64: [("tma", U(1, 64, 4, 4), 2), ("tma", U(1, 64, 4, 3), 2), ("tma", U(1, 64, 8, 4), 2),
                    ("tma", U(2, 64, 4, 3), 2), ("tma", U(2, 64, 8, 3), 2), ("tma", U(2, 64, 8, 4), 2),
                    ("tma", U(4, 64, 8, 3), 2), ("tma", U(2, 32, 8, 5), 2), ("tma", U(1, 128, 4, 3), 2),
                    ("tma", U(1, 64, 4, 4), 4), ("ptr", U(2, 64, 4, 4), 2), ("ptr", U(4, 64, 8, 3), 2)]}
UPDAT_FPROP = {32: ("tma", X(256, 1, 8, 4, PREFETCH=True)), 64: ("tma", X(256, 1, 8, 5, PREFETCH=True))}


# Sweep 8 (``--few``): few tokens (N = 64, C = K = 4096: memory bound), fprop and bprop: the
# tables' few-token tile against the pointer kernel taking KB table entries a step (one gather of
# KB blocks' weight rows, so a program keeps KB blocks' bytes in flight per dependent table load)
# with output slices of BN features; no split reductions (one launch, no atomics).
def _few_variants(bs, float32):
    kbs = {16: (8, 16), 32: (4, 8, 16), 64: (2, 4, 8), 128: (1, 2, 4)}[bs]
    shapes = ((4, 3), (8, 2)) if not float32 else ((4, 2), (8, 2))
    out = []
    for kb in kbs[:2] if float32 else kbs:
        for bn in sorted({min(bs, 32), 16}, reverse=True):
            out += [("ptr", X(64, 1, w, st, BN=bn if bn < bs else 0, WAVES=0, KB=kb, TMA=False)) for w, st in shapes]
    return out


def few_cases(first=False):
    """(problem key, op, impl, cfg, waves) of sweep 8 (``first``: its first run, every KB and BN
    at two densities; else the current tile, the pointer tables' one and the first run's best,
    plus split TMA tiles, at three)."""
    from blocksparse.ops.matmul.configs import xprop_config

    out = []
    if first:
        for dtype, ops, densities in (("bf16", ("fprop",), (0.1, 0.5)), ("bf16", ("bprop",), (0.5,)),
                                      ("fp32", ("fprop",), (0.5,))):
            for bs in (32, 64, 128):
                current = xprop_config(bs, 64, float32=dtype == "fp32")
                variants = [("tma" if current.TMA else "ptr", current)] + _few_variants(bs, dtype == "fp32")
                for d in densities:
                    key = ("random", 64, C, K, bs, d, dtype)
                    out += [(key, op, i, c, c.WAVES or None) for op in ops for i, c in variants]
        return out
    for dtype, ops in (("bf16", ("fprop", "bprop")), ("fp32", ("fprop",))):
        float32 = dtype == "fp32"
        for bs in (32, 64, 128):
            current = xprop_config(bs, 64, float32=float32)
            variants = [("tma" if current.TMA else "ptr", current),
                        ("ptr", xprop_config(bs, 64, float32=float32, tma=False))]
            variants += [("ptr", c) for c in FEW_BEST[dtype][bs]] + [("tma", c) for c in FEW_SPLIT[bs]]
            for d in (0.1, 0.25, 0.5):
                key = ("random", 64, C, K, bs, d, dtype)
                ops_d = ops if d == 0.5 else ops[:1]
                out += [(key, op, i, c, c.WAVES or None) for op in ops_d for i, c in variants]
    return out


def ticket_cases():
    """(problem key, op, impl, cfg, waves) of sweep 9: split reductions finished in the kernel
    (``-ticket``) against float32 atomics (zero fill, kernel, cast) and unsplit tiles -- few-token
    fprop / bprop, and the 8192 x 1024 updat (sweep 6's problem)."""
    from blocksparse.ops.matmul.configs import xprop_config

    out = []
    for dtype, ops in (("bf16", ("fprop", "bprop")), ("fp32", ("fprop",))):
        float32 = dtype == "fp32"
        for bs in (32, 64, 128):
            current = xprop_config(bs, 64, float32=float32)
            split = [current] if current.WAVES else FEW_SPLIT[bs]
            variants = [("tma", current)] + [("tma", c) for c in split if c is not current]
            variants += [("tma-ticket", c) for c in split]
            for d in (0.1, 0.25, 0.5):
                key = ("random", 64, C, K, bs, d, dtype)
                ops_d = ops if d == 0.5 else ops[:1]
                out += [(key, op, i, c, c.WAVES or None) for op in ops_d for i, c in variants]
    key = ("random", 8192, 1024, 1024, 32, 0.25)
    updat = [("ptr", U(8, 64, 8, 3), 2), ("ptr-ticket", U(8, 64, 8, 3), 2), ("ptr-ticket", U(8, 64, 8, 3), 4),
             ("ptr-ticket", U(4, 64, 8, 3), 2), ("ptr", U(4, 64, 8, 3), 0), ("tma", U(1, 64, 4, 3), 2),
             ("tma-ticket", U(1, 64, 4, 3), 2), ("tma-ticket", U(1, 64, 4, 3), 4)]
    return out + [(key, "updat", i, c, w) for i, c, w in updat]


# Sweep 10 (``--prefetch``): the TMA xprop kernel walking its table one step ahead (``PREFETCH``:
# its tile loads get num_stages - 1 steps of lead instead of (num_stages - 1) // 2, checked by
# compiling for sm_90), against the plain walk: many tokens (N = 8192; short columns at d = 0.1)
# and few (N = 64, memory bound: more weight bytes in flight per program), bf16 at blocks of 32-128;
# float32 few tokens, whose plain tiles hold one buffer a tile (num_stages - 1 with PREFETCH).  Its
# first run (raw/tune-prefetch-h200.jsonl) set the tables; ``--prefetch-more`` adds what it did not
# time: blocks of 16 (bf16), float32 at many tokens, and how far to split few-token columns.
PREFETCH_PROBLEMS = ((8192, (0.1, 0.5), "bf16", (32, 64, 128)), (64, (0.25, 0.5), "bf16", (32, 64, 128)),
                     (64, (0.25, 0.5), "fp32", (32, 64, 128)))
PREFETCH_MORE = ((8192, (0.1, 0.5), "bf16", (16,)), (64, (0.25, 0.5), "bf16", (16,)),
                 (8192, (0.5,), "fp32", (16, 32, 64, 128)))


def prefetch_cases(problems=PREFETCH_PROBLEMS):
    """(problem key, op, impl, cfg, waves) of sweep 10: per problem the tables' tile first, then
    the same tile with and without ``PREFETCH`` at its own and at fewer / more pipeline stages."""
    from dataclasses import replace

    from blocksparse.ops.matmul.configs import xprop_config

    out = []
    for n, densities, dtype, block_sizes in problems:
        for bs in block_sizes:
            current = xprop_config(bs, n, float32=dtype == "fp32")
            impl = "tma-ticket" if n <= 512 and current.WAVES else "tma"
            bk, bn = current.BK or bs, current.BN or bs
            size = 4 if dtype == "fp32" else 2
            fits = 200 * 1024 // ((current.BM * bk + bk * bn) * size)  # pipeline stages shared memory holds
            stages = sorted(s for s in {current.num_stages, 3, 4} | ({2} if n <= 512 else {6}) if s <= fits)
            variants = [current]
            for c in [replace(current, PREFETCH=False)] + [replace(current, PREFETCH=True, num_stages=s)
                                                           for s in stages]:
                if c not in variants:
                    variants.append(c)
            waves = current.WAVES or None if n <= 512 else 2
            for d in densities:
                key = ("random", n, C, K, bs, d, dtype)
                ops = ("fprop", "bprop") if d == 0.5 and dtype == "bf16" else ("fprop",)
                out += [(key, op, impl, c, waves) for op in ops for c in variants]
    return out


def prefetch_waves_cases():
    """Sweep 10's few-token split: the tables' prefetching tiles at N = 64, bf16, splitting each
    column over programs until about 2 / 4 / 8 / 16 run per SM (short programs fill their deeper
    pipelines for few steps; long ones leave SMs idle); and, where the tile takes a slice of each
    block's features, the whole block with split columns."""
    from dataclasses import replace

    from blocksparse.ops.matmul.configs import xprop_config

    out = []
    for bs in (32, 64, 128):
        current = xprop_config(bs, 64)
        variants = [current] + [replace(current, WAVES=w) for w in (2, 4, 8, 16) if w != current.WAVES]
        if current.BN:
            # whole weight blocks a program: fprop's BN-feature slice of a block is BN * 2 bytes of
            # each of its rows (64 B at BN 32, rows 128 / 256 B apart), bprop's whole rows; split
            # columns make up for the fewer programs
            variants += [replace(current, BN=0, BK=min(bs, 64), WAVES=w, num_stages=s)
                         for w in (4, 8) for s in (3, 4)]
        for d in (0.25, 0.5):
            key = ("random", 64, C, K, bs, d, "bf16")
            out += [(key, "fprop", "tma-ticket" if c.WAVES else "tma", c, c.WAVES or None) for c in variants]
    return out


def few16_cases():
    """Sweep 10's blocks of 16 at few tokens on the pointer kernel: ``KB`` table entries a step
    (a ``[64, 16 KB]`` activation gather times ``[16 KB, 16]`` weight rows), so a step is more
    than one 512-byte block -- the TMA tile's step, one block, is what bounds it (2.5x dense's
    time at d = 0.5) -- unsplit and split over about 4 programs per SM (tickets)."""
    out = []
    variants = [X(64, 1, w, st, WAVES=waves, KB=kb, TMA=False)
                for kb in (4, 8, 16) for w, st in ((4, 3), (8, 2)) for waves in (0, 4)]
    for d in (0.25, 0.5):
        key = ("random", 64, C, K, 16, d, "bf16")
        ops = ("fprop", "bprop") if d == 0.5 else ("fprop",)
        out += [(key, op, "ptr-ticket" if c.WAVES else "ptr", c, c.WAVES or None) for op in ops for c in variants]
    return out


# Sweep 18 (``--few16g``): blocks of 16 at few tokens are the one block size slower than dense
# cuBLAS (1.45-1.76x its time at d = 0.5 on an H100): each 512-byte weight block costs a [64, 16]
# activation tile (2 KB) from the L2, four times its own bytes.  The pointer kernel's output groups
# (``G`` columns a program, one activation tile for all the blocks of a layout row in the group,
# absent blocks masked without a memory access) cut those re-reads by up to ``G`` times; split over
# ~4 or 8 programs a SM (float32 atomics), against the table's tile.
FEW16G_VARIANTS = [X(64, g, 4, 3, WAVES=w, TMA=False) for g in (4, 8) for w in (4, 8)]


def few16g_cases():
    """(problem key, op, impl, cfg, waves) of sweep 18: the table's tile first."""
    from blocksparse.ops.matmul.configs import xprop_config

    current = xprop_config(16, 64)
    key = ("random", 64, C, K, 16, 0.5, "bf16")
    return [(key, op, f"ptr{finish}", c, c.WAVES) for op in ("fprop", "bprop") for finish in ("-ticket", "")
            for c in [current] + FEW16G_VARIANTS]


# Sweep 15 (``--short``): short columns (issue 16, item 3: at d = 0.1 every block size should reach
# 0.9 of its own d = 0.5 figure).  A column of d = 0.1 at C = 4096 holds 3.2 / 6.4 / 12.8 blocks of
# 128 / 64 / 32: a program's pipeline fill and output store weigh against few steps, and the tables'
# many-token tiles (up to 200 KB of shared memory) leave one program a SM to hide them.  Tiles with
# fewer stages or fewer tokens let 2-4 programs share a SM; each is timed at d = 0.1 and 0.5 (its
# price on long columns), N = 8192, bf16, fprop and bprop.
def short_cases():
    """(problem key, op, impl, cfg, waves) of sweep 15: per block size the tables' tile first."""
    from dataclasses import replace

    from blocksparse.ops.matmul.configs import xprop_config

    out = []
    for bs in (32, 64, 128):
        current = xprop_config(bs, 8192)
        bk = current.BK or bs
        variants = [current]
        for bm, warps in ((64, 4), (128, 4), (128, 8), (256, 8)):
            per_stage = (bm * bk + bk * bs) * 2
            for stages in (2, 3, 4, 5):
                if per_stage * stages > 200 * 1024 or (bm == 256 and stages < 3):
                    continue
                c = replace(current, BM=bm, num_warps=warps, num_stages=stages, PREFETCH=True)
                if c not in variants:
                    variants.append(c)
        for d in (0.1, 0.5):
            key = ("random", 8192, C, K, bs, d, "bf16")
            out += [(key, op, "tma", c, 2) for op in ("fprop", "bprop") for c in variants]
    return out


# Sweep 16 (``--bm256``): sweep 15 found blocks of 128 at d = 0.5 (8192 tokens) 12-13% faster on
# [256, 128] output tiles, 8 warps, 3-4 stages walking the table one step ahead than on the
# table's [128, 128] tile: the same on the large pixelfly MLP's layers (refined, packed) and on
# random layouts at fewer tokens (fewer programs) and d = 0.25.
BM256_VARIANTS = [X(256, 1, 8, 3, BK=64, PREFETCH=True), X(256, 1, 8, 4, BK=64, PREFETCH=True)]


def bm256_cases():
    """(problem key, op, impl, cfg, waves) of sweep 16: per problem the table's tile first."""
    from blocksparse.ops.matmul.configs import xprop_config

    keys = [("pixelfly", 8192, *layer) for layer in PIXELFLY_LAYERS]
    keys += [("random", n, C, K, 128, d, "bf16") for n in (8192, 2048) for d in (0.25, 0.5)]
    return [(key, op, "tma", c, 2) for key in keys for op in ("fprop", "bprop")
            for c in [xprop_config(128, key[1])] + BM256_VARIANTS]


# Sweep 17 (``--persist``): the pixelfly layers' columns (rows) all hold equally many blocks, so
# persistent programs can deal the output tiles and overlap a tile's store with the next one's
# first loads (:mod:`blocksparse.ops.matmul.xprop_persistent`); against the table's tile.
PERSIST_VARIANTS = [X(256, 1, 8, 3, BK=64, PREFETCH=True, PERSIST=1),
                    X(256, 1, 8, 4, BK=64, PREFETCH=True, PERSIST=1, SUBTILE=True),
                    X(128, 1, 8, 5, BK=64, PREFETCH=True, PERSIST=1),
                    X(128, 1, 8, 6, BK=64, PREFETCH=True, PERSIST=1, SUBTILE=True),
                    X(128, 1, 4, 3, BK=64, PREFETCH=True, PERSIST=2, SUBTILE=True)]


def persist_cases():
    """(problem key, op, impl, cfg, waves) of sweep 17: per problem the table's tile first."""
    from blocksparse.ops.matmul.configs import xprop_config

    keys = [("pixelfly", 8192, *layer) for layer in PIXELFLY_LAYERS]
    return [(key, op, "tma", c, 2) for key in keys for op in ("fprop", "bprop")
            for c in [xprop_config(128, key[1])] + PERSIST_VARIANTS]


# Sweep 19 (``--gluon``): persistent programs pipelined across their output tiles, written in Gluon
# (:mod:`blocksparse.ops.matmul.xprop_gluon`): the next tile's loads run while this one's last products
# do, and its store leaves through the copy engine while the next tile's products run -- what
# Triton's pipeliner (sweep 17: ``flatten``) could not give.  Against the tables' tiles on the large
# pixelfly MLP's layers (refined, and on their own 256-blocks) and random layouts of 64- and
# 128-blocks at d = 0.1 and 0.5 (short and long columns).
def gluon_cases():
    """(problem key, op, impl, cfg, waves) of sweep 19: per problem the table's tile first."""
    from blocksparse.ops.matmul.configs import xprop_config
    from blocksparse.ops.matmul.xprop_gluon import GluonTile as T

    out = []
    for layer in PIXELFLY_LAYERS:
        for op in ("fprop", "bprop"):
            refined, native = ("pixelfly", 8192, *layer), ("pixelfly256", 8192, *layer)
            out.append((refined, op, "tma", xprop_config(128, 8192), 2))
            out.append((native, op, "tma", X(128, 1, 8, 4, BK=64, PREFETCH=True), 2))
            out += [(native, op, "gluon", t, None) for t in (T(128, 256, 64, 3, 8), T(128, 128, 64, 4, 4),
                                                                  T(128, 128, 64, 5, 8))]
            out += [(refined, op, "gluon", t, None) for t in (T(128, 128, 64, 4, 4), T(128, 128, 64, 5, 8))]
    for bs, tiles in ((128, (T(128, 128, 64, 4, 4), T(128, 128, 64, 5, 8), T(256, 128, 64, 3, 8))),
                      (64, (T(128, 64, 64, 6, 4), T(256, 64, 64, 4, 8), T(128, 64, 64, 8, 4)))):
        for d in (0.1, 0.5):
            key = ("random", 8192, C, K, bs, d, "bf16")
            for op in ("fprop", "bprop"):
                out.append((key, op, "tma", xprop_config(bs, 8192), 2))
                out += [(key, op, "gluon", t, None) for t in tiles]
    return out


def _kb(bs, kb, w, st, bn=0):
    return X(64, 1, w, st, BN=bn, WAVES=0, KB=kb, TMA=False)


#: The first run's best pointer tiles taking KB entries a step (``raw/tune-few-h200.jsonl``).
FEW_BEST = {"bf16": {32: [_kb(32, 8, 8, 2), _kb(32, 16, 8, 2)], 64: [_kb(64, 8, 8, 2, 32)],
                     128: [_kb(128, 4, 8, 2, 32)]},
            "fp32": {32: [_kb(32, 8, 8, 2)], 64: [_kb(64, 4, 8, 2, 32), _kb(64, 2, 8, 2, 32)],
                     128: [_kb(128, 1, 4, 2, 32), _kb(128, 1, 8, 2, 32)]}}
#: TMA tiles splitting long reductions (float32 atomics) as the blocks of 32 do, for larger blocks.
FEW_SPLIT = {32: [], 64: [X(64, 1, 4, 2, WAVES=8), X(64, 1, 4, 3, BN=32, WAVES=4)],
             128: [X(64, 1, 4, 2, BK=32, BN=32, WAVES=8), X(64, 1, 4, 3, BK=64, BN=32, WAVES=4)]}


def narrow_cases():
    """(problem key, op, impl, cfg, waves) of sweep 6."""
    key = ("random", 8192, 1024, 1024, 32, 0.25)
    out = [(key, op, i, c, 2) for op in ("fprop", "bprop") for i, c in NARROW_XPROP]
    return out + [(key, "updat", i, c, w) for i, c, w in NARROW_UPDAT]


def updat_cases():
    """(problem key, op, impl, cfg, waves) of sweep 12."""
    out = []
    for bs, variants in UPDAT_SWEEP.items():
        for d in (0.25, 0.5):
            key = ("random", 8192, 4096, 4096, bs, d)
            out.append((key, "fprop", *UPDAT_FPROP[bs], 2))
            out += [(key, "updat", i, c, w) for i, c, w in variants]
    return out


def pixelfly_cases():
    """(problem key, op, impl, cfg, waves) of sweep 7 (no bprop of the first layer: its input needs
    no gradient in the MLP)."""
    out = []
    for layer in PIXELFLY_LAYERS:
        key = ("pixelfly", 8192, *layer)
        ops = ("fprop", "bprop") if layer[0] != 2048 else ("fprop",)
        out += [(key, op, i, c, 2) for op in ops for i, c in PIXELFLY_XPROP]
        out += [(key, "updat", i, c, w) for i, c, w in PIXELFLY_UPDAT]
    return out


def pixelfly2_cases():
    """(problem key, op, impl, cfg, waves) of sweep 13: both layers' fprop, bprop and updat."""
    out = []
    for layer in PIXELFLY_LAYERS:
        key = ("pixelfly", 8192, *layer)
        out += [(key, op, i, c, 2) for op in ("fprop", "bprop") for i, c in PIXELFLY2_XPROP]
        out += [(key, "updat", i, c, w) for i, c, w in PIXELFLY2_UPDAT]
    return out


def native256_cases():
    """(problem key, op, impl, cfg, waves) of sweep 11: the library's refined tiles first (the
    baseline of the same run), then the 256-block variants."""
    out = []
    for layer in PIXELFLY_LAYERS:
        ops = ("fprop", "bprop") if layer[0] != 2048 else ("fprop",)
        refined, native = ("pixelfly", 8192, *layer), ("pixelfly256", 8192, *layer)
        out += [(refined, op, *PIXELFLY_XPROP[0], 2) for op in ops] + [(refined, "updat", *PIXELFLY_UPDAT[0])]
        out += [(native, op, i, c, 2) for op in ops for i, c in NATIVE256_XPROP]
        out += [(native, "updat", i, c, w) for i, c, w in NATIVE256_UPDAT]
    return out


def bias_grad_rows(args):
    """Sweep 14 (``--bias-grad``): the large pixelfly MLP's layers (refined to blocks of 128, 8192
    tokens, bf16), their table's updat tile: GPU ms of the updat alone (``updat``), with the bias
    gradient's column sums (``updat_bias``: ``BIAS_GRAD``, :mod:`blocksparse.ops.matmul.bias_grad`),
    and of the column sums as the native op computes them today (``ones @ dy`` through cuBLAS,
    ``cublas_bias``), each in a CUDA graph; ``saved_ms`` = updat + cublas_bias - updat_bias.  The
    fused call is checked first: ``db`` against float64 sums, ``dw`` equal to the plain updat's."""
    from blocksparse.ops.matmul.bias_grad import bias_first

    impl, cfg, waves = PIXELFLY_UPDAT[0]
    rows = []
    for layer in PIXELFLY_LAYERS:
        p = keyed_problem(("pixelfly", 8192, *layer))
        lay = p.layout
        marks, complete = bias_first(lay.updat_groups(cfg.G), cfg.G, lay.K // lay.block_size)
        marks = torch.from_numpy(marks).to(p.dy.device)
        plain = make_call(p, "updat", impl, cfg, waves)
        fused = make_call(p, "updat", impl, cfg, waves, bias_first=marks)
        ones = torch.ones(1, p.N, device=p.dy.device, dtype=p.dy.dtype)
        cublas = lambda: ones @ p.dy  # noqa: E731
        dw, db = fused()
        want = p.dy.double().sum(0)
        row = dict(layer=list(layer), cfg=asdict(cfg), complete=bool(complete), dw_equal=bool(torch.equal(dw, plain())),
                   db_err=float((db.double() - want).abs().max() / want.abs().max()))
        for name, fn in (("updat", plain), ("updat_bias", fused), ("cublas_bias", cublas)):
            row[name] = common.GraphTimer(lambda fn=fn: [fn]).median_ms(20)
        row["saved_ms"] = row["updat"] + row["cublas_bias"] - row["updat_bias"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return rows


def keyed_problem(key):
    """The problem of a sweep 6 / 7 key (one kept at a time)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if key not in _problems:
        _problems.clear()
        if key[0] == "random":
            _, n, c, k, bs, d, *dtype = key
            dtype = common.DTYPES[dtype[0]] if dtype else torch.bfloat16
            _problems[key] = common.Problem(c, k, n, bs, d, dtype, seed=bs, device=dev)
        else:
            from blocksparse.ops.matmul.refine import refine
            from blocksparse.torch import PixelflyLinear

            _, n, c, k = key
            coarse = PixelflyLinear(c, k, 256, 64).layout
            fine = coarse if key[0] == "pixelfly256" else refine(coarse, 128).layout
            p = common.Problem(c, k, n, 128, 0.5, torch.bfloat16, seed=1, device=dev)
            p.layout, p.bs = fine, fine.block_size
            p.w = (torch.randn(fine.w_shape, device=dev) / math.sqrt(fine.block_size)).to(torch.bfloat16)
            p.coords = torch.from_numpy(np.array(fine.coords)).to(dev).long()
            _problems[key] = p
    return _problems[key]


def cases(quick=False):
    """(N, bs, density, dtype, op, impl, cfg, waves) of every variant to check and time."""
    out = []
    for bs, variants in SMALL_N.items():
        for d in (0.1, 0.5):
            out += [(64, bs, d, "bf16", "fprop", i, c, w) for i, c, w in variants]
    for bs, variants in FP32_UPDAT.items():
        out += [(8192, bs, 0.25, "fp32", "updat", i, c, 2) for i, c in variants]
    return out[::7] if quick else out


_problems = {}


def problem(n, bs, density, dtype):
    key = (n, bs, density, dtype)
    if key not in _problems:
        _problems.clear()  # keep one problem at a time in memory
        _problems[key] = common.Problem(C, K, n, bs, density, common.DTYPES[dtype], seed=bs)
    return _problems[key]


def make_call(p, op, impl, cfg, waves, tensors=None, bias_first=None):
    """A zero-argument launch of one variant on problem ``p`` (or on ``tensors`` = (x, w, dy));
    ``bias_first``: an updat that also gives the bias gradient (returns ``(dw, db)``)."""
    from blocksparse.torch._matmul import launch as _triton

    from blocksparse.ops.matmul.configs import output_slice

    lay, bs = p.layout, p.bs
    x, w, dy = tensors or (p.x, p.w, p.dy)
    dev = x.device
    sms = torch.cuda.get_device_properties(0).multi_processor_count if x.is_cuda else 4
    impl, ticket = impl.removesuffix("-ticket"), impl.endswith("-ticket")  # splits finished in the kernel
    if op == "updat":
        groups = torch.from_numpy(lay.updat_groups(cfg.G).copy()).to(dev)
        split = max(1, min(waves * sms // groups.shape[0], math.ceil(p.N / (4 * cfg.BK))))
        # waves 0: one slice, dW in x's dtype; tickets write it there too
        dw_dtype = torch.float32 if waves and not ticket else x.dtype
        fn = _triton.updat_ptr if impl == "ptr" else _triton.updat_tma
        extra = {} if bias_first is None else dict(bias_first=bias_first)
        return lambda: fn(x, dy, groups, w_shape=lay.w_shape, bs=bs, axis=1, cfg=cfg, split=split,
                          precision="ieee", dw_dtype=dw_dtype, ticket=ticket, **extra)
    if impl == "gluon":
        from blocksparse.ops.matmul.xprop_gluon import split_empty, xprop_gluon

        lut = getattr(lay, op)(None, group=1)
        headers, empty = split_empty(torch.from_numpy(lut.headers.copy()).to(dev), bs)
        entries = torch.from_numpy(lut.entries.copy()).to(dev)
        inp, out_features = (x, p.K) if op == "fprop" else (dy, p.C)
        return lambda: xprop_gluon(inp, w, headers, entries, out_features=out_features, bs=bs, trans=op == "bprop",
                                   tile=cfg, empty=empty)
    lut = getattr(lay, op)(None, group=cfg.G)
    max_segment = None
    if waves is not None:  # split long reductions until ~waves programs per SM
        programs = math.ceil(p.N / cfg.BM) * lut.num_segments * (bs // output_slice(cfg, bs, impl == "tma"))
        if programs < waves * sms and lut.max_count > 1:
            max_segment = max(1, math.ceil(lut.max_count * programs / (waves * sms)))
            lut = getattr(lay, op)(max_segment, group=cfg.G)
    headers = torch.from_numpy(lut.headers.copy()).to(dev)
    entries = torch.from_numpy(lut.entries.copy()).to(dev)
    split = lut.num_segments > lut.num_groups
    offsets = torch.from_numpy(lut.offsets.astype(np.int32)).to(dev) if ticket and split else None
    inp, out_features = (x, p.K) if op == "fprop" else (dy, p.C)
    fn = _triton.xprop_ptr if impl == "ptr" else _triton.xprop_tma
    extra = dict(count=lut.uniform_count) if cfg.PERSIST else {}
    return lambda: fn(inp, w, headers, entries, out_features=out_features, bs=bs, axis=1,
                      trans=op == "bprop", cfg=cfg, atomic=split and not ticket, precision="ieee",
                      offsets=offsets, **extra)


def _compile_chunk(chunk):
    """Worker: run each case once, filling Triton's on-disk cache.  Returns failures."""
    failures = []
    for case in chunk:
        n, bs, d, dt, op, impl, cfg, waves = case
        try:
            make_call(problem(n, bs, d, dt), op, impl, cfg, waves)()
        except Exception as exc:  # reported by the main process
            failures.append((repr(case), repr(exc)[:300]))
    torch.cuda.synchronize()
    return failures


def rotating_calls(p, op, impl, cfg, waves, l2_bytes=60 * 2**20):
    """Calls of one variant over enough copies of its operands to overflow the L2 four times."""
    per_set = sum(t.numel() * t.element_size() for t in (p.x, p.w, p.dy))
    copies = max(2, min(64, math.ceil(4 * l2_bytes / per_set)))
    sets = [(p.x.clone(), p.w.clone(), p.dy.clone()) for _ in range(copies)]
    return [make_call(p, op, impl, cfg, waves, t) for t in sets]


def small_n_ceilings(hbm_gbs):
    """Per size of weights at N = 64: a plain copy of that many bytes and dense cuBLAS, timed like
    the kernels (rotating CUDA graph) -- what the memory-bound problems can reach at all."""
    out = {}
    for bs, d in ((32, 0.1), (32, 0.5), (128, 0.1), (128, 0.5)):
        p = problem(64, bs, d, "bf16")
        nbytes = bytes_moved(p, "fprop")
        copies = max(2, min(64, math.ceil(240 * 2**20 / nbytes)))
        srcs = [torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
                for _ in range(copies)]
        dsts = [torch.empty_like(t) for t in srcs]
        # a copy reads and writes: time one that moves the same total bytes as the kernel
        half = [(s_[: s_.numel() // 2], d_[: d_.numel() // 2]) for s_, d_ in zip(srcs, dsts)]
        copy_ms = common.time_rotating_ms(lambda: [(lambda a=a, b=b: b.copy_(a)) for a, b in half])
        dense_w = [torch.randn(C, K, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        dense_ms = common.time_rotating_ms(lambda: [(lambda w=w: p.x @ w) for w in dense_w])
        out[f"bs{bs}-d{d}"] = dict(bytes=nbytes, copy_ms=copy_ms, dense_ms=dense_ms,
                                   copy_hbm_frac=nbytes / copy_ms / 1e6 / hbm_gbs)
    return out


def bytes_moved(p, op):
    """Fewest bytes an op must move: nonzero weights (or dw) plus the activations in and out."""
    e = p.x.element_size()
    w = p.layout.blocks * p.bs * p.bs * (4 if op == "updat" else e)
    acts = p.N * (p.C + p.K) * e
    return w + acts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "tune.json"))
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--narrow", action="store_true", help="sweep 6 only: 8192 x 1024, bs 32, d = 0.25, bf16, "
                    "every product timed in CUDA graphs beside cuBLAS (JSON lines appended to --out)")
    ap.add_argument("--pixelfly", action="store_true", help="sweep 7 only: the large pixelfly MLP's layers, "
                    "refined to blocks of 128, bf16 (JSON lines appended to --out)")
    ap.add_argument("--native256", action="store_true", help="sweep 11 only: the large pixelfly MLP's layers on "
                    "their own 256-blocks against the refined tiles, bf16 (JSON lines appended to --out)")
    ap.add_argument("--few", action="store_true", help="sweep 8 only: N = 64, C = K = 4096, the few-token "
                    "tiles (JSON lines appended to --out)")
    ap.add_argument("--first", action="store_true", help="--few: the first run's variants")
    ap.add_argument("--tickets", action="store_true", help="sweep 9 only: split reductions finished in the "
                    "kernel against atomics (JSON lines appended to --out)")
    ap.add_argument("--prefetch-more", action="store_true", help="sweep 10's second part only: blocks of 16 "
                    "(bf16), float32 at N = 8192, and the few-token split (WAVES) of the prefetching tiles "
                    "(JSON lines appended to --out)")
    ap.add_argument("--prefetch", action="store_true", help="sweep 10 only: the TMA xprop kernel walking its "
                    "table one step ahead, N = 8192 and 64, bf16, and float32 at N = 64 (JSON lines appended to --out)")
    ap.add_argument("--pixelfly2", action="store_true", help="sweep 13 only: the large pixelfly MLP's layers, "
                    "bs 128 tiles with fewer stages")
    ap.add_argument("--bm256", action="store_true", help="sweep 16 only: [256, 128] tiles at blocks of 128 "
                    "(pixelfly layers, random layouts)")
    ap.add_argument("--persist", action="store_true", help="sweep 17 only: persistent programs on the pixelfly "
                    "layers' regular layouts against the table's tile")
    ap.add_argument("--short", action="store_true", help="sweep 15 only: short columns (d = 0.1 against 0.5), "
                    "bf16 fprop / bprop tiles with fewer stages or tokens, several programs a SM")
    ap.add_argument("--updat", action="store_true", help="sweep 12 only: bf16 updat tiles at blocks of 32 and 64")
    ap.add_argument("--gluon", action="store_true", help="sweep 19 only: persistent Gluon programs pipelined "
                    "across output tiles against the tables' tiles (pixelfly layers, random layouts)")
    ap.add_argument("--few16g", action="store_true", help="sweep 18 only: blocks of 16 at 64 tokens, output "
                    "groups of the pointer kernel against the table's tile")
    ap.add_argument("--bias-grad", action="store_true", help="sweep 14 only: the pixelfly layers' updat with the "
                    "bias gradient against the updat and cuBLAS's column sums (JSON lines appended to --out)")
    ap.add_argument("--profile", action="store_true", help="isolated sweeps: also each variant's GPU time per "
                    "kernel (torch.profiler over the rotating calls, launched eagerly)")
    ap.add_argument("--start", type=int, default=0, help="--narrow / --pixelfly / --few: the first variant to run")
    ap.add_argument("--stop", type=int, default=None, help="isolated sweeps: run the variants before this one only")
    ap.add_argument("--smoke", action="store_true",
                    help="check the script itself on the CPU (TRITON_INTERPRET=1, tiny shapes, no timing)")
    args = ap.parse_args()
    if args.smoke:
        return smoke()
    if args.bias_grad:
        return bias_grad_rows(args)
    if (args.narrow or args.pixelfly or args.native256 or args.few or args.tickets or args.prefetch or args.prefetch_more
            or args.updat or args.pixelfly2 or args.short or args.bm256 or args.persist or args.few16g or args.gluon):
        todo = (narrow_cases() if args.narrow else pixelfly_cases() if args.pixelfly
                else pixelfly2_cases() if args.pixelfly2 else updat_cases() if args.updat
                else short_cases() if args.short else bm256_cases() if args.bm256
                else persist_cases() if args.persist else few16g_cases() if args.few16g
                else gluon_cases() if args.gluon
                else native256_cases() if args.native256
                else ticket_cases() if args.tickets else prefetch_cases() if args.prefetch
                else prefetch_cases(PREFETCH_MORE) + prefetch_waves_cases() + few16_cases() if args.prefetch_more
                else few_cases(args.first))
        return isolated(args, todo[:args.stop])
    todo = cases(args.quick)
    t0 = time.time()
    chunks = [todo[i::args.workers] for i in range(args.workers)]
    import multiprocessing as mp
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        failures = [f for part in pool.map(_compile_chunk, chunks) for f in part]
    print(f"compiled {len(todo)} variants in {time.time() - t0:.0f}s; {len(failures)} failed", flush=True)
    for f in failures:
        print("  COMPILE FAIL", *f, flush=True)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ceilings = {"hbm_gbs": common.hbm_bandwidth_gbs(), "l2_gbs": common.l2_bandwidth_gbs(), "sms": sms}
    dense = {}
    for dt in ("bf16", "fp16", "fp32"):
        a = torch.randn(8192, C, device="cuda").to(common.DTYPES[dt])
        b = torch.randn(C, K, device="cuda").to(common.DTYPES[dt])
        dense[dt] = 2 * 8192 * C * K / common.time_ms(lambda: a @ b) / 1e9
    ceilings["dense_tflops"] = dense
    ceilings["small_n"] = small_n_ceilings(ceilings["hbm_gbs"])
    print(json.dumps(ceilings), flush=True)

    rows = []
    for case in todo:
        n, bs, d, dt, op, impl, cfg, waves = case
        row = dict(N=n, bs=bs, density=d, dtype=dt, op=op, impl=impl, cfg=asdict(cfg), waves=waves)
        try:
            p = problem(n, bs, d, dt)
            call = make_call(p, op, impl, cfg, waves)
            with common.poisoned_empty():
                out = call()
            row["rel_err"] = common.rel_err(out, p.ref(op))
            row["ok"] = row["rel_err"] <= common.tolerance(p.dtype)
            if n <= 512:
                ms = common.time_rotating_ms(lambda: rotating_calls(p, op, impl, cfg, waves))
                row["ms"] = ms
                row["hbm_frac"] = bytes_moved(p, op) / ms / 1e6 / ceilings["hbm_gbs"]
            else:
                ms = common.time_ms(call)
                row["ms"] = ms
            row["tflops"] = p.useful_flops / ms / 1e9
            row["frac_of_dense"] = row["tflops"] / dense[dt]
            row["real_density"] = p.density
        except Exception as exc:
            row["error"] = repr(exc)[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)

    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       ceilings=ceilings, rows=rows), f, indent=1)
    best = {}
    for r in rows:
        if r.get("ok"):
            key = (r["N"], r["dtype"], r["op"], r["bs"], r["density"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    print(f"\n{'N':>5} {'dt':>4} {'op':>5} {'bs':>3} {'dens':>5} {'impl':>4} {'cfg':<28} "
          f"{'ms':>8} {'frac':>5} {'hbm':>5}")
    for key in sorted(best):
        r = best[key]
        c = r["cfg"]
        cs = " ".join(f"{k}{v}" for k, v in c.items()) + (f" w{r['waves']}" if r["waves"] else "")
        print(f"{r['N']:>5} {r['dtype']:>4} {r['op']:>5} {r['bs']:>3} {r['density']:>5} {r['impl']:>4} "
              f"{cs:<28} {r['ms']:8.4f} {r['frac_of_dense']:5.2f} {r.get('hbm_frac', 0):5.2f}")
    bad = [r for r in rows if not r.get("ok")]
    print(f"{len(rows)} variants, {len(bad)} failed or inaccurate")
    for r in bad:
        print("  BAD", json.dumps(r))


def kernel_us(fns):
    """GPU µs per call of each kernel the calls ``fns`` launch (by kernel name), eagerly."""
    from torch.profiler import ProfilerActivity, profile

    for f in fns:
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for f in fns:
            f()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        total = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if total > 0:
            out[e.key[:60]] = round(total / len(fns), 2)
    return out


def _warm_isolated(chunk):
    """Worker: run each (key, op, impl, cfg, waves) once, filling Triton's on-disk cache."""
    failures = []
    for key, op, impl, cfg, waves in chunk:
        try:
            make_call(keyed_problem(key), op, impl, cfg, waves)()
        except Exception as exc:  # the timing loop reports it again
            failures.append(repr(exc)[:200])
    torch.cuda.synchronize()
    return failures


def isolated(args, todo):
    """Sweeps 6 and 7: each variant checked against float64, then timed in CUDA graphs over
    rotating operand copies (GPU time, as a training step sees it), three rounds interleaved with
    cuBLAS's ``x @ W`` of the same dense shape.  One JSON line per variant is appended to
    ``--out``; variants run from ``--start`` on, and the index of each is written to
    ``<out>.started`` before it runs, so that a caller can resume past a variant that kills the
    CUDA context."""
    global C, K
    if args.workers > 1:  # compile every variant first, in parallel (one problem per worker at a time)
        import multiprocessing as mp

        t0, rest = time.time(), todo[args.start:]
        chunks = [rest[i::args.workers] for i in range(args.workers)]
        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            failed = sum(len(f) for f in pool.map(_warm_isolated, chunks))
        print(f"warmed {len(rest)} variants in {time.time() - t0:.0f}s; {failed} failed", flush=True)
    dense = {}
    for i in range(args.start, len(todo)):
        with open(args.out + ".started", "w") as f:
            f.write(str(i))
        key, op, impl, cfg, waves = todo[i]
        p = keyed_problem(key)
        C, K = p.C, p.K
        if key not in dense:
            dense.clear()
            sets = [(p.x.clone(), torch.randn(p.C, p.K, device="cuda").to(p.dtype)) for _ in range(8)]
            dense[key] = common.GraphTimer(lambda: [(lambda a=a, w=w: a @ w) for a, w in sets])
        row = dict(index=i, problem=list(key), N=p.N, C=p.C, K=p.K, bs=p.bs, density=p.density, op=op, impl=impl,
                   cfg=asdict(cfg), waves=waves)
        try:
            with common.poisoned_empty():
                out = make_call(p, op, impl, cfg, waves)()
            row["rel_err"] = common.rel_err(out, p.ref(op))
            row["ok"] = row["rel_err"] <= common.tolerance(p.dtype)
            row["bytes"] = bytes_moved(p, op)
            timer = common.GraphTimer(lambda: rotating_calls(p, op, impl, cfg, waves))
            ours, base = [], []
            for _ in range(3):
                ours.append(timer.median_ms(10) * 1e3)
                base.append(dense[key].median_ms(10) * 1e3)
            row["us"], row["dense_us"] = sorted(ours)[1], sorted(base)[1]
            row["x_dense"] = row["us"] / row["dense_us"]
            del timer
            if args.profile:
                try:
                    row["kernel_us"] = kernel_us(rotating_calls(p, op, impl, cfg, waves))
                except Exception as exc:  # the timing stands without it
                    row["kernel_us"] = repr(exc)[:200]
        except Exception as exc:
            row["error"] = repr(exc)[:300]
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        c = " ".join(f"{k}{v}" for k, v in row["cfg"].items())
        print(f"{i:>2} {key[0]} {p.C}x{p.K} {op:>5} {impl:>4} {c:<60} w{waves} {row.get('us', float('nan')):8.1f} us "
              f"{row.get('x_dense', float('nan')):5.2f}x dense ok={row.get('ok')} {row.get('error', '')}", flush=True)
        if "CUDA error" in row.get("error", ""):
            sys.exit(3)  # the context is lost: the caller resumes at the next variant


def smoke():
    """Every variant kind once on tiny CPU problems through Triton's interpreter."""
    global C, K
    C = K = 256
    seen = set()
    for n, bs, d, dt, op, impl, cfg, waves in cases():
        kind = (n <= 512, bs, op, impl, cfg.G, waves is not None, getattr(cfg, "BK", 0),
                getattr(cfg, "UNROLL", 1))
        if kind in seen or dt == "fp16":
            continue
        seen.add(kind)
        small = type(cfg)(**{**asdict(cfg), **({"BM": 16} if hasattr(cfg, "BM") else {"BK": 16})})
        p = common.Problem(C, K, 32 if n <= 512 else 48, bs, d, common.DTYPES[dt], seed=bs, device="cpu")
        with common.poisoned_empty():
            out = make_call(p, op, impl, small, waves)()
        err = common.rel_err(out, p.ref(op))
        print(f"smoke {op} {impl} bs{bs} d{d} {dt} {small} waves={waves}: rel_err {err:.2e}", flush=True)
        assert err <= common.tolerance(p.dtype), err
    print(f"smoke: {len(seen)} variant kinds OK")


if __name__ == "__main__":
    main()
