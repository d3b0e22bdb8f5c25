"""Framework-neutral pieces of the portable path, the refinement and the output grouping: the
tables walked entry by entry, the refined weight against the dense matrix, the grouping decision
on layouts whose answer is known; the grouped kernels through Triton's interpreter."""
import doctest

import numpy as np
import pytest

import blocksparse.ops.matmul.refine as refine_mod
from blocksparse.layout import Layout
from blocksparse.layouts.butterfly import butterfly_layout, random_row_layout
from blocksparse.ops.matmul import configs, grouping
from blocksparse.ops.matmul.portable import row_tables
from blocksparse.ops.matmul.refine import refine, refined_block_size
from blocksparse.testing.matmul import random_layout


def test_doctests():
    assert doctest.testmod(refine_mod).failed == 0


@pytest.mark.parametrize("z_order", [False, True], ids=["row-major", "z-order"])
def test_row_tables_walk(rng, z_order):
    lay = Layout(random_layout(rng, 9, 7, 0.45, empty_rows=2, empty_cols=1), 3, any_block_size=True,
                 z_order=z_order)
    t = row_tables(lay)
    counts = lay.mask.sum(axis=1)
    assert sorted(g.m for g in t.groups) == sorted(set(counts[counts > 0]))
    seen_rows = np.concatenate([g.rows for g in t.groups])
    assert sorted(seen_rows) == list(np.flatnonzero(counts))
    start = 0
    for g in t.groups:
        r, m = g.blocks.shape
        assert (counts[g.rows] == m).all() and g.all_rows == (r == lay.CB)
        for row, blocks in zip(g.rows, g.blocks):
            coords = lay.coords[blocks]
            assert (coords[:, 0] == row).all() and list(coords[:, 1]) == sorted(coords[:, 1])
        np.testing.assert_array_equal(t.order[start:start + r * m], g.blocks.ravel())
        if g.first >= 0:
            np.testing.assert_array_equal(g.blocks.ravel(), np.arange(g.first, g.first + r * m))
        start += r * m
    assert sorted(t.order) == list(range(lay.blocks))
    np.testing.assert_array_equal(t.table_cols, lay.coords[t.order, 1])
    for k in range(lay.KB):  # bag k: exactly the table rows of output column k
        end = t.bag_offsets[k + 1] if k + 1 < lay.KB else t.blocks
        assert sorted(t.bag_index[t.bag_offsets[k]:end]) == list(np.flatnonzero(t.table_cols == k))
    assert t.identity_order == bool((t.order == np.arange(t.blocks)).all())


def test_row_tables_of_a_fixed_row_layout_need_no_gathers(rng):
    lay = Layout(random_row_layout(6, 10, 3, rng=rng), 5, any_block_size=True)
    t = row_tables(lay)
    assert len(t.groups) == 1 and t.groups[0].all_rows and t.groups[0].first == 0 and t.identity_order


@pytest.mark.parametrize("bs, fine", [(48, 16), (256, 128), (64, 16), (6, 2)])
@pytest.mark.parametrize("z_order", [False, True], ids=["row-major", "z-order"])
def test_refinement_describes_the_same_weight(rng, bs, fine, z_order):
    mask = random_layout(rng, 3, 4, 0.5)
    mask[0, :2] = True  # a coarse row of two blocks: the fine numbering then differs from row-major
    lay = Layout(mask, bs, any_block_size=True, z_order=z_order)
    ref = refine(lay, fine)
    r = bs // fine
    assert ref.factor == r and ref.layout.block_size == fine and ref.layout.blocks == lay.blocks * r * r
    w = rng.standard_normal(lay.w_shape)
    w_fine = w.reshape(lay.blocks, r, fine, r, fine).transpose(0, 1, 3, 2, 4).reshape(-1, fine, fine)  # no gather
    np.testing.assert_array_equal(ref.layout.dense(w_fine), lay.dense(w))
    assert ref.layout.custom_order and ref.layout != Layout(ref.layout.mask, fine, any_block_size=True)


def test_a_numbered_layout_lists_each_block_once(rng):
    mask = random_layout(rng, 4, 5, 0.5, cover=True)
    lay = Layout(mask, 16)
    order = rng.permutation(lay.blocks)
    if (order == np.arange(lay.blocks)).all():  # a numbering of its own
        order = order[::-1]
    numbered = Layout.numbered(mask, 16, lay.coords[order])
    w = rng.standard_normal(lay.w_shape)
    np.testing.assert_array_equal(numbered.dense(w[order]), lay.dense(w))
    assert numbered == Layout.numbered(mask, 16, lay.coords[order]) and numbered != lay
    assert Layout.numbered(mask, 16, lay.coords) == lay  # the same numbering
    with pytest.raises(ValueError, match=f"coords must list the layout's {lay.blocks} blocks"):
        Layout.numbered(mask, 16, lay.coords[[0] * lay.blocks])
    with pytest.raises(ValueError, match="coords must list"):
        Layout.numbered(mask, 16, lay.coords[:-1])


def test_refinement_bad_size():
    with pytest.raises(ValueError, match="block_size must divide the layout's block size 48; got 32"):
        refine(Layout([[1]], 48, any_block_size=True), 32)
    assert refined_block_size(24) == 8 and refined_block_size(24, configs.KERNEL_BLOCK_SIZES) is None


# ---------------------------------------------------------------- output groups

def test_group_stats_by_hand():
    mask = np.zeros((4, 4), dtype=bool)
    mask[0, :2] = mask[1, :2] = True           # columns 0 and 1: rows {0, 1}
    mask[2, 2] = mask[3, 3] = True             # columns 2 and 3: one row each, different
    lay = Layout(mask, 16)
    s = grouping.group_stats(lay, "fprop", 2)
    # group 0: entries (row 0, row 1) with both slots; group 1: (row 2), (row 3) with one slot each
    assert (s.entries, s.blocks) == (4, 6)
    assert s.waste == pytest.approx(1 - 6 / 8) and s.saving == pytest.approx(1 - 4 / 6)


def test_choose_group():
    adjacent = Layout(np.kron(np.eye(8, dtype=int), np.ones((1, 2), dtype=int)), 32)   # pairs of equal columns
    assert grouping.group_stats(adjacent, "fprop", 2).waste == 0
    g, speedup = grouping.choose_group(adjacent, "fprop", bm=256)
    assert g == 2 and speedup > 1.5          # bs 32 is L2 bound: half the activation tiles
    assert grouping.choose_group(adjacent, "fprop", bm=256, precision="fp32") == (1, 1.0)  # compute bound
    diag = Layout(np.eye(8, dtype=int), 32)                                               # nothing shared
    assert grouping.choose_group(diag, "fprop", bm=256) == (1, 1.0)
    assert grouping.choose_group(diag, "fprop", bm=256, max_waste=0.6)[0] == 1            # slower anyway
    rand = Layout(random_layout(np.random.default_rng(0), 64, 64, 0.25), 32)
    assert grouping.choose_group(rand, "fprop", bm=256)[0] == 1
    with pytest.raises(ValueError, match="kind must be 'fprop' or 'bprop'"):
        grouping.choose_group(diag, "updat", bm=64)


@pytest.mark.parametrize("fin, fout, bs, fine", [(2048, 8192, 128, 64), (384, 1536, 48, 16)])
def test_refined_butterflies_group(fin, fout, bs, fine):
    lay = refine(Layout(butterfly_layout(fin, fout, bs, 64), bs, any_block_size=True), fine).layout
    assert grouping.groups_well(lay)
    cfg = configs.xprop_config(fine, 8192)
    grouped = grouping.grouped_config(cfg, lay, "fprop")
    assert grouped.G == 2
    # registers: G accumulators of [BM, BN] within 128 per thread; shared memory within budget
    bn = grouped.BN or fine
    assert grouped.G * grouped.BM * bn <= 128 * 32 * grouped.num_warps
    bk = grouped.BK or fine
    assert grouped.num_stages * (grouped.BM * bk + grouped.G * bk * bn) * 2 <= 200 * 1024


def test_grouped_config_keeps_large_blocks_ungrouped_on_a_gpu():
    """Blocks of 128 group by the model but ran slower grouped on the H200: G = 1 outside the
    interpreter (whose tests keep covering the grouped kernels)."""
    lay = refine(Layout(butterfly_layout(2048, 8192, 256, 64), 256, any_block_size=True), 128).layout
    cfg = configs.XpropConfig(BM=128, G=1, num_warps=4, num_stages=6, BK=64)  # a [128, 128] tile
    assert grouping.choose_group(lay, "fprop", bm=cfg.BM)[0] == 2 and grouping.groups_well(lay)
    assert grouping.grouped_config(cfg, lay, "fprop") is cfg
    assert grouping.grouped_config(cfg, lay, "fprop", interpret=True).G == 2


@pytest.mark.parametrize("tokens", [64, 400, 512, 513, 8192])
@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("fine", [16, 32, 64])
def test_grouped_configs_satisfy_the_pointer_kernels_constraints(tokens, tma, fine):
    """Every table tile, grouped for a layout that groups well (the small pixelfly MLP's, refined),
    is one the kernels compile: the pointer kernel takes ``G > 1`` only with whole output blocks and
    one table entry a step (a 400-token call of blocks of 48 picked ``G = 2`` with ``KB = 8`` and
    failed to compile on a GPU)."""
    lay = refine(Layout(butterfly_layout(384, 1536, 48, 64), 48, any_block_size=True), 16).layout
    if fine != 16:
        lay = Layout(np.kron(np.eye(8, dtype=np.int64), np.ones((2, 2), np.int64)), fine)
    cfg = configs.xprop_config(fine, tokens, tma=tma)
    grouped = grouping.grouped_config(cfg, lay, "fprop")
    if grouped.G > 1 and not grouped.TMA:
        assert grouped.KB == 1 and configs.output_slice(grouped, fine, False) == fine
    if cfg.KB > 1:
        assert grouped is cfg


def test_grouped_config_keeps_tuned_groups_and_random_layouts():
    rand = Layout(random_layout(np.random.default_rng(1), 32, 32, 0.3), 16)
    tuned = configs.xprop_config(16, 8192, tma=False)          # the pointer table's own G = 4
    assert tuned.G == 4 and grouping.grouped_config(tuned, rand, "fprop") is tuned
    cfg = configs.xprop_config(32, 8192)
    assert grouping.grouped_config(cfg, Layout(random_layout(np.random.default_rng(2), 32, 32, 0.3), 32),
                                   "fprop") is cfg
    assert grouping.groups_well(Layout(np.ones((3, 3)), 3, any_block_size=True)) is False  # no kernel size


def test_column_order_puts_equal_columns_together():
    tiled = butterfly_layout(384, 1536, 48, 64)                # column k repeats at k + 8, k + 16, k + 24
    order, stats = grouping.column_order(tiled)
    assert sorted(order) == list(range(32))
    reordered = tiled[:, order]
    for j in range(0, 32, 4):
        assert (reordered[:, j:j + 4] == reordered[:, j:j + 1]).all()
    assert stats[4] == (0.75, 0.0) and stats[2] == (0.5, 0.0)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_kernels_through_the_plan(rng, monkeypatch, dtype):
    """A refined butterfly through BlocksparseMatMul: the plan groups outputs (G > 1) and the
    kernels agree with float64 (Triton's interpreter, tiny shapes)."""
    torch = pytest.importorskip("torch")
    from blocksparse.testing import rel_error, tolerance
    from blocksparse.testing.matmul import dense_products
    from blocksparse.torch import BlocksparseMatMul
    from blocksparse.torch._matmul import plan as _plan
    from blocksparse.torch._matmul import products

    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    lay = refine(Layout(butterfly_layout(128, 128, 32, 4, 1), 32, any_block_size=True), 16).layout
    bsmm = BlocksparseMatMul(lay, 16)
    tdt = getattr(torch, dtype)
    x = torch.from_numpy(rng.standard_normal((5, lay.C))).to(tdt).requires_grad_()
    w = torch.from_numpy(rng.standard_normal(lay.w_shape) / 4).to(tdt).requires_grad_()
    dy = torch.from_numpy(rng.standard_normal((5, lay.K))).to(tdt)
    y = bsmm(x, w)
    y.backward(dy)
    assert lay.density == 0.5
    assert products.plan_of("fprop", x.detach(), w.detach(), _plan.handle(lay, lay), 1, "ieee").config.G > 1
    refs = dense_products(lay, *(a.detach().double().numpy() for a in (x, w, dy)), 1)
    for got, ref in zip((y, x.grad, w.grad), refs):
        assert rel_error(got, ref) < tolerance(dtype)
