"""The implicit-GEMM plan's tables (numpy only): walked step by step they rebuild the dense masked
filter -- every connected (output, input, tap) exactly once, nothing else -- for aligned and for
arbitrary-channel layouts; tile sizes, coverage, the path rule."""
import numpy as np
import pytest

from blocksparse.ops.conv import ConvSpec
from blocksparse.ops.conv import implicit as implicit_mod
from blocksparse.ops.conv.implicit import MAX_BK, MAX_BN, worth_implicit
from blocksparse.testing.conv import layout_bck, random_bck


def walk(spec, F, gradient=False):
    """``W[k, c, tap]`` (``gradient``: ``W[c, k, tap]``) as the kernel reads it from the packed
    filter, and how often each was read."""
    plan, blocks = (spec.implicit_grad if gradient else spec.implicit), spec.blocks
    packed = F[plan.weight]
    W = np.zeros((blocks.C, blocks.K, blocks.trs) if gradient else (blocks.K, blocks.C, blocks.trs))
    reads = np.zeros(W.shape, dtype=int)
    for s_lo, s_hi, k_first, k_count, position, width in plan.tiles:
        assert 0 < k_count <= plan.block_n and s_lo < s_hi
        for tap, c_first, c_count, row in plan.steps[s_lo:s_hi]:
            assert 0 < c_count <= plan.block_k
            for dc in range(c_count):
                ks = slice(k_first, k_first + k_count)
                start = row + dc * width + position
                W[ks, c_first + dc, tap] += packed[start:start + k_count]
                reads[ks, c_first + dc, tap] += 1
    return W, reads


def dense_reference(spec, F):
    blocks = spec.blocks
    W = np.zeros((blocks.K, blocks.C, blocks.trs))
    for b, (cs, ks) in enumerate(zip(blocks.cs, blocks.ks)):
        W[np.ix_(ks, cs)] = F[blocks.offsets[b]:blocks.offsets[b + 1]].reshape(ks.size, cs.size, blocks.trs)
    return W


def aligned(rng, CB, KB, bs, density):
    mask = rng.random((CB, KB)) < density
    mask[rng.integers(0, CB, KB), np.arange(KB)] = True
    return [(range(c * bs, (c + 1) * bs), range(k * bs, (k + 1) * bs)) for c, k in np.argwhere(mask)]


LAYOUTS = {
    "aligned-16": lambda rng: aligned(rng, 4, 3, 16, 0.5),
    "aligned-128": lambda rng: aligned(rng, 2, 3, 128, 0.5),
    "uniform": lambda rng: layout_bck(rng, "uniform"),
    "random-channels": lambda rng: layout_bck(rng, "random"),
    "overlapping-outputs": lambda rng: random_bck(rng, 9, 8, 6, 4, 5),
}


@pytest.mark.parametrize("side", ["forward", "input-gradient"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("TRS", [(1,), (3, 3), (2, 1, 3)], ids=["1d-1tap", "2d-3x3", "3d"])
def test_tables_rebuild_the_dense_filter(rng, layout, TRS, side):
    bck = LAYOUTS[layout](rng)
    spec = ConvSpec(bck, TRS, (5,) * len(TRS))
    F = rng.standard_normal(spec.blocks.size)
    W, reads = walk(spec, F, gradient=side == "input-gradient")
    plan = spec.implicit_grad if side == "input-gradient" else spec.implicit
    assert not (np.concatenate([plan.steps[:, 1:].ravel(), plan.tiles[:, 2:].ravel()]) % plan.align).any()
    want = dense_reference(spec, F)
    if side == "input-gradient":
        want = want.transpose(1, 0, 2)
    np.testing.assert_array_equal(W, want)
    np.testing.assert_array_equal(reads, (want != 0).astype(int))
    assert spec.implicit.steps.dtype == np.int32 and not spec.implicit.steps.flags.writeable


def test_aligned_blocks_give_one_step_per_run_and_tap(rng):
    """Adjacent input blocks of a column merge into one run; 64-channel blocks: BK = BN = 64."""
    bck = [(range(0, 64), range(0, 64)), (range(64, 128), range(0, 64)), (range(192, 256), range(0, 64)),
           (range(0, 64), range(64, 128))]
    spec = ConvSpec(bck, (3, 3), (8, 8))
    plan = spec.implicit
    assert (plan.block_n, plan.block_k, plan.covers, plan.width, plan.align) == (64, 64, True, 64, 16)
    assert plan.tiles.shape[0] == 2
    # column 0: runs 0-127 (2 chunks) and 192-255 (1 chunk) per tap; column 1: 1 chunk per tap
    assert plan.steps.shape[0] == 9 * 3 + 9 * 1


def test_sizes_coverage_and_transposed():
    wide = ConvSpec([(range(0, 256), range(0, 256))], (1,), (4,))
    assert (wide.implicit.block_n, wide.implicit.block_k) == (MAX_BN, MAX_BK)
    assert wide.implicit.tiles.shape[0] == 256 // MAX_BN
    narrow = ConvSpec([([0, 2], [1])], (3,), (4,))  # output channel 0 unwritten
    assert (narrow.implicit.block_n, narrow.implicit.block_k, narrow.implicit.covers) == (16, 16, False)
    assert narrow.implicit.align == 1 and wide.implicit.align == 16
    eight = ConvSpec([(range(8, 16), range(0, 8)), (range(0, 8), range(8, 24))], (3,), (4,))
    assert eight.implicit.align == 8
    assert narrow.implicit_grad.covers is False  # input channel 1 is read by no block
    transposed = ConvSpec([([0], [0])], (3,), (4,), transposed=True)
    assert transposed.implicit is None and transposed.implicit_grad is None


def test_rule_table(monkeypatch):
    spec = ConvSpec([(range(c * 64, c * 64 + 64), range(0, 64)) for c in range(2)], (3,), (4,))  # width 64
    density = spec.blocks.density
    assert not worth_implicit(spec.implicit, density, training=False)  # the shipped table: never yet
    table = dict(implicit_mod.IMPLICIT_MAX_DENSITY)
    table[(64, "fwd")] = 1.0
    monkeypatch.setattr(implicit_mod, "IMPLICIT_MAX_DENSITY", table)
    assert worth_implicit(spec.implicit, density, training=False)
    assert not worth_implicit(spec.implicit, density, training=True)
    narrow = ConvSpec([(range(16), range(16))], (3,), (4,))
    assert not worth_implicit(narrow.implicit, narrow.blocks.density, training=False)  # below every width
    assert not worth_implicit(None, 0.1, training=False)
