"""Butterfly (pixelfly) layouts and random fixed-row layouts against brute-force definitions."""
import doctest
import itertools

import numpy as np
import pytest

import blocksparse.layouts.butterfly as butterfly_mod
from blocksparse.layouts.butterfly import (butterfly_layout, default_butterfly_size, flat_butterfly,
                                           random_row_layout)


def test_doctests():
    assert doctest.testmod(butterfly_mod).failed == 0


# ---------------------------------------------------------------- brute-force definitions

def brute_flat_butterfly(n, f):
    """Union of the identity and butterfly factors 0..f-1: factor b joins i and i with bit b flipped."""
    out = np.eye(n, dtype=bool)
    for b in range(f):
        for i in range(n):
            out[i, i ^ (1 << b)] = True
    return out


def pixelfly_reference(out_features, in_features, block_size, n, f, stretch):
    """pixelfly's construction, step by step: the base repeated over every feature of the
    ``(out, in)`` weight, ``any`` over each block, then (not stretched) the longer axis regrouped so
    the square pattern repeats.  Transposed to our ``(in, out)`` orientation."""
    base = brute_flat_butterfly(n, f)
    feat = np.repeat(np.repeat(base, out_features // n, axis=0), in_features // n, axis=1)
    ob, ib = out_features // block_size, in_features // block_size
    lay = feat.reshape(ob, block_size, ib, block_size).any(axis=(1, 3))
    if not stretch and ob > ib:
        r = ob // ib
        lay = lay.reshape(ob // r, r, ib).transpose(1, 0, 2).reshape(ob, ib)
    elif not stretch and ob < ib:
        r = ib // ob
        lay = lay.reshape(ob, ib // r, r).transpose(0, 2, 1).reshape(ob, ib)
    return lay.T


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_flat_butterfly_is_the_sum_of_factors(n):
    for f in range(1, n.bit_length()):
        got = flat_butterfly(n, f)
        np.testing.assert_array_equal(got, brute_flat_butterfly(n, f))
        assert (got.sum(axis=0) == f + 1).all() and (got == got.T).all()
    np.testing.assert_array_equal(flat_butterfly(n), brute_flat_butterfly(n, n.bit_length() - 1))


def test_flat_butterfly_documented_example():
    """The 8 x 8 flat butterfly with two factors: i joined to i, i^1 and i^2 (a 4-block diagonal
    with the anti-diagonal of each 4 x 4 block missing)."""
    expected = np.array([
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0, 0],
        [1, 0, 1, 1, 0, 0, 0, 0],
        [0, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 0, 1],
        [0, 0, 0, 0, 1, 0, 1, 1],
        [0, 0, 0, 0, 0, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(flat_butterfly(8, 2), expected)


def _pixelfly_cases():
    for n, bs, ci, r, swap in itertools.product([2, 4, 16, 64], [1, 3, 8, 48], [1, 2, 4, 8], [1, 2, 4], [0, 1]):
        fin, fout = ci * bs * (r if swap else 1), ci * bs * (1 if swap else r)
        if fin % n == 0 and fout % n == 0:
            yield fin, fout, bs, n


PIXELFLY_CASES = list(_pixelfly_cases())


@pytest.mark.parametrize("stretch", [False, True], ids=["tiled", "stretched"])
def test_matches_pixelfly_where_it_is_defined(stretch):
    assert len(PIXELFLY_CASES) > 100
    for fin, fout, bs, n in PIXELFLY_CASES:
        for f in range(1, n.bit_length()):
            np.testing.assert_array_equal(butterfly_layout(fin, fout, bs, n, f, stretch=stretch),
                                          pixelfly_reference(fout, fin, bs, n, f, stretch),
                                          err_msg=f"in={fin} out={fout} bs={bs} n={n} f={f}")


@pytest.mark.parametrize("fin, fout, bs, density, per_row, per_col", [
    (384, 1536, 48, 0.5, 16, 4), (1536, 384, 48, 0.5, 4, 16),
    (2048, 8192, 256, 0.5, 16, 4), (8192, 4096, 256, 0.3125, 5, 10),
], ids=["small-up", "small-down", "large-up", "large-down"])
def test_the_pixelfly_seed_layers(fin, fout, bs, density, per_row, per_col):
    """The discussion's MLPs (butterfly size 64, all factors): equal blocks per row and column."""
    lay = butterfly_layout(fin, fout, bs, 64)
    assert lay.shape == (fin // bs, fout // bs) and lay.dtype == bool
    assert lay.mean() == density
    assert set(lay.sum(axis=1)) == {per_row} and set(lay.sum(axis=0)) == {per_col}


def test_tiling_repeats_the_square_of_the_shorter_side():
    lay = butterfly_layout(128, 512, 16, 8, 3)             # (8, 32): four copies side by side
    square = butterfly_layout(128, 128, 16, 8, 3)
    np.testing.assert_array_equal(lay, np.tile(square, (1, 4)))
    stretched = butterfly_layout(128, 512, 16, 8, 3, stretch=True)
    np.testing.assert_array_equal(stretched, np.repeat(square, 4, axis=1))


def test_any_multiple_of_the_block_size():
    """Feature counts that are not multiples of the butterfly size, nor of each other."""
    lay = butterfly_layout(5 * 12, 7 * 12, 12, 4)
    assert lay.shape == (5, 7) and lay.any(axis=1).all() and lay.any(axis=0).all()
    assert 0 < lay.mean() < 1


@pytest.mark.parametrize("stretch", [False, True])
def test_blocks_where_their_units_meet_in_the_base(rng, stretch):
    """The definition as products of 0/1 matrices: block ``a`` overlaps unit ``u`` where their feature
    intervals meet (exact fractions); block (c, k) is kept where an overlapped pair is joined in the
    base, for sizes that divide neither the butterfly nor each other."""
    from fractions import Fraction

    def overlaps(blocks, bs, features, n):
        return np.array([[max(Fraction(a * bs), Fraction(u * features, n)) <
                          min(Fraction((a + 1) * bs), Fraction((u + 1) * features, n)) for u in range(n)]
                         for a in range(blocks)], dtype=np.int64)

    for _ in range(30):
        bs, n = int(rng.choice([1, 3, 5, 16])), int(rng.choice([2, 4, 8, 16, 32]))
        cb = int(rng.integers(1, 24))
        kb = cb * int(rng.choice([1, 2, 4])) if not stretch or rng.random() < 0.5 else int(rng.integers(1, 24))
        base = brute_flat_butterfly(n, n.bit_length() - 1).astype(np.int64)
        want = (overlaps(cb, bs, cb * bs, n) @ base @ overlaps(kb, bs, kb * bs, n).T) > 0
        if not stretch and cb != kb:
            order = np.lexsort((np.arange(max(cb, kb)) // (max(cb, kb) // min(cb, kb)),
                                np.arange(max(cb, kb)) % (max(cb, kb) // min(cb, kb))))
            want = want[:, order] if kb > cb else want[order, :]
        np.testing.assert_array_equal(butterfly_layout(cb * bs, kb * bs, bs, n, stretch=stretch), want)


def test_default_butterfly_size():
    assert default_butterfly_size(384, 1536, 48) == 8
    assert default_butterfly_size(48, 96, 48) == 2      # one block on the short side: the smallest
    np.testing.assert_array_equal(butterfly_layout(384, 1536, 48), butterfly_layout(384, 1536, 48, 8))


def test_random_row_layout(rng):
    lay = random_row_layout(12, 9, 4, rng=rng)
    assert lay.shape == (12, 9) and lay.dtype == bool and set(lay.sum(axis=1)) == {4}
    np.testing.assert_array_equal(random_row_layout(12, 9, 4, rng=7), random_row_layout(12, 9, 4, rng=7))
    assert not np.array_equal(random_row_layout(40, 40, 4, rng=1), random_row_layout(40, 40, 4, rng=2))
    assert random_row_layout(3, 5, 5).all()
    # each column is equally likely: over many draws every column is used
    assert random_row_layout(200, 9, 1, rng=rng).any(axis=0).all()


@pytest.mark.parametrize("call, err, words", [
    (lambda: flat_butterfly(6), ValueError, "power of two"),
    (lambda: flat_butterfly(1), ValueError, "power of two >= 2"),
    (lambda: flat_butterfly(8, 4), ValueError, r"n_factors must be in 1..log2\(butterfly_size\) = 1..3; got 4"),
    (lambda: flat_butterfly(8, 0), ValueError, "n_factors must be an int >= 1; got 0"),
    (lambda: flat_butterfly(8.0), TypeError, "butterfly_size must be an int"),
    (lambda: butterfly_layout(100, 96, 48, 4), ValueError, "in_features must be a multiple of block_size=48; got 100"),
    (lambda: butterfly_layout(96, 100, 48, 4), ValueError, "out_features must be a multiple"),
    (lambda: butterfly_layout(96, 96, 0, 4), ValueError, "block_size must be an int >= 1; got 0"),
    (lambda: butterfly_layout(96, 96, True, 4), TypeError, "block_size must be an int"),
    (lambda: random_row_layout(3, 4, 5), ValueError, "blocks_per_row must be <= out_blocks=4; got 5"),
    (lambda: random_row_layout(0, 4, 1), ValueError, "in_blocks must be an int >= 1; got 0"),
    (lambda: butterfly_layout(16, 64, 4, 4, stretch="False"), TypeError, "stretch must be a bool; got 'False'"),
    (lambda: random_row_layout(3, 5, 2, rng="seed"), TypeError, "rng must be a numpy Generator, an int seed"),
    (lambda: random_row_layout(3, 5, 2, rng=1.5), TypeError, "rng must be .* got 1.5"),
    (lambda: random_row_layout(3, 5, 2, rng=-1), ValueError, "rng must be .* got -1"),
], ids=["size-6", "size-1", "factors-4", "factors-0", "size-float", "in-features", "out-features",
        "bs-0", "bs-bool", "row-too-long", "no-rows", "stretch-str", "rng-str", "rng-float", "rng-negative"])
def test_bad_arguments(call, err, words):
    with pytest.raises(err, match=words):
        call()


@pytest.mark.parametrize("args, error, match", [
    ((64, 64, 0), ValueError, "block_size must be an int >= 1"),
    ((-64, 64, 8), ValueError, "in_features must be an int >= 1"),
    ((64.5, 64, 8), TypeError, "in_features must be an int >= 1"),
    ((64, "64", 8), TypeError, "out_features must be an int >= 1"),
])
def test_default_butterfly_size_checks_its_arguments(args, error, match):
    with pytest.raises(error, match=match):
        default_butterfly_size(*args)
