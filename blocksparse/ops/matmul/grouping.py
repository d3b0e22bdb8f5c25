"""How many output blocks one fprop / bprop program should own (``G``), decided from the layout.

A program of the xprop kernels walks the entries of its output group (see
:mod:`blocksparse.layout`): each entry loads one ``[BM, bs]`` activation tile and ``G`` weight blocks
and does ``G`` block products, ``-1`` slots included (they multiply zeros).  With ``E_G`` entries in
the grouped table of a layout with ``blocks`` blocks:

* activation tiles loaded fall from ``blocks`` (``G = 1``) to ``E_G``: ``saving = 1 - E_G / blocks``;
* block products done rise from ``blocks`` to ``G * E_G``: ``waste = 1 - blocks / (G * E_G)``.

Random layouts group badly (the rows of ``G`` adjacent columns barely overlap: mostly waste);
structured ones -- butterfly tiles, block-diagonal and banded layouts, and every refined layout
(:mod:`.refine`: the ``r`` fine columns of one coarse column share their rows) -- have ``G``-column
groups with no or few empty slots.  :func:`choose_group` weighs both with the L2 roofline of
``bench/README.md``: per entry the kernel moves ``(BM*bs + G*bs*bs)`` elements through L2 and does
``2*G*BM*bs*bs`` FLOPs, and takes the longer of the two times.  :func:`grouped_config` applies the
choice to a tile configuration, keeping registers and shared memory within the GPU's budget.

Column order.  Columns with equal row sets are not always adjacent (a butterfly square tiled along
the outputs repeats column ``k`` at ``k + n``).  :func:`column_order` finds a permutation of the
output blocks that makes them adjacent and reports what ``G`` would save then.  The kernels do
not take it yet: they write output group ``g`` at columns ``g*G*bs ..``, so the permutation
would have to be an output column map read in the kernels' store (free there, one table lookup
per program) -- a change of the kernels' signature that the ahead-of-time path compiles, left
for a follow-up.  The refined layouts the pixelfly layers run on get their adjacent equal
columns without it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .configs import output_slice

__all__ = ["GroupStats", "choose_group", "column_order", "group_stats", "grouped_config", "groups_well",
           "GROUPED_MAX_BLOCK", "H200_L2_BYTES_PER_S", "H200_PEAK_FLOPS"]

#: L2 read bandwidth and dense tensor-core throughput measured on the H200 (``bench/README.md``):
#: the two sides of the roofline (only their ratio matters to the choice).
H200_L2_BYTES_PER_S = 9.45e12
H200_PEAK_FLOPS = {"16bit": 720e12, "tf32": 301e12, "fp32": 51e12}
#: Largest block size whose tiles :func:`grouped_config` groups on a GPU.  Measured on the H200
#: (``bench/tune_bsmm.py --pixelfly``, ``bench/results/raw/tune-pixelfly-h200.jsonl``): on the large
#: pixelfly MLP's layouts refined to blocks of 128 -- adjacent equal columns, no empty slots, where
#: the model expects G = 2 to gain 1.19x -- the grouped tile (G = 2, 8 warps) took 1.42-1.58x the time
#: of the G = 1 tile on every product.  Smaller blocks keep the model's choice.
GROUPED_MAX_BLOCK = 64
#: Per-thread registers the accumulators may take, and the shared memory a program may use.
_ACC_REGISTERS = 128
_SHARED_BYTES = 200 * 1024


@dataclass(frozen=True)
class GroupStats:
    """Grouped-table statistics of one product of one layout (see the module docstring)."""

    group: int
    entries: int
    blocks: int

    @property
    def waste(self):
        """Fraction of the block products done that multiply an empty (``-1``) slot."""
        return 1.0 - self.blocks / (self.group * self.entries)

    @property
    def saving(self):
        """Fraction of activation tile loads saved against ``G = 1``."""
        return 1.0 - self.entries / self.blocks


def group_stats(layout, kind, group):
    """:class:`GroupStats` of ``layout``'s ``kind`` (``"fprop"`` / ``"bprop"``) table with ``group``."""
    lut = getattr(layout, kind)(None, group=group)
    return GroupStats(int(group), int(lut.entries.shape[0]), int(layout.blocks))


def _relative_time(stats, bs, bm, elem_bytes, peak):
    """Roofline time of one token tile over the whole table (seconds, up to a constant)."""
    per_entry = max((bm * bs + stats.group * bs * bs) * elem_bytes / H200_L2_BYTES_PER_S,
                    2.0 * stats.group * bm * bs * bs / peak)
    return stats.entries * per_entry


def choose_group(layout, kind, *, bm, precision="16bit", candidates=(1, 2, 4), max_waste=0.25,
                 min_gain=0.05):
    """The ``G`` of ``candidates`` the roofline model finds fastest for ``layout``'s ``kind`` table.

    Parameters
    ----------
    layout : blocksparse.layout.Layout
    kind : {"fprop", "bprop"}
    bm : int
        Tokens per program (``BM`` of the tile).
    precision : {"16bit", "tf32", "fp32"}
        Which peak throughput bounds the products.
    candidates : tuple of int
        ``G`` values the kernels take.
    max_waste : float
        Never pick a ``G`` whose table has more empty slots than this.
    min_gain : float
        A larger ``G`` must be modelled at least this much faster than ``G = 1``.

    Returns
    -------
    (int, float)
        The chosen ``G`` and its modelled speed-up over ``G = 1`` (1.0 for ``G = 1``).
    """
    if kind not in ("fprop", "bprop"):
        raise ValueError(f"kind must be 'fprop' or 'bprop'; got {kind!r}")
    bs = layout.block_size
    elem = 4 if precision != "16bit" else 2
    peak = H200_PEAK_FLOPS[precision]
    base = _relative_time(group_stats(layout, kind, 1), bs, bm, elem, peak)
    best, best_speedup = 1, 1.0
    for g in candidates:
        stats = group_stats(layout, kind, g)
        if g == 1 or stats.waste > max_waste:
            continue
        speedup = base / _relative_time(stats, bs, bm, elem, peak)
        if speedup >= (1.0 + min_gain) * best_speedup:
            best, best_speedup = g, speedup
    return best, best_speedup


def _fits(cfg, group, bs, elem_bytes):
    """``cfg`` with ``G = group``, warps raised and stages lowered to fit, or None when it cannot."""
    bn = output_slice(replace(cfg, G=group), bs, cfg.TMA)
    bk = (cfg.BK or bs) if cfg.TMA else bs
    acc = group * cfg.BM * bn
    warps = cfg.num_warps
    while acc > _ACC_REGISTERS * 32 * warps and warps < 8:
        warps *= 2
    if acc > _ACC_REGISTERS * 32 * warps:
        return None
    stage = (cfg.BM * bk + group * bk * bn) * elem_bytes
    stages = min(cfg.num_stages, _SHARED_BYTES // stage)
    if stages < min(2, cfg.num_stages):
        return None
    return replace(cfg, G=group, num_warps=warps, num_stages=max(stages, 1))


def grouped_config(cfg, layout, kind, *, float32=False, tf32=False, interpret=False):
    """``cfg`` (an :class:`~.configs.XpropConfig` with ``G = 1``) with the ``G`` that
    :func:`choose_group` picks for ``layout``, resized to fit; ``cfg`` unchanged when ``G = 1``
    wins, when the table already asks for another ``G``, when the tile takes several table entries
    a step (``KB > 1``: the few-token pointer tile, whose kernel takes ``G = 1`` only), when no
    grouped tile fits, or on a GPU for blocks larger than :data:`GROUPED_MAX_BLOCK` (measured
    slower there)."""
    if cfg.G != 1 or cfg.KB != 1 or (layout.block_size > GROUPED_MAX_BLOCK and not interpret):
        return cfg
    precision = ("tf32" if tf32 else "fp32") if float32 else "16bit"
    group, _ = choose_group(layout, kind, bm=cfg.BM, precision=precision)
    if group == 1:
        return cfg
    if interpret:  # Triton's interpreter has no register or shared-memory budget
        return replace(cfg, G=group)
    for g in (group, group // 2):
        fitted = _fits(cfg, g, layout.block_size, 4 if float32 else 2) if g > 1 else None
        if fitted is not None:
            return fitted
    return cfg


def column_order(mask):
    """A permutation of the columns of a 0/1 ``mask`` that puts columns with equal rows together.

    Returns ``(order, stats)``: ``mask[:, order]`` is the reordered layout (``order[j]`` is the old
    column at position ``j``; a stable sort on the column's row set, so equal columns keep their
    relative order) and ``stats`` maps ``G`` to ``(saving, waste)`` of the fprop table after the
    reordering.  See the module docstring for why the kernels do not use it yet.
    """
    from ...layout import Layout

    mask = np.asarray(mask, dtype=bool)
    keys = [mask[:, j].tobytes() for j in range(mask.shape[1])]
    order = np.array(sorted(range(mask.shape[1]), key=lambda j: keys[j]), dtype=np.int64)
    lay = Layout(mask[:, order], 1, any_block_size=True)
    stats = {}
    for g in (2, 4):
        s = group_stats(lay, "fprop", g)
        stats[g] = (s.saving, s.waste)
    return order, stats


def groups_well(layout, bm=128):
    """Whether the roofline model groups ``layout``'s fprop (``G > 1``, after refining it to a kernel
    block size where its own is not one): the *structured* flag of the dispatch model.  (A layout's
    structure, not the tile: :func:`grouped_config` keeps ``G = 1`` on a GPU for blocks larger than
    :data:`GROUPED_MAX_BLOCK`.)"""
    from .configs import KERNEL_BLOCK_SIZES
    from .refine import refine, refined_block_size

    fine = refined_block_size(layout.block_size, KERNEL_BLOCK_SIZES)
    if fine is None:
        return False
    if fine != layout.block_size:
        layout = refine(layout, fine).layout
    return choose_group(layout, "fprop", bm=bm)[0] > 1
