"""Token slices of updat chosen against the wave tail (a candidate of issue 16, item 3).

updat runs one program per (run of ``updat_groups(G)``, token slice); each program's time is about
proportional to its slice, ``N / split``.  :func:`blocksparse.ops.matmul.configs.updat_split` asks
for about ``WAVES`` programs per SM and rounds down: at bs 128 and density 0.1, 150 runs on 132
SMs give ``split = 1`` -- two rounds, the second 18 programs long, and updat at 0.29 of dense
against fprop's 0.62.  :func:`balanced_split` instead minimises the rounds' total length.
"""
import math
import numbers

__all__ = ["balanced_split"]


def balanced_split(runs, n_tokens, bk, slots, *, min_gain=0.15, max_excess=0.05):
    """Token slices of an updat call, against the wave tail.

    Estimated time of ``split`` slices: ``ceil(runs * split / slots) / split`` (rounds of ``slots``
    programs running at once, each ``1 / split`` of the tokens long), for ``split`` in
    ``1 .. ceil(n_tokens / (4 * bk))`` (slices of at least 4 steps of ``bk`` tokens).  More than one
    slice costs float32 atomics, a zeroed buffer and a cast, so ``1`` unless the best estimate is
    ``min_gain`` below one slice's; else the smallest ``split`` within ``max_excess`` of the best.

    ``slots``: programs that run at once (multiprocessors x programs per multiprocessor).

    >>> balanced_split(150, 8192, 64, 132)     # 1 split: 2 rounds, the second 18 programs long
    6
    >>> balanced_split(512, 8192, 64, 264)     # 1.94 rounds at best: not worth the atomics
    1
    """
    for name, value, least in (("runs", runs, 1), ("n_tokens", n_tokens, 0), ("bk", bk, 1), ("slots", slots, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int; got {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name} must be >= {least}; got {value}")
    most = max(1, math.ceil(n_tokens / (4 * bk)))
    cost = {s: math.ceil(runs * s / slots) / s for s in range(1, most + 1)}
    best = min(cost.values())
    if best > (1 - min_gain) * cost[1]:
        return 1
    return min(s for s, c in cost.items() if c <= best * (1 + max_excess))
