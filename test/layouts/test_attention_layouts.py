"""blocksparse.layouts.attention: every builder against a brute-force construction, seeded draws,
dense masks reduced to blocks (and back), and bad arguments."""
import numpy as np
import pytest

from blocksparse.layouts import attention as L


def _brute(n, keep):
    """The (n, n) layout keeping (i, j) where keep(i, j) holds, by two plain loops."""
    return np.array([[int(bool(keep(i, j))) for j in range(n)] for i in range(n)], dtype=np.int32)


def _check_shape(lay, n, heads):
    assert lay.dtype == np.int32
    assert lay.shape == ((n, n) if heads is None else (heads, n, n))
    assert set(np.unique(lay)) <= {0, 1}


@pytest.mark.parametrize("heads", [None, 3], ids=["shared", "heads3"])
@pytest.mark.parametrize("n", [1, 5, 16])
def test_causal(n, heads):
    lay = L.causal(n, heads=heads)
    _check_shape(lay, n, heads)
    expect = _brute(n, lambda i, j: j <= i)
    assert (lay == expect).all()


def _fixed_tokens(n, stride, n_global, bs, causal):
    """The paper's token-level "fixed" mask (l = stride * bs tokens, c = n_global * bs), reduced to
    blocks by "any element kept"."""
    S, l_, c = n * bs, stride * bs, n_global * bs
    t, u = np.arange(S)[:, None], np.arange(S)[None, :]
    keep = ((t // l_) == (u // l_)) | ((u % l_) >= l_ - c)
    if causal:
        keep &= u <= t
    return keep.reshape(n, bs, n, bs).any(axis=(1, 3)).astype(np.int32)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("n, stride, n_global", [(16, 4, 1), (12, 3, 2), (7, 7, 7), (9, 1, 1), (10, 4, 3)])
def test_fixed_matches_the_token_level_definition(n, stride, n_global, causal):
    lay = L.fixed(n, stride, n_global, causal=causal)
    _check_shape(lay, n, None)
    assert (lay == _fixed_tokens(n, stride, n_global, 4, causal)).all()
    brute = _brute(n, lambda i, j: (i // stride == j // stride or j % stride >= stride - n_global)
                   and (j <= i or not causal))
    assert (lay == brute).all()


def test_fixed_matches_the_benchmark_mask():
    # the anchors' FlexAttention mask: (q >= k) & (same window of 8 blocks | last block of a window)
    lay = L.fixed(32, 8, heads=2)
    brute = _brute(32, lambda i, j: j <= i and (i // 8 == j // 8 or j % 8 == 7))
    assert (lay == brute[None]).all()


def test_fixed_vary_heads():
    stride, n_global, heads = 8, 2, 5
    lay = L.fixed(24, stride, n_global, causal=False, vary_heads=True, heads=heads)
    _check_shape(lay, 24, heads)
    for h in range(heads):
        end = stride - (h % (stride // n_global)) * n_global
        brute = _brute(24, lambda i, j: i // stride == j // stride or end - n_global <= j % stride < end)
        assert (lay[h] == brute).all(), h
    assert (lay[0] == L.fixed(24, stride, n_global, causal=False)).all()
    assert (lay[4] == lay[0]).all() and not (lay[1] == lay[0]).all()


@pytest.mark.parametrize("causal", [False, True], ids=["both-sides", "causal"])
@pytest.mark.parametrize("n, window", [(1, 0), (8, 0), (8, 2), (6, 10)])
def test_sliding_window(n, window, causal):
    lay = L.sliding_window(n, window, causal=causal, heads=2)
    _check_shape(lay, n, 2)
    brute = _brute(n, lambda i, j: abs(i - j) <= window and (j <= i or not causal))
    assert (lay == brute[None]).all()


@pytest.mark.parametrize("causal", [False, True], ids=["both-sides", "causal"])
@pytest.mark.parametrize("n, window, n_global, n_random", [(16, 1, 1, 3), (12, 0, 2, 2), (8, 2, 0, 20), (5, 1, 5, 1)])
def test_bigbird(rng, n, window, n_global, n_random, causal):
    seed = int(rng.integers(0, 2**31))
    heads = 3
    lay = L.bigbird(n, window, n_global, n_random, seed, causal=causal, heads=heads)
    _check_shape(lay, n, heads)
    base = _brute(n, lambda i, j: (abs(i - j) <= window or i < n_global or j < n_global) and (j <= i or not causal))
    allowed = _brute(n, lambda i, j: j <= i or not causal)
    for h in range(heads):
        assert (lay[h] >= base).all(), "window and global blocks are kept"
        assert (lay[h] <= allowed).all(), "nothing above the diagonal under causal"
        extra = lay[h].sum(1) - base.sum(1)
        available = allowed.sum(1) - base.sum(1)
        assert (extra == np.minimum(n_random, available)).all(), "n_random extra blocks per row"
    # reproducible, and 2-D without heads
    assert (L.bigbird(n, window, n_global, n_random, seed, causal=causal, heads=heads) == lay).all()
    assert L.bigbird(n, window, n_global, n_random, seed, causal=causal).shape == (n, n)


def test_bigbird_draws_depend_on_seed_and_head():
    a = L.bigbird(32, 1, 1, 3, seed=1, heads=4)
    b = L.bigbird(32, 1, 1, 3, seed=2, heads=4)
    assert not (a == b).all()
    assert not (a[0] == a[1]).all()
    assert (L.bigbird(32, 1, 1, 3, seed=1) == a[0]).all()


@pytest.mark.parametrize("shape", [(32, 32), (2, 32, 48)], ids=["2d", "heads-rect"])
@pytest.mark.parametrize("bs", [8, 16])
def test_from_mask(rng, shape, bs):
    mask = rng.random(shape) < 0.02
    mask[..., :bs, :bs] = True           # one full block
    mask[..., -bs:, :] = False           # one empty block row
    lay, bm = L.from_mask(mask, bs, return_block_masks=True)
    assert (L.from_mask(mask.astype(np.float32), bs) == lay).all()
    lead = shape[:-2]
    qb, kb = shape[-2] // bs, shape[-1] // bs
    assert lay.shape == lead + (qb, kb) and lay.dtype == np.int32
    blocks = mask.reshape(*lead, qb, bs, kb, bs)
    for idx in np.ndindex(*lay.shape):
        *h, i, j = idx
        block = blocks[(*h, i, slice(None), j, slice(None))]
        assert lay[idx] == int(block.any())
        if block.any() and not block.all():
            assert (bm.masks[bm.index[idx]] == block).all()
        else:
            assert bm.index[idx] == -1
    assert (bm.dense(lay) == mask).all(), "layout + block masks give back the dense mask"
    assert bm.masks.shape == (int((bm.index >= 0).sum()), bs, bs)


def test_from_mask_doc_example():
    lay, bm = L.from_mask(np.tril(np.ones((16, 16), dtype=bool)), 8, return_block_masks=True)
    assert lay.tolist() == [[1, 0], [1, 1]]
    assert bm.index.tolist() == [[0, -1], [-1, 1]]
    assert (bm.masks == np.tril(np.ones((8, 8), dtype=bool))).all()


@pytest.mark.parametrize("call, error, match", [
    (lambda: L.causal(0), ValueError, "n_blocks must be >= 1; got 0"),
    (lambda: L.causal(2.0), TypeError, "n_blocks must be an int"),
    (lambda: L.causal(True), TypeError, "n_blocks must be an int"),
    (lambda: L.causal(4, heads=0), ValueError, "heads must be >= 1"),
    (lambda: L.fixed(8, 9), ValueError, "stride must be >= 1 and <= 8; got 9"),
    (lambda: L.fixed(8, 4, 5), ValueError, "n_global must be >= 1 and <= 4; got 5"),
    (lambda: L.fixed(8, 4, vary_heads=True), ValueError, "vary_heads=True needs heads"),
    (lambda: L.sliding_window(8, -1), ValueError, "window must be >= 0; got -1"),
    (lambda: L.bigbird(8, 1, 9, 1, 0), ValueError, "n_global must be >= 0 and <= 8; got 9"),
    (lambda: L.bigbird(8, 1, 1, -2, 0), ValueError, "n_random must be >= 0; got -2"),
    (lambda: L.bigbird(8, 1, 1, 1, None), TypeError, "seed must be an int"),
    (lambda: L.from_mask(np.ones((30, 32)), 16), ValueError, "multiples of block_size=16; got shape \\(30, 32\\)"),
    (lambda: L.from_mask(np.ones(32), 16), ValueError, "shape \\(S_q, S_k\\) or \\(heads, S_q, S_k\\)"),
    (lambda: L.from_mask(np.full((32, 32), 2), 16), ValueError, "mask must hold only 0 and 1; got 1024 other"),
    (lambda: L.from_mask(np.ones((32, 32)), 12), ValueError, "block_size must be one of"),
    (lambda: L.from_mask(np.array([["a"]]), 8), TypeError, "dtype <U1"),
    (lambda: L.check_attention_layout(np.ones((2, 3))), ValueError, r"square .*\(NB, NB\); got shape \(2, 3\)"),
    (lambda: L.check_attention_layout(np.ones((1, 0, 0))), ValueError, "at least one head, query block and key block"),
    (lambda: L.check_attention_layout(np.zeros((1, 2, 2))), ValueError, "at least one nonzero block"),
    (lambda: L.check_attention_layout(np.ones((2, 2, 2, 2))), ValueError, "\\(NB, NB\\) or \\(heads, NB, NB\\)"),
    (lambda: L.BlockMasks(16, np.zeros((2, 2)), np.zeros((1, 8, 8))), ValueError, "masks must have shape"),
    (lambda: L.BlockMasks(8, np.full((2, 2), 3), np.zeros((1, 8, 8))), ValueError, "index must hold -1 or a row"),
], ids=["n0", "n-float", "n-bool", "heads0", "stride", "n_global", "vary_heads", "window", "bb-global",
        "bb-random", "bb-seed", "mask-size", "mask-1d", "mask-values", "mask-bs", "mask-dtype", "check-square",
        "check-zero-size", "check-empty", "check-ndim", "bm-shape",
        "bm-index"])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
