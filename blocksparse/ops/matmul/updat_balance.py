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


def balanced_split(runs, n_tokens, bk, slots, *, max_excess=0.05):
    """Token slices of an updat call: the smallest ``split`` whose estimated time
    ``ceil(runs * split / slots) / split`` (rounds of ``slots`` programs running at once, each
    ``1 / split`` of the tokens long) is within ``max_excess`` of the best over
    ``1 .. ceil(n_tokens / (4 * bk))`` (slices of at least 4 steps of ``bk`` tokens).

    ``slots``: programs that run at once (multiprocessors x programs per multiprocessor).

    >>> balanced_split(150, 8192, 64, 132)     # 1 split: 2 rounds, the second 18 programs long
    6
    >>> balanced_split(512, 8192, 64, 264)     # already 1.94 rounds: no gain worth the atomics
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
    return min(s for s, c in cost.items() if c <= best * (1 + max_excess))
