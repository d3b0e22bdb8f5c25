"""Which updat programs also compute the bias gradient (``updat_tma_kernel``'s ``BIAS_GRAD``).

The bias gradient of ``y = x @ W + b`` is ``dy``'s column sums over the tokens.  Every updat
program of a block ``(c, k)`` loads the ``dy`` tiles of output block column ``k`` over its token
slice; marking one block of each column lets that program sum them on the way (no extra read of
``dy``).  A column without a block has no program: :func:`bias_first` then says the layout's
updat cannot give the whole bias gradient.
"""
from __future__ import annotations

import numpy as np

__all__ = ["bias_first"]


def bias_first(groups, G, out_blocks):
    """``(marks, complete)``: int32 ``(rows * G,)``, 1 at the first entry of ``groups``
    (``Layout.updat_groups(G)`` rows: ``c, k_0 .. k_{G-1}, block_0 .. block_{G-1}``; ``k = -1``
    pads) of each output block column, 0 elsewhere; ``complete``: every one of ``out_blocks``
    columns has a mark."""
    ks = np.asarray(groups, dtype=np.int64).reshape(-1, 1 + 2 * G)[:, 1:1 + G].reshape(-1)
    marks = np.zeros(ks.shape, np.int32)
    valid = np.flatnonzero(ks >= 0)
    columns, first = np.unique(ks[valid], return_index=True)
    marks[valid[first]] = 1
    return marks, np.array_equal(columns, np.arange(out_blocks))
