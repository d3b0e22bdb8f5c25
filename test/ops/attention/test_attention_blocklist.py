"""blocksparse.ops.attention.blocklist: the kernels' lookup tables, walked entry by entry against
the layout they describe."""
import doctest

import numpy as np
import pytest

from blocksparse.layouts import attention as layouts
from blocksparse.ops.attention import blocklist
from blocksparse.ops.attention.blocklist import block_lists, pair_index


def _expected(layout, causal, mask_index):
    """{(h, blk, other): partial} for rows and for columns, by loops over the layout."""
    rows, cols = {}, {}
    hl, nb, _ = layout.shape
    for h in range(hl):
        for i in range(nb):
            for j in range(nb):
                if not layout[h, i, j] or (causal and j > i):
                    continue
                mid = -1 if mask_index is None else int(mask_index[h, i, j])
                partial = (causal and i == j) or mid >= 0
                rows[h, i, j] = (partial, mid)
                cols[h, j, i] = (partial, mid)
    return rows, cols


def _walk(lists):
    """{(h, blk, other): (partial, mask)} read back from the tables, checking their structure."""
    got = {}
    nb = lists.blocks
    assert lists.headers.shape == (lists.heads * nb, 3)
    assert lists.entries.ndim == 2 and lists.entries.shape[1] == 2
    for arr in (lists.headers, lists.entries, lists.order):
        assert arr.dtype == np.int32 and arr.flags.c_contiguous and not arr.flags.writeable
    expect_start = 0
    for h in range(lists.heads):
        for blk in range(nb):
            start, n_full, n_part = lists.headers[h * nb + blk]
            assert start == expect_start, "lists stored one after another in (h, blk) order"
            expect_start += n_full + n_part
            full = lists.entries[start:start + n_full]
            part = lists.entries[start + n_full:start + n_full + n_part]
            for run in (full, part):
                assert (np.diff(run[:, 0]) > 0).all(), "each run ascending"
            assert (full[:, 1] == -1).all(), "full blocks carry no element mask"
            for other, mid in full:
                got[h, blk, int(other)] = (False, -1)
            for other, mid in part:
                got[h, blk, int(other)] = (True, int(mid))
    assert expect_start == lists.entries.shape[0]
    work = (lists.headers[:, 1] + lists.headers[:, 2]).reshape(lists.heads, nb).sum(0)
    assert sorted(lists.order.tolist()) == list(range(nb))
    assert (np.diff(work[lists.order]) <= 0).all(), "most work first"
    return got


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads, nb, density, masks", [(1, 1, 1.0, False), (1, 7, 0.4, False),
                                                      (3, 6, 0.5, True), (2, 9, 0.2, True)],
                         ids=["one-block", "random", "heads-masks", "sparse-masks"])
def test_tables_list_every_block(rng, heads, nb, density, masks, causal):
    layout = rng.random((heads, nb, nb)) < density
    layout[:, -1, :] = False                      # an empty row
    mask_index = None
    if masks:
        chosen = layout & (rng.random(layout.shape) < 0.5)
        mask_index = np.where(chosen, np.cumsum(chosen).reshape(layout.shape) - 1, -1)
    rows, cols = block_lists(layout, causal, mask_index)
    want_rows, want_cols = _expected(layout, causal, mask_index)
    assert _walk(rows) == want_rows
    assert _walk(cols) == want_cols


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads, nb, density", [(1, 7, 0.4), (3, 6, 0.5), (2, 9, 0.2), (2, 4, 0.0)])
def test_pair_index_finds_each_row_entry_among_the_columns(rng, heads, nb, density, causal):
    layout = rng.random((heads, nb, nb)) < density
    rows, cols = block_lists(layout, causal)
    pairs = pair_index(rows, cols)
    assert pairs.dtype == np.int32 and pairs.shape == (rows.entries.shape[0],)
    assert sorted(pairs.tolist()) == list(range(cols.entries.shape[0]))      # a permutation
    col_of = {}  # column entry index -> (head, query block, key block), from the column lists
    for h in range(heads):
        for j in range(nb):
            start, n_full, n_part = cols.headers[h * nb + j]
            for e in range(start, start + n_full + n_part):
                col_of[e] = (h, int(cols.entries[e, 0]), j)
    for h in range(heads):
        for i in range(nb):
            start, n_full, n_part = rows.headers[h * nb + i]
            for e in range(start, start + n_full + n_part):
                assert col_of[int(pairs[e])] == (h, i, int(rows.entries[e, 0]))


def test_causal_diagonal_is_the_only_partial_block():
    rows, cols = block_lists(layouts.causal(4, heads=1).astype(bool), causal=True)
    assert rows.headers[:, 1].tolist() == [0, 1, 2, 3]       # full blocks left of the diagonal
    assert rows.headers[:, 2].tolist() == [1, 1, 1, 1]       # the diagonal block
    assert rows.order.tolist() == [3, 2, 1, 0]
    assert cols.order.tolist() == [0, 1, 2, 3]
    assert rows.max_count == 4


def test_upper_blocks_dropped_under_causal():
    upper = np.triu(np.ones((1, 5, 5), dtype=bool), 1)
    rows, cols = block_lists(upper, causal=True)
    assert rows.entries.shape == (0, 2) and cols.entries.shape == (0, 2)
    assert (rows.headers[:, 1:] == 0).all()


def test_docstring_example_and_doctests():
    rows, cols = block_lists(np.ones((1, 2, 2), dtype=bool), causal=True)
    assert rows.headers.tolist() == [[0, 0, 1], [1, 1, 1]]
    assert rows.entries.tolist() == [[0, -1], [0, -1], [1, -1]]
    assert cols.headers.tolist() == [[0, 1, 1], [2, 0, 1]]
    assert cols.entries.tolist() == [[1, -1], [0, -1], [1, -1]]
    assert (rows.order.tolist(), cols.order.tolist()) == ([1, 0], [0, 1])
    assert doctest.testmod(blocklist).failed == 0
    assert doctest.testmod(layouts).failed == 0


def test_rectangular_layout_is_refused():
    with pytest.raises(ValueError, match="square in its last two axes; got shape \\(1, 2, 3\\)"):
        block_lists(np.ones((1, 2, 3), dtype=bool))
