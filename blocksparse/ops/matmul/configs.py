"""Tile configurations of the matmul kernels -- the one place that lists them.

The JIT path (PyTorch) picks a configuration per call from these tables; the ahead-of-time compiler
(TensorFlow GPU path) compiles the specialisations listed here.  The numbers come from the sweeps
of ``bench/tune_bsmm.py`` on an H200 (``bench/results/raw/``): TMA kernels on Hopper and newer, the
pointer-load kernels elsewhere (and where tensor descriptors cannot address the activations).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["AOT_PACKINGS", "XpropConfig", "UpdatConfig", "xprop_config", "updat_config", "unaligned_updat",
           "updat_split", "output_slice",
           "bprop_pretransposes_weight", "KERNEL_BLOCK_SIZES",
           "INTERPRETER_XPROP", "INTERPRETER_UPDAT", "SMALL_N", "AotSpec", "AOT_DTYPES",
           "aot_specializations"]

#: Block sizes the Triton kernels handle; smaller blocks take the reference path.
KERNEL_BLOCK_SIZES = (16, 32, 64, 128)

#: Token count up to which a product is memory bound (the weights dominate the bytes).
SMALL_N = 512


@dataclass(frozen=True)
class XpropConfig:
    """fprop/bprop tile.

    ``BM`` tokens x ``G`` output blocks per program (``G`` in 1, 2, 4); each ``BN`` features of an
    output block may get their own program (0: the whole block; ``G`` 1); the TMA kernel walks each
    block's reduction in steps of ``BK`` and unrolls its loop ``UNROLL`` times; the pointer kernel
    takes ``KB`` table entries a step (``G`` 1: few tokens, where the bytes in flight bound it).  ``WAVES``: split long
    reductions over several programs (float32 atomics) until about ``WAVES`` programs per SM run
    (0: never split).  ``TMA``: use the TMA kernel where it can run.  ``PREFETCH``: the TMA kernel
    walks its table one step ahead, so its tile loads get ``num_stages - 1`` steps of lead instead
    of ``(num_stages - 1) // 2`` (:mod:`.xprop_tma`).  ``PERSIST``: on layouts whose output
    columns hold equally many blocks, ``PERSIST`` programs per SM deal the output tiles
    (:mod:`.xprop_persistent`; 0: a program per tile); ``SUBTILE``: they store each tile in two halves.
    """

    BM: int
    G: int
    num_warps: int
    num_stages: int
    BK: int = 0
    UNROLL: int = 1
    BN: int = 0
    WAVES: int = 2
    TMA: bool = True
    KB: int = 1
    PREFETCH: bool = False
    PERSIST: int = 0
    SUBTILE: bool = False


@dataclass(frozen=True)
class UpdatConfig:
    """updat tile: ``G`` blocks of one layout row x ``BK`` tokens per step; ``WAVES`` as for
    :class:`XpropConfig`, by splitting the tokens; ``TMA``: use the TMA kernel where it can run."""

    G: int
    BK: int
    num_warps: int
    num_stages: int
    WAVES: int = 2
    TMA: bool = True


X, U = XpropConfig, UpdatConfig

#: Small tiles for Triton's CPU interpreter (tests): its cost grows with tile area.
INTERPRETER_XPROP = X(BM=16, G=1, num_warps=4, num_stages=1, TMA=False)
INTERPRETER_UPDAT = U(G=1, BK=16, num_warps=4, num_stages=1, TMA=False)

# (TMA kernels on sm_90+, pointer kernels otherwise) x (16-bit, float32) x (many, few tokens).
# PREFETCH where sweep 10 found it faster (bench/results/raw/tune-prefetch-h200.jsonl, H200): 16-bit
# bs 32 / 64 at 8192 tokens 0.97 / 0.91 of the time without at d = 0.5, few tokens 0.73-0.96; bs 128
# at many tokens was 2-5% slower with it, float32 bs 64 at few tokens mixed.  Its second part
# (raw/tune-prefetch-more-h200.jsonl): float32 bs 16 at 8192 tokens 0.92 of the time with it (bs 32-128
# within 2%, kept); few-token bs 32 split to ~4 programs per SM, not 8 (0.94-0.95); few-token bs 16
# on the pointer kernel, 8 blocks a step, split to ~4 per SM: 0.70 / 0.77 of the TMA tile's time
# (fprop / bprop, d = 0.5), 0.72 at d = 0.25.  16-bit bs 128 at many tokens: [256, 128] output tiles,
# 8 warps, 4 stages walking the table ahead (sweeps 15 / 16, raw/tune-short-h200.jsonl,
# raw/tune-bm256-h200.jsonl): 0.88-0.93 of the [128, 128] tile's time at d = 0.5 (8192 tokens),
# 0.96 at 2048, 0.97-1.05 at d = 0.1-0.25; the large pixelfly MLP's layers 0.89-1.06 (-26 µs a step).
_XPROP = {
    ("tma", "16bit", "large"): {16: X(256, 1, 8, 6, UNROLL=2), 32: X(256, 1, 8, 4, PREFETCH=True),
                                64: X(256, 1, 8, 5, PREFETCH=True), 128: X(256, 1, 8, 4, BK=64, PREFETCH=True)},
    ("tma", "16bit", "small"): {16: X(64, 1, 4, 3, WAVES=4, KB=8, TMA=False),
                                32: X(64, 1, 4, 3, WAVES=4, PREFETCH=True),
                                64: X(64, 1, 4, 3, BN=32, WAVES=4, PREFETCH=True),
                                128: X(64, 1, 4, 6, BN=32, WAVES=0, PREFETCH=True)},
    ("tma", "fp32", "large"): {16: X(128, 1, 4, 3, PREFETCH=True), 32: X(128, 1, 4, 3), 64: X(64, 1, 4, 3),
                               128: X(64, 1, 4, 3, BK=32)},
    ("tma", "fp32", "small"): {16: X(64, 1, 4, 2, WAVES=8), 32: X(64, 1, 4, 3, WAVES=8, PREFETCH=True),
                               64: X(64, 1, 4, 2, WAVES=8),
                               128: X(64, 1, 4, 3, BK=32, BN=32, WAVES=8, PREFETCH=True)},
    ("ptr", "16bit", "large"): {16: X(128, 4, 4, 4, TMA=False), 32: X(128, 1, 4, 4, TMA=False),
                                64: X(128, 1, 4, 3, TMA=False), 128: X(128, 1, 8, 3, TMA=False)},
    ("ptr", "16bit", "small"): {bs: X(64, 1, 4, 3, WAVES=4, TMA=False) for bs in KERNEL_BLOCK_SIZES},
    ("ptr", "fp32", "large"): {16: X(64, 1, 4, 3, TMA=False), 32: X(64, 1, 4, 3, TMA=False),
                               64: X(128, 1, 8, 3, TMA=False), 128: X(128, 1, 8, 3, TMA=False)},
    ("ptr", "fp32", "small"): {bs: X(64, 1, 4, 2, WAVES=4, TMA=False) for bs in KERNEL_BLOCK_SIZES},
}
# updat at blocks of 64: two blocks of a layout row a program (one activation tile for both), 3
# stages -- sweep 12 (raw/tune-updat-h200.jsonl, bf16, 8192 tokens, C = K = 4096): 369 µs against
# 411 for the former G = 1 / 4 stages at d = 0.5, 221 against 218 at d = 0.25.
_UPDAT = {
    ("16bit", "large"): {16: U(8, 64, 4, 4, TMA=False), 32: U(8, 64, 8, 3, TMA=False), 64: U(2, 64, 4, 3),
                         128: U(1, 64, 4, 5)},
    ("16bit", "small"): {16: U(8, 64, 4, 3, TMA=False), 32: U(1, 64, 4, 3), 64: U(1, 64, 4, 3),
                         128: U(1, 64, 4, 3)},
    ("fp32", "large"): {16: U(8, 32, 4, 3, TMA=False), 32: U(4, 32, 4, 3, TMA=False),
                        64: U(1, 32, 4, 3, TMA=False), 128: U(1, 16, 8, 3, TMA=False)},
    ("fp32", "small"): {16: U(8, 32, 4, 2, TMA=False), 32: U(4, 32, 4, 2, TMA=False),
                        64: U(2, 32, 4, 2, TMA=False), 128: U(1, 32, 8, 2, TMA=False)},
}
#: Where activations arrive as ``(C, N)`` (``axis=0``: the kernels read their tiles transposed), the
#: float32 tiles above that spill registers: Triton's float32 FMA product of a transposed tile held
#: 32 registers and 3.5-5.6 KB of stack a thread at blocks of 64 and 128 (1.5 KB for the few-token
#: pointer tile, 0.35-0.65 KB for two more), where these hold 128-203 registers and spill nothing
#: (``python -m blocksparse.aot.resources``; ``test/ops/matmul/test_matmul_tile_resources.py``).
#: Timed on the H200 (8192 x 4096, d = 0.25, fprop / bprop each): the pointer kernel reads these
#: tiles faster than the TMA kernel -- 1605 / 1626 µs against 2491 / 2551 at blocks of 32, 1616 /
#: 1617 against 2347 / 2376 at 64, as fast as the ``(N, C)`` products (1645 / 1676, 1610 / 1641);
#: fprop 2099 against 2727 at 128 (``(N, C)``: 1900).
_XPROP_T = {
    ("tma", "fp32", "large"): {32: X(128, 1, 4, 3, TMA=False), 64: X(64, 1, 4, 4, TMA=False),
                               128: X(64, 1, 8, 3, TMA=False)},
    ("ptr", "fp32", "large"): {32: X(128, 1, 4, 3, TMA=False), 64: X(64, 1, 4, 4, TMA=False),
                               128: X(64, 1, 8, 3, TMA=False)},
    ("ptr", "fp32", "small"): {128: X(32, 1, 4, 2, WAVES=4, TMA=False)},
    # the (N, C) few-token tile of blocks of 64 (whole 64-feature slices) spilled 3.9 KB here
    ("tma", "fp32", "small"): {64: X(64, 1, 4, 3, BN=32, WAVES=4)},
    # 16-bit bs 128: the [256, 128] tile of (N, C) activations was timed on those only; (C, N) keeps this
    ("tma", "16bit", "large"): {128: X(128, 1, 4, 6, BK=64)},
}
#: Regular layouts (every output column holds equally many blocks: butterfly / pixelfly, banded,
#: block-diagonal) on ``(N, C)`` activations: persistent programs deal the output tiles
#: (:mod:`.xprop_persistent`), each tile's store overlapping the next one's first loads.  Keyed
#: like the tables above ((16-bit, float32), (large, small)) -> block size -> tile.  Empty: on the
#: large pixelfly MLP every candidate of ``bench/tune_bsmm.py --persist`` (sweep 17) was 1.02-1.6x
#: slower than the tables' one-tile programs (bench/README.md, "Sweep 17").
PERSISTENT_XPROP: dict = {}
#: The pointer kernels' updat tables where TMA cannot run (same shapes, no descriptors).
_UPDAT_PTR = {16: U(8, 64, 4, 4, TMA=False), 32: U(8, 64, 8, 3, TMA=False), 64: U(2, 64, 4, 4, TMA=False),
              128: U(1, 64, 8, 3, TMA=False)}


def _classes(n_tokens, float32):
    return ("fp32" if float32 else "16bit"), ("small" if n_tokens <= SMALL_N else "large")


def _xprop_table(variant, classes, block_size, axis):
    transposed = _XPROP_T.get((variant, *classes), {}).get(block_size) if axis == 0 else None
    return transposed or _XPROP[(variant, *classes)][block_size]


def xprop_config(block_size, n_tokens, *, float32=False, tma=True, interpret=False, axis=1):
    """Tile configuration of fprop/bprop for ``n_tokens`` tokens of activations whose features lie
    on ``axis``."""
    if interpret:
        return INTERPRETER_XPROP
    return _xprop_table("tma" if tma else "ptr", _classes(n_tokens, float32), block_size, axis)


def persistent_xprop_config(block_size, n_tokens, *, float32=False, axis=1):
    """The persistent fprop / bprop tile of a regular layout (:data:`PERSISTENT_XPROP`), or None."""
    if axis != 1:
        return None
    return PERSISTENT_XPROP.get(_classes(n_tokens, float32), {}).get(block_size)


def output_slice(cfg, block_size, tma):
    """Features of one output block per fprop / bprop program: ``cfg.BN`` (0: the whole block) for
    the TMA kernel and for the pointer kernel's single-block groups; pointer-kernel groups of
    ``G > 1`` blocks always take whole blocks."""
    return (cfg.BN or block_size) if tma or cfg.G == 1 else block_size


def unaligned_updat(cfg):
    """The 16-bit updat tile for ``(F, N)`` activations whose token count is not a multiple of 16:
    the pointer kernel then loads them element by element, and the tables' tiles (4 warps, or 64
    tokens a step) spilled 0.22-2.1 KB a thread; 8 warps and 32 tokens a step spill nothing at
    every block size (``num_stages`` changed nothing: scalar loads are not pipelined; 2 here).  Same ``G``."""
    return replace(cfg, BK=32, num_warps=8, num_stages=2, TMA=False)


def updat_config(block_size, n_tokens, *, float32=False, tma=True, interpret=False, axis=1):
    """Tile configuration of updat for ``n_tokens`` tokens of activations whose features lie on ``axis``."""
    if interpret:
        return INTERPRETER_UPDAT
    cfg = _UPDAT[_classes(n_tokens, float32)][block_size]
    if cfg.TMA and not tma:
        cfg = _UPDAT_PTR[block_size]
    if axis == 0 and not float32 and n_tokens % 16:
        cfg = unaligned_updat(cfg)
    return cfg


def bprop_pretransposes_weight(float32):
    """Whether bprop reads the weight with every block transposed beforehand (``W[b].T``, packed)
    instead of transposing tiles in the kernel: exact float32 products read transposed tiles
    about 50x slower on sm_90, and one pass over the (small) weight costs less.  The JIT launcher
    and the TensorFlow op library both follow this."""
    return bool(float32)


def updat_split(cfg, n_tokens, groups, sms):
    """Token slices of an updat call (reduced by float32 atomics when more than one): enough
    programs for about ``cfg.WAVES`` per SM, each slice at least ``4 * cfg.BK`` tokens long.

    ``groups``: rows of the ``updat_groups(cfg.G)`` table; ``sms``: the GPU's multiprocessors.
    The TensorFlow op library computes the same in C (``bsk_updat_split``).
    """
    return max(1, min(cfg.WAVES * sms // groups, math.ceil(n_tokens / (4 * cfg.BK))))


# --- Ahead-of-time specialisations (the TensorFlow GPU path) --------------------------------

#: Dtypes of the ahead-of-time kernels, by Triton's names (activations and weight alike).
AOT_DTYPES = ("fp16", "bf16", "fp32")
#: Packings (:attr:`blocksparse.layout.Layout.packing`) the kernel library also compiles, by block
#: size: layers of blocks of 48 (refined to 16) and 256 (refined to 128), the pixelfly discussion's,
#: whose refined layouts then read and write the weight in its own storage.  Their specs are the
#: ``(N, F)`` ones the PyTorch plans choose (no float32 atomics).  Other packings run on the JIT.
AOT_PACKINGS = {16: (3,), 128: (2,)}


@dataclass(frozen=True)
class AotSpec:
    """One kernel compiled ahead of time for the TensorFlow op library.

    ``arch``: compute capability as ``10 * major + minor`` (80, 90); ``product``: ``"fprop"``,
    ``"bprop"`` or ``"updat"``; ``dtype``: Triton's name of the activation / weight dtype;
    ``axis``: the feature axis of the activations; ``kernel``: the Triton kernel
    (``xprop_kernel``, ``xprop_tma_kernel``, ``updat_kernel``, ``updat_tma_kernel``); ``atomic``:
    float32 atomic reduction of split token slices (updat) or of split reductions (few-token
    fprop / bprop); ``config``: the tile; ``max_tokens``: the calls the tile is for, those of at
    most this many tokens (:data:`SMALL_N`: the few-token tile), or any (0).  The weight gradient
    is written in float32 (what the TensorFlow ops take), except by ``dw16`` specs.  ``n16``: a
    pointer kernel compiled for token counts that are multiples of 16 (``N``, and for ``(F, N)``
    activations their feature strides, carry that hint): for ``(F, N)`` activations loads along
    tokens are vectorised (the ahead-of-time kernels without it read them element by element, 8x
    slower for the bf16 updat at blocks of 32); a float32 pointer updat on ``(N, F)`` activations,
    whose reduction runs over tokens, drops most of its masks (the JIT, which sees ``N``, was 3.5%
    faster on the float32 updat at blocks of 32 without it).  ``dw16``: an updat without atomics that writes the weight gradient in the
    activations' 16-bit dtype itself (one rounding of the float32 sums, as the cast it saves), for
    the PyTorch plans: one launch and one op less in every backward.  ``ticket``: the split
    reduction finished in the kernel (:mod:`.ticket`: a zeroed workspace and counters the caller
    keeps; the output in the activations' dtype, the bias added by fprop), for the PyTorch plans:
    no zero fill and no cast around the launch.  ``pack``: the weight's packing
    (:attr:`blocksparse.layout.Layout.packing`; :data:`AOT_PACKINGS`).
    """

    arch: int
    product: str
    dtype: str
    block_size: int
    axis: int
    kernel: str
    atomic: bool
    config: XpropConfig | UpdatConfig
    max_tokens: int = 0
    n16: bool = False
    dw16: bool = False
    ticket: bool = False
    pack: int = 1

    @property
    def name(self):
        """A C identifier naming the specialisation, unique within one build."""
        kernel = self.kernel.removesuffix("_kernel")
        atomic = "_atomic" if self.atomic else ""
        few = "_few" if self.max_tokens else ""
        n16 = "_n16" if self.n16 else ""
        dw16 = "_dw16" if self.dw16 else ""
        ticket = "_ticket" if self.ticket else ""
        pack = f"_pack{self.pack}" if self.pack > 1 else ""
        return (f"{self.product}_{self.dtype}_bs{self.block_size}_ax{self.axis}_{kernel}{atomic}{few}{n16}{dw16}"
                f"{ticket}{pack}_sm{self.arch}")

    @property
    def aligned(self):
        """Whether the spec is compiled with every bound its loads are masked by divisible by 16:
        ``n16`` twins, and the products of ``(N, C)`` activations (their masked bounds are whole
        blocks); the others serve token counts of any size."""
        return self.n16 or (self.axis == 1 and self.product != "updat")

    @property
    def group(self):
        """``G`` of the lookup table the kernel reads."""
        return self.config.G

    @property
    def trans_w(self):
        """``TRANS_W`` of the kernel: bprop transposes weight tiles itself, except where it reads
        pre-transposed blocks (:func:`bprop_pretransposes_weight`)."""
        return self.product == "bprop" and not bprop_pretransposes_weight(self.dtype == "fp32")

    @property
    def tma(self):
        """Whether the kernel moves tiles with tensor descriptors (needs aligned rows)."""
        return "_tma" in self.kernel


def _aot_xprop(arch, product, dtype, bs, axis, size):
    """fprop / bprop specs with the ``size`` ("large", "small") tile; few-token tiles that split
    long reductions (``WAVES``) come with and without float32 atomics."""
    classes = ("fp32" if dtype == "fp32" else "16bit", size)
    cfg = _xprop_table("tma" if arch >= 90 else "ptr", classes, bs, axis)
    kernels = [("xprop_kernel", cfg)]
    if arch >= 90 and cfg.TMA:
        kernels = [("xprop_tma_kernel", cfg)]
        if axis == 0:
            # (F, N) rows are not 16-byte aligned for every N: the pointer kernel serves those calls,
            # reading the same table (so the same G)
            kernels.append(("xprop_kernel", replace(_xprop_table("ptr", classes, bs, axis), G=cfg.G)))
    atomics = (False, True) if size == "small" else (False,)
    max_tokens = SMALL_N if size == "small" else 0
    return [AotSpec(arch, product, dtype, bs, axis, kernel, atomic, c, max_tokens)
            for kernel, c in kernels for atomic in atomics if not atomic or c.WAVES]


def _aot_updat(arch, dtype, bs, axis, size):
    cfg = _UPDAT[("fp32" if dtype == "fp32" else "16bit", size)][bs]
    if not cfg.TMA:
        kernels = [("updat_kernel", cfg)]
    elif arch < 90:
        kernels = [("updat_kernel", _UPDAT_PTR[bs])]
    else:
        kernels = [("updat_tma_kernel", cfg)]
        if axis == 0:  # as for xprop: unaligned (F, N) rows, same table
            kernels.append(("updat_kernel", replace(_UPDAT_PTR[bs], G=cfg.G)))
    max_tokens = SMALL_N if size == "small" else 0
    return [AotSpec(arch, "updat", dtype, bs, axis, kernel, atomic, c, max_tokens)
            for kernel, c in kernels for atomic in (False, True)]


def _n16_updat(spec):
    """Whether an ``(N, F)`` updat gets an ``n16`` twin: float32 only.  Timed on the H200
    (``bench/results/aot-vs-jit-h200*.md``), the hint made the float32 bs 32 updat 3-4% faster
    (as fast as the JIT); the 16-bit one it made 15% slower at density 0.1 and 5% faster at 0.5."""
    return spec.product == "updat" and spec.dtype == "fp32"


def _serves_unaligned_updat(spec):
    """Whether ``spec`` is a 16-bit ``(F, N)`` pointer updat for token counts not a multiple of 16."""
    return spec.product == "updat" and spec.axis == 0 and spec.dtype != "fp32" and not (spec.n16 or spec.tma)


def _kind(spec):
    """What a call selects a spec by, less the kernel."""
    return spec.arch, spec.product, spec.dtype, spec.block_size, spec.axis, spec.atomic, spec.max_tokens


def aot_specializations(archs=(80, 90), *, dtypes=AOT_DTYPES, block_sizes=KERNEL_BLOCK_SIZES):
    """Every kernel the TensorFlow op library compiles ahead of time, for ``archs``.

    Per arch, dtype, block size and feature axis, for many tokens (``max_tokens`` 0) and for few
    (at most :data:`SMALL_N`, with the tiles the JIT path picks for them): fprop and bprop (the
    few-token tiles that split long reductions also with float32 atomics), and updat with and
    without float32 atomics (token slices); every split one also finished in the kernel (``ticket``).  On sm_90 and newer the TMA kernels where the tables
    ask for them, plus pointer kernels with the same ``G`` for (F, N) activations whose rows
    descriptors cannot address.  The pointer kernels compiled for sm_80 run on every sm_8x GPU.

    The many-token specs of one product share one ``G``, the one the TensorFlow ops build their
    tables with; a few-token spec that reads another ``G`` serves the PyTorch plans (they build
    tables per call shape), and the TensorFlow ops' few-token calls fall back to the many-token
    spec there.

    >>> specs = aot_specializations((90,), dtypes=("bf16",), block_sizes=(64,))
    >>> sorted({s.kernel for s in specs})
    ['updat_kernel', 'updat_tma_kernel', 'xprop_kernel', 'xprop_tma_kernel']
    """
    specs = []
    for arch in archs:
        for dtype in dtypes:
            for bs in block_sizes:
                for axis in (1, 0):
                    for size in ("large", "small"):
                        for product in ("fprop", "bprop"):
                            specs += _aot_xprop(arch, product, dtype, bs, axis, size)
                        specs += _aot_updat(arch, dtype, bs, axis, size)
    # (F, N) pointer kernels, and float32 pointer updat kernels (a reduction over tokens), also for
    # token counts that are multiples of 16, where no TMA kernel serves those counts (it does wherever
    # rows are aligned: then the pointer kernel stands in only for counts that are not multiples of 16)
    served = {_kind(s) for s in specs if s.tma}
    specs += [replace(s, n16=True) for s in specs
              if (s.axis == 0 or _n16_updat(s)) and not s.tma and _kind(s) not in served]
    # the (F, N) pointer updat kernels left for other token counts load element by element: their own tile
    specs = [replace(s, config=unaligned_updat(s.config)) if _serves_unaligned_updat(s) else s for s in specs]
    # updat without atomics also writing 16-bit weight gradients itself (the PyTorch plans' choice;
    # the TensorFlow ops take float32 and never select these)
    specs += [replace(s, dw16=True) for s in specs if s.product == "updat" and not s.atomic and s.dtype != "fp32"]
    # every split reduction also finished in the kernel (the PyTorch plans' choice: no zero fill, no cast)
    specs += [replace(s, atomic=False, ticket=True) for s in specs if s.atomic]
    # a few-token spec identical to a many-token one adds nothing: that one serves every count
    many = {replace(s, max_tokens=SMALL_N) for s in specs if not s.max_tokens}
    specs = [s for s in specs if s not in many]
    # packed weights (refined layers) for the PyTorch plans
    specs += [replace(s, pack=p) for s in specs if s.axis == 1 and not s.atomic
              for p in AOT_PACKINGS.get(s.block_size, ())]
    return tuple(specs)
