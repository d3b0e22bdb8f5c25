"""Butterfly (pixelfly) layouts and random layouts with a fixed number of blocks per row.

Numpy only.  Every builder returns a boolean block mask of shape ``(in_blocks, out_blocks)``: the
orientation of :class:`blocksparse.layout.Layout`, rows along the input features ``C``, columns
along the output features ``K`` (pixelfly's own masks are ``(out, in)``: ours are their transpose).

The flat block butterfly (Dao et al., "Pixelated Butterfly", ICLR 2022)
----------------------------------------------------------------------
A butterfly of size ``n = butterfly_size`` (a power of two) is a product of ``log2(n)`` sparse
factors; factor ``f`` joins index ``i`` to the indices that differ from it in bit ``f`` only.
*Flattening* replaces the product by the sum of the first ``n_factors`` factors plus the identity,
so the ``(n, n)`` base pattern is::

    base[i, j] = (i XOR j) in {0, 1, 2, 4, ..., 2 ** (n_factors - 1)}       (n_factors + 1 per row)

The base is laid over the whole weight: along an axis of ``F`` features, butterfly unit ``u`` covers
features ``[u * F / n, (u + 1) * F / n)``, and block ``(c, k)`` exists when some unit its rows touch
and some unit its columns touch are joined in the base (``stretch=True``: pixelfly's
``FlatBlockButterflySparsityConfig``).  With ``stretch=False`` (the default, as in the pure-PyTorch
pixelfly) the longer axis is then de-interleaved with ratio ``r = long // short`` -- its lines
are reordered by ``(i % r, i // r)``, so that where ``r`` divides ``long`` line ``i`` moves to
``(i % r) * (long // r) + i // r`` -- and the square pattern of the shorter side repeats ``r``
times instead of each of its lines being stretched over ``r`` adjacent ones.  Both
are exactly pixelfly's layouts wherever pixelfly defines them (feature counts multiples of
``butterfly_size``, the longer side a multiple of the shorter); here any multiple of
``block_size`` works.  Every row and every column of the result holds the same number of blocks
whenever pixelfly's conditions hold.

>>> flat_butterfly(4, 1).astype(int)
array([[1, 1, 0, 0],
       [1, 1, 0, 0],
       [0, 0, 1, 1],
       [0, 0, 1, 1]])
>>> butterfly_layout(384, 1536, 48, 64, 6).shape      # 8 input blocks, 32 output blocks
(8, 32)
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["butterfly_layout", "check_butterfly", "default_butterfly_size", "flat_butterfly", "random_row_layout"]


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 1; got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1; got {value}")
    return int(value)


def check_butterfly(butterfly_size, n_factors=None):
    """``(butterfly_size, n_factors)`` checked (``ValueError`` / ``TypeError`` naming the argument);
    ``n_factors=None`` means all ``log2(butterfly_size)``."""
    n = _positive_int(butterfly_size, "butterfly_size")
    if n < 2 or n & (n - 1):
        raise ValueError(f"butterfly_size must be a power of two >= 2; got {n}")
    log_n = n.bit_length() - 1
    if n_factors is None:
        return n, log_n
    f = _positive_int(n_factors, "n_factors")
    if f > log_n:
        raise ValueError(f"n_factors must be in 1..log2(butterfly_size) = 1..{log_n}; got {f}")
    return n, f


def flat_butterfly(butterfly_size, n_factors=None):
    """The ``(n, n)`` flat butterfly: ``i XOR j`` is 0 or ``2**f`` for some ``f < n_factors``.

    Parameters
    ----------
    butterfly_size : int
        ``n``, a power of two >= 2.
    n_factors : int, optional
        How many butterfly factors to add, ``1 .. log2(n)`` (default: all of them).

    Returns
    -------
    np.ndarray of bool, shape (n, n)
        Symmetric, ``n_factors + 1`` entries in every row and column.
    """
    n, f = check_butterfly(butterfly_size, n_factors)
    i = np.arange(n)
    xor = i[:, None] ^ i[None, :]
    return ((xor & (xor - 1)) == 0) & (xor < (1 << f))  # zero, or one bit below 2**f


def default_butterfly_size(in_features, out_features, block_size):
    """pixelfly's default: the power of two >= the shorter side in blocks (at least 2)."""
    in_features, out_features = _positive_int(in_features, "in_features"), _positive_int(out_features, "out_features")
    short = min(in_features, out_features) / _positive_int(block_size, "block_size")
    return max(2, 2 ** math.ceil(math.log2(max(short, 1))))


def _spans(n_blocks, block_size, features, n):
    """``(lo, hi)``: block ``a`` (features ``[a*bs, (a+1)*bs)``) overlaps butterfly units ``lo[a] ..
    hi[a] - 1`` (unit ``u``: features ``[u*F/n, (u+1)*F/n)``); integer arithmetic, so no rounding."""
    a = np.arange(n_blocks, dtype=np.int64)
    return (a * block_size * n) // features, -((-(a + 1) * block_size * n) // features)


def _any_in_spans(mask, lo, hi, axis):
    """``out[..., a, ...]``: any of ``mask``'s lines ``lo[a] .. hi[a] - 1`` along ``axis`` is set
    (prefix sums: linear in the sizes, where a product of 0/1 matrices is cubic)."""
    counts = np.cumsum(mask, axis=axis, dtype=np.int32)
    counts = np.concatenate([np.zeros_like(counts.take([0], axis=axis)), counts], axis=axis)
    return (counts.take(hi, axis=axis) - counts.take(lo, axis=axis)) > 0


def _deinterleave(n_lines, ratio):
    """Source line of each position when lines ``i`` move to ``(i % ratio, i // ratio)`` order."""
    i = np.arange(n_lines)
    return np.lexsort((i // ratio, i % ratio))


def butterfly_layout(in_features, out_features, block_size, butterfly_size=None, n_factors=None, *,
                     stretch=False):
    """Flat block butterfly layout of a ``(in_features, out_features)`` weight (see the module doc).

    Parameters
    ----------
    in_features, out_features : int
        Multiples of ``block_size``.
    block_size : int
        Block edge, any int >= 1.
    butterfly_size : int, optional
        Power of two >= 2; default :func:`default_butterfly_size` (as pixelfly).
    n_factors : int, optional
        ``1 .. log2(butterfly_size)``; default all.
    stretch : bool
        Stretch the butterfly over a rectangular weight (True) or repeat the square pattern of
        the shorter side (False, default).

    Returns
    -------
    np.ndarray of bool, shape (in_features // block_size, out_features // block_size)

    Examples
    --------
    >>> lay = butterfly_layout(384, 1536, 48, 64, 6)
    >>> lay.sum(axis=1).tolist(), float(lay.mean())   # 16 blocks per input row, half dense
    ([16, 16, 16, 16, 16, 16, 16, 16], 0.5)
    """
    bs = _positive_int(block_size, "block_size")
    if not isinstance(stretch, (bool, np.bool_)):
        raise TypeError(f"stretch must be a bool; got {stretch!r} of type {type(stretch).__name__}")
    sizes = {}
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        sizes[name] = _positive_int(value, name)
        if sizes[name] % bs:
            raise ValueError(f"{name} must be a multiple of block_size={bs}; got {sizes[name]}")
    c_feat, k_feat = sizes["in_features"], sizes["out_features"]
    if butterfly_size is None:
        butterfly_size = default_butterfly_size(c_feat, k_feat, bs)
    base = flat_butterfly(butterfly_size, n_factors)
    n = base.shape[0]
    cb, kb = c_feat // bs, k_feat // bs
    # block (c, k) is kept where some unit c overlaps and some unit k overlaps are joined in the base
    mask = _any_in_spans(_any_in_spans(base, *_spans(cb, bs, c_feat, n), axis=0), *_spans(kb, bs, k_feat, n), axis=1)
    if not stretch and cb != kb:
        if kb > cb:
            mask = mask[:, _deinterleave(kb, kb // cb)]
        else:
            mask = mask[_deinterleave(cb, cb // kb), :]
    return np.ascontiguousarray(mask)


def _generator(rng):
    """``rng`` as a numpy Generator: a Generator (or bit generator / seed sequence), a seed >= 0 or None."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (np.random.BitGenerator, np.random.SeedSequence)):
        return np.random.default_rng(rng)
    if isinstance(rng, bool) or not isinstance(rng, numbers.Integral):
        raise TypeError(f"rng must be a numpy Generator, an int seed >= 0 or None; got {rng!r} of type "
                        f"{type(rng).__name__}")
    if rng < 0:
        raise ValueError(f"rng must be a numpy Generator, an int seed >= 0 or None; got {rng}")
    return np.random.default_rng(int(rng))


def random_row_layout(in_blocks, out_blocks, blocks_per_row, rng=None):
    """A random layout with exactly ``blocks_per_row`` blocks in every input row.

    Parameters
    ----------
    in_blocks, out_blocks : int
        Layout shape ``(CB, KB)``.
    blocks_per_row : int
        ``1 .. out_blocks``: blocks of each row ``c`` (distinct columns, uniformly at random).
    rng : numpy.random.Generator, int or None
        Generator or seed (``np.random.default_rng(rng)``).

    Returns
    -------
    np.ndarray of bool, shape (in_blocks, out_blocks)

    >>> random_row_layout(3, 5, 2, rng=0).sum(axis=1).tolist()
    [2, 2, 2]
    """
    cb = _positive_int(in_blocks, "in_blocks")
    kb = _positive_int(out_blocks, "out_blocks")
    m = _positive_int(blocks_per_row, "blocks_per_row")
    if m > kb:
        raise ValueError(f"blocks_per_row must be <= out_blocks={kb}; got {m}")
    gen = _generator(rng)
    cols = np.argsort(gen.random((cb, kb)), axis=1)[:, :m]
    mask = np.zeros((cb, kb), dtype=bool)
    mask[np.arange(cb)[:, None], cols] = True
    return mask
