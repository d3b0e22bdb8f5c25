"""Acceptance: the attention layout builders of ``blocksparse.layouts.attention`` as documented,
checked element by element against their stated rules."""
import numpy as np
import pytest

from blocksparse.layouts import attention as layouts


def _grid(n):
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return i, j


def _check_array(lay, shape):
    assert isinstance(lay, np.ndarray) and lay.dtype == np.int32 and lay.shape == shape
    assert set(np.unique(lay)) <= {0, 1}


@pytest.mark.parametrize("n", [1, 5])
def test_causal(n):
    lay = layouts.causal(n)
    _check_array(lay, (n, n))
    np.testing.assert_array_equal(lay, np.tril(np.ones((n, n))))
    heads = layouts.causal(n, heads=3)
    _check_array(heads, (3, n, n))
    assert np.all(heads == lay)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("n, stride, n_global", [(8, 4, 1), (9, 3, 2), (6, 6, 1), (5, 1, 1)],
                         ids=["8-4-1", "9-3-2", "one-window", "stride-1"])
def test_fixed(n, stride, n_global, causal):
    lay = layouts.fixed(n, stride, n_global, causal=causal)
    _check_array(lay, (n, n))
    i, j = _grid(n)
    want = (i // stride == j // stride) | (j % stride >= stride - n_global)
    if causal:
        want &= j <= i
    np.testing.assert_array_equal(lay, want)
    assert layouts.fixed(n, stride, n_global, causal=causal) is not lay
    np.testing.assert_array_equal(layouts.fixed(n, stride, n_global, causal=causal, heads=2), np.stack([want] * 2))


def test_fixed_default_is_causal_and_vary_heads():
    np.testing.assert_array_equal(layouts.fixed(8, 4), layouts.fixed(8, 4, 1, causal=True))
    lay = layouts.fixed(8, 4, 1, vary_heads=True, heads=4)
    _check_array(lay, (4, 8, 8))
    i, j = _grid(8)
    for h in range(4):
        end = 4 - (h % 4)  # head h: the block ending h blocks before each window's end
        want = ((i // 4 == j // 4) | (j % 4 == end - 1)) & (j <= i)
        np.testing.assert_array_equal(lay[h], want, err_msg=f"head {h}")
    assert len({lay[h].tobytes() for h in range(4)}) == 4


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("window", [0, 1, 3, 10])
def test_sliding_window(window, causal):
    lay = layouts.sliding_window(7, window, causal=causal)
    _check_array(lay, (7, 7))
    i, j = _grid(7)
    want = (0 <= i - j) & (i - j <= window) if causal else np.abs(i - j) <= window
    np.testing.assert_array_equal(lay, want)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_bigbird(causal):
    n, window, n_global, n_random = 10, 1, 2, 2
    lay = layouts.bigbird(n, window, n_global, n_random, seed=3, causal=causal)
    _check_array(lay, (n, n))
    i, j = _grid(n)
    base = (np.abs(i - j) <= window) | (i < n_global) | (j < n_global)
    allowed = (j <= i) if causal else np.ones((n, n), bool)
    base &= allowed
    assert np.all(lay[base] == 1)
    assert np.all(lay[~allowed] == 0)
    extra = (lay == 1) & ~base
    free = (~base & allowed).sum(axis=1)
    np.testing.assert_array_equal(extra.sum(axis=1), np.minimum(n_random, free))
    np.testing.assert_array_equal(lay, layouts.bigbird(n, window, n_global, n_random, seed=3, causal=causal))
    heads = layouts.bigbird(n, window, n_global, n_random, seed=3, causal=causal, heads=3)
    _check_array(heads, (3, n, n))
    assert np.all(heads[:, base] == 1)


def test_bigbird_seeds_differ():
    draws = {layouts.bigbird(16, 1, 1, 3, seed=s).tobytes() for s in range(4)}
    assert len(draws) > 1


@pytest.mark.parametrize("heads", [None, 2], ids=["2d", "per-head"])
def test_from_mask(heads, rng):
    bs, S = 8, 24
    shape = (S, S) if heads is None else (heads, S, S)
    mask = rng.random(shape) < 0.3
    mask[..., 8:16, :] = False             # a query block row with nothing kept
    mask[..., 16:24, 0:8] = True           # a fully kept block
    lay = layouts.from_mask(mask, bs)
    _check_array(lay, shape[:-2] + (3, 3))
    want = mask.reshape(shape[:-2] + (3, bs, 3, bs)).any(axis=(-3, -1))
    np.testing.assert_array_equal(lay, want)
    lay2, bm = layouts.from_mask(mask, bs, return_block_masks=True)
    np.testing.assert_array_equal(lay2, lay)
    assert bm.block_size == bs
    np.testing.assert_array_equal(bm.dense(lay2), mask)
    assert np.all(bm.index[..., 2, 0] == -1)   # a full block needs no element mask
    assert layouts.from_mask(mask.astype(np.int32), bs).tolist() == lay.tolist()


BAD = {
    "causal-zero-blocks": (lambda: layouts.causal(0), ValueError, "n_blocks"),
    "causal-float": (lambda: layouts.causal(2.5), TypeError, "n_blocks"),
    "causal-heads-zero": (lambda: layouts.causal(4, heads=0), ValueError, "heads"),
    "fixed-stride-zero": (lambda: layouts.fixed(8, 0), ValueError, "stride"),
    "fixed-global-too-many": (lambda: layouts.fixed(8, 4, 5), ValueError, "n_global"),
    "window-negative": (lambda: layouts.sliding_window(8, -1), ValueError, "window"),
    "bigbird-random-negative": (lambda: layouts.bigbird(8, 1, 1, -1, seed=0), ValueError, "n_random"),
    "bigbird-global-too-many": (lambda: layouts.bigbird(8, 1, 9, 1, seed=0), ValueError, "n_global"),
    "from-mask-not-multiple": (lambda: layouts.from_mask(np.ones((12, 12)), 8), ValueError, "block_size"),
    "from-mask-1d": (lambda: layouts.from_mask(np.ones(16), 8), ValueError, "mask"),
    "from-mask-values": (lambda: layouts.from_mask(np.full((8, 8), 2), 8), ValueError, "mask"),
    "from-mask-block-size": (lambda: layouts.from_mask(np.ones((8, 8)), 0), ValueError, "block_size"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_arguments(name):
    call, error, pattern = BAD[name]
    with pytest.raises(error, match=pattern):
        call()
