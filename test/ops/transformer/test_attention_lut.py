"""The attention layout core: block order, the row / column tables, in-block mask packing, bad
layouts and callbacks, and the numpy ``*_test`` helpers against plain loops."""
import numpy as np
import pytest

from blocksparse.ops.transformer.frontend import TransformerBase
from blocksparse.ops.transformer.lut import AttentionLayout, pack_bits, unpack_bits
from blocksparse.testing import attention as ref


def _random_masks(rng):
    table = {}

    def callback(blk_shape, head, q, k, blk):
        table[head, blk] = (q, k)
        return rng.random(blk_shape) < 0.7
    return callback, table


@pytest.mark.parametrize("heads, shared", [(3, False), (4, True)], ids=["per-head", "shared"])
def test_tables_walk_the_layout(rng, heads, shared):
    mask = ref.random_layout(rng, 1 if shared else heads, 5, 6, 0.4, empty_rows=1)
    lay = AttentionLayout(mask if not shared else mask[0], 16, heads=heads)
    assert (lay.heads, lay.lut_heads, lay.QB, lay.KB) == (heads, 1 if shared else heads, 5, 6)
    assert (lay.ctx_q, lay.ctx_k) == (80, 96) and lay.blocks == mask[0].sum()
    for h in range(lay.lut_heads):
        coords = lay.coords[h]
        assert coords.tolist() == sorted(map(list, zip(*np.nonzero(mask[h]))))  # row-major (q, k)
        for q in range(lay.QB):
            row = coords[lay.row_offsets[h, q]:lay.row_offsets[h, q + 1]]
            assert (row[:, 0] == q).all() and row[:, 1].tolist() == np.nonzero(mask[h, q])[0].tolist()
        for k in range(lay.KB):
            ids = lay.col_blocks[h, lay.col_offsets[h, k]:lay.col_offsets[h, k + 1]]
            assert (coords[ids, 1] == k).all() and coords[ids, 0].tolist() == np.nonzero(mask[h, :, k])[0].tolist()
        assert sorted(lay.col_blocks[h].tolist()) == list(range(lay.blocks))
    assert lay.nn_max == mask.sum(axis=2).max() and lay.tn_max == mask.sum(axis=1).max()
    for table in (lay.coords, lay.row_offsets, lay.col_offsets, lay.col_blocks):
        assert table.dtype == np.int32 and table.flags.c_contiguous and not table.flags.writeable
    q_ids, k_ids = lay.flat_ids
    for h in range(heads):
        c = lay.coords[h % lay.lut_heads]
        sl = slice(h * lay.blocks, (h + 1) * lay.blocks)
        assert (q_ids[sl] == h * lay.QB + c[:, 0]).all() and (k_ids[sl] == h * lay.KB + c[:, 1]).all()


def test_block_coord_and_repr():
    lay = AttentionLayout(np.array([[[1, 1], [0, 1]], [[0, 1], [1, 1]]]), 32)
    assert lay.block_coord(1) == (0, 1) and lay.block_coord(0, head=1) == (0, 1)
    assert lay.block_coord(2, head=1) == (1, 1)
    assert "blocks=3" in repr(lay)
    with pytest.raises(ValueError, match=r"block must be in \[0, 3\); got 3"):
        lay.block_coord(3)
    with pytest.raises(ValueError, match=r"head must be in \[0, 2\); got 2"):
        lay.block_coord(0, head=2)
    with pytest.raises(TypeError, match="block must be an int"):
        lay.block_coord(1.0)


@pytest.mark.parametrize("layout, heads, err, words", [
    (np.ones(4), None, ValueError, r"\(q_blocks, k_blocks\) or \(heads, q_blocks, k_blocks\); got 1 dimension"),
    (np.ones((1, 2, 2, 2)), None, ValueError, "got 4 dimension"),
    (np.ones((2, 2)), None, ValueError, "heads must be given with a 2-D layout"),
    (np.ones((3, 2, 2)), 2, ValueError, "layout has 3 heads .* but heads=2"),
    (np.ones((2, 2)), 0, ValueError, "heads must be >= 1; got 0"),
    (np.ones((2, 2)), 2.0, TypeError, "heads must be an int; got 2.0"),
    (np.zeros((2, 3, 3)), None, ValueError, "at least one nonzero block"),
    (np.array([[[1, 0], [0, 0]], [[1, 1], [0, 0]]]), None, ValueError, r"same number of blocks.*\[1, 2\]"),
    (np.full((2, 2), 2), 1, ValueError, "only 0 and 1"),
    (np.array([["a"]]), 1, TypeError, "0/1 numbers or booleans"),
    (np.ones((0, 2)), 1, ValueError, "at least one head, query block and key block"),
], ids=["1d", "4d", "2d-no-heads", "heads-mismatch", "heads-zero", "heads-float", "empty", "unequal-heads",
        "values", "dtype", "zero-size"])
def test_bad_layouts(layout, heads, err, words):
    with pytest.raises(err, match=words):
        AttentionLayout(layout, 16, heads)


@pytest.mark.parametrize("block_size", [12, 256, "16"], ids=["12", "256", "str"])
def test_bad_block_size(block_size):
    with pytest.raises((ValueError, TypeError), match="block_size"):
        AttentionLayout(np.ones((1, 2, 2)), block_size)


@pytest.mark.parametrize("bs", [8, 16, 32, 64, 128])
def test_mask_bits_round_trip(rng, bs):
    masks = rng.random((3, bs, bs)) < 0.5
    bits = pack_bits(masks)
    assert bits.shape == (3, bs, -(-bs // 32)) and bits.dtype == np.int32
    assert (unpack_bits(bits, bs) == masks).all()
    # bit j % 32 of word j // 32, least significant first, as the kernels read it
    i, j = rng.integers(0, bs, 2)
    assert ((bits[1, i, j // 32].astype(np.int64) >> (j % 32)) & 1) == masks[1, i, j]


def test_block_masks_dedupe_and_callback_arguments(rng):
    lay = AttentionLayout(ref.causal_layout(4, heads=2), 16)
    seen = []

    def causal_diagonal(blk_shape, head, q, k, blk):
        seen.append((blk_shape, head, q, k, blk))
        return np.tril(np.ones(blk_shape, dtype=bool)) if q == k else np.ones(blk_shape, dtype=np.int64)

    masks = lay.block_masks(causal_diagonal)
    assert seen == [((16, 16), h, *lay.block_coord(b, h), b) for h in range(2) for b in range(lay.blocks)]
    assert masks.bits.shape == (1, 16, 1)  # one distinct mask; full blocks are -1
    diagonal = lay.coords[:, :, 0] == lay.coords[:, :, 1]
    assert (masks.index[diagonal] == 0).all() and (masks.index[~diagonal] == -1).all()
    per_block = masks.per_block()
    assert (per_block[diagonal] == np.tril(np.ones((16, 16), bool))).all() and per_block[~diagonal].all()
    assert (masks.head_index(2) < masks.distinct().shape[0]).all()


def test_shared_layout_calls_back_once_per_block(rng):
    lay = AttentionLayout(ref.random_layout(rng, 1, 3, 3, 0.5)[0], 8, heads=5)
    callback, table = _random_masks(rng)
    masks = lay.block_masks(callback)
    assert sorted(table) == [(0, b) for b in range(lay.blocks)] and masks.index.shape == (1, lay.blocks)


@pytest.mark.parametrize("result, err, words", [
    (np.ones((16, 8)), ValueError, r"shape blk_shape = \(16, 16\); got shape \(16, 8\) for head 0, block 0"),
    (np.full((16, 16), 0.5), ValueError, "only 0 and 1"),
    (np.full((16, 16), "x"), TypeError, "0/1 numbers or booleans"),
    (None, ValueError, r"got shape \(\)"),
], ids=["shape", "values", "dtype", "none"])
def test_bad_mask_callback(result, err, words):
    lay = AttentionLayout(np.ones((1, 2, 2)), 16)
    with pytest.raises(err, match=words):
        lay.block_masks(lambda *args: result)
    with pytest.raises(TypeError, match="mask_callback must be callable"):
        lay.block_masks(np.ones((16, 16)))


# ---------------------------------------------------------------- numpy helpers vs loops

def _loops(bst, a, b, w, x, scale):
    """The original's per-block loops (float64), an independent check of the dense references."""
    H, bs, lay = bst.heads, bst.block_size, bst.layout
    A, B, X = (t.reshape(t.shape[0], -1, bs, H, t.shape[2] // H) for t in (a, b, x))
    n_batch = a.shape[0]
    nt = np.zeros(bst.w_shape(n_batch))
    nn = np.zeros(A.shape)
    tn = np.zeros(B.shape)
    sm = np.zeros(bst.w_shape(n_batch))
    kept = bst.masks.per_block() if bst.masks is not None else np.ones((1, lay.blocks, bs, bs), bool)
    for n in range(n_batch):
        for h in range(H):
            lh = h % lay.lut_heads
            for blk, (q, k) in enumerate(lay.coords[lh]):
                nt[n, h, blk] = A[n, q, :, h] @ B[n, k, :, h].T
                nn[n, q, :, h] += w[n, h, blk] @ B[n, k, :, h]
                tn[n, k, :, h] += w[n, h, blk].T @ X[n, q, :, h]
            for q in range(lay.QB):
                ids = list(range(lay.row_offsets[lh, q], lay.row_offsets[lh, q + 1]))
                for i in range(bs):
                    row = np.concatenate([w[n, h, blk, i] * scale for blk in ids]) if ids else np.zeros(0)
                    keep = np.concatenate([kept[lh % kept.shape[0], blk, i] for blk in ids]) if ids else row > 0
                    if keep.any():
                        e = np.where(keep, np.exp(row - row[keep].max()), 0.0)
                        for j, blk in enumerate(ids):
                            sm[n, h, blk, i] = (e / e.sum())[j * bs:(j + 1) * bs]
    return nt, nn.reshape(a.shape), tn.reshape(b.shape), sm


@pytest.mark.parametrize("shared, masked", [(False, True), (True, False)], ids=["per-head-masked", "shared"])
def test_numpy_helpers_match_loops(rng, shared, masked):
    H, bs = 2, 8
    layout = ref.random_layout(rng, 1 if shared else H, 3, 4, 0.5, empty_rows=1)
    bst = TransformerBase(layout[0] if shared else layout, bs, heads=H,
                          mask_callback=_random_masks(rng)[0] if masked else None)
    a, x = rng.standard_normal((2, 2, bst.ctx_q, H * 3))
    b = rng.standard_normal((2, bst.ctx_k, H * 3))
    w = rng.standard_normal(bst.w_shape(2))
    nt, nn, tn, sm = _loops(bst, a, b, w, x, 0.7)
    np.testing.assert_allclose(bst.nt_test(a, b), nt, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bst.nn_test(w, b), nn, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bst.tn_test(w, x), tn, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bst.masked_softmax_test(w, scale=0.7), sm, rtol=1e-12, atol=1e-12)
    assert bst.nt_test(a.astype(np.float32), b.astype(np.float32)).dtype == np.float32


def test_original_lists_and_shape_helpers():
    bst = TransformerBase(np.array([[1, 0, 0], [1, 1, 0], [0, 1, 1]]), 16, heads=3)
    assert bst.nt_list == [[(0, 0), (1, 0), (1, 1), (2, 1), (2, 2)]]
    assert bst.nn_list == [[[(0, 0)], [(1, 0), (2, 1)], [(3, 1), (4, 2)]]]
    assert bst.tn_list == [[[(0, 0), (1, 1)], [(2, 1), (3, 2)], [(4, 2)]]]
    assert (bst.blk_size, bst.blk_shape, bst.heads, bst.lut_heads, bst.blocks) == (16, (16, 16), 3, 1, 5)
    assert (bst.ctx_blks_q, bst.ctx_blks_k, bst.nn_max, bst.tn_max) == (3, 3, 2, 2)
    assert bst.w_shape(4) == (4, 3, 5, 16, 16) and bst.q_shape(2, 24) == (2, 48, 24)
    assert bst.k_shape(None, 6) == (None, 48, 6)
    with pytest.raises(ValueError, match="multiple of heads=3"):
        bst.q_shape(2, 10)
