"""The layout core: validation, block order and the three lookup tables."""
import doctest

import numpy as np
import pytest

import blocksparse.layout as layout_mod
from blocksparse.layout import BLOCK_SIZES, Layout, morton_key
from blocksparse.testing.matmul import random_layout


def test_doctests():
    assert doctest.testmod(layout_mod).failed == 0


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize("bad, err, words", [
    (np.ones(4), ValueError, "2-D"),
    (np.ones((2, 2, 2)), ValueError, "2-D"),
    (np.zeros((3, 4)), ValueError, "at least one nonzero"),
    (np.array([[0, 2], [1, 0]]), ValueError, "only 0 and 1"),
    (np.array([[0.5, 1.0]]), ValueError, "only 0 and 1"),
    (np.array([[-1, 1]]), ValueError, "only 0 and 1"),
    (np.zeros((0, 4)), ValueError, "at least one row"),
    (np.array([["a", "b"]]), TypeError, "dtype"),
    ([[1, 0], [1]], ValueError, "layout"),
], ids=["1d", "3d", "all-zero", "value-2", "value-0.5", "value-neg", "empty", "strings", "ragged"])
def test_bad_layout(bad, err, words):
    with pytest.raises(err, match=words) as info:
        Layout(bad, 8)
    assert "layout" in str(info.value)


@pytest.mark.parametrize("bs, err", [(0, ValueError), (-32, ValueError), (24, ValueError),
                                     (256, ValueError), (32.0, TypeError), ("32", TypeError),
                                     (True, TypeError), (None, TypeError)])
def test_bad_block_size(bs, err):
    with pytest.raises(err, match="block_size") as info:
        Layout([[1]], bs)
    assert "(8, 16, 32, 64, 128)" in str(info.value)


@pytest.mark.parametrize("lay", [[[True, False]], [[1.0, 0.0]], np.array([[1, 0]], dtype=np.uint8)],
                         ids=["bool", "float", "uint8"])
def test_accepted_layout_types(lay):
    assert Layout(lay, 8).mask.tolist() == [[True, False]]


def test_mask_is_a_readonly_copy():
    src = np.array([[1, 0], [0, 1]])
    lay = Layout(src, 16)
    src[0, 1] = 1
    assert lay.blocks == 2
    with pytest.raises(ValueError):
        lay.mask[0, 0] = False
    with pytest.raises(ValueError):
        lay.coords[0, 0] = 5


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_shapes(bs, rng):
    mask = random_layout(rng, 5, 7, 0.4)
    lay = Layout(mask, bs)
    assert (lay.CB, lay.KB, lay.C, lay.K) == (5, 7, 5 * bs, 7 * bs)
    assert lay.w_shape == (int(mask.sum()), bs, bs)
    assert lay.density == pytest.approx(mask.mean())


# ---------------------------------------------------------------- block order

def test_row_major_order(rng):
    mask = random_layout(rng, 9, 6, 0.5)
    lay = Layout(mask, 8)
    expect = [(c, k) for c in range(9) for k in range(6) if mask[c, k]]
    assert [lay.block_coord(b) for b in range(lay.blocks)] == expect


def test_z_order(rng):
    mask = random_layout(rng, 16, 16, 0.5)
    lay = Layout(mask, 8, z_order=True)

    def interleave(c, k):  # independent bit-by-bit reference
        key = 0
        for bit in range(8):
            key |= ((c >> bit) & 1) << (2 * bit) | ((k >> bit) & 1) << (2 * bit + 1)
        return key

    expect = sorted(((c, k) for c in range(16) for k in range(16) if mask[c, k]),
                    key=lambda ck: interleave(*ck))
    assert [tuple(map(int, lay.coords[b])) for b in range(lay.blocks)] == expect
    assert morton_key(np.array([3]), np.array([5]))[0] == interleave(3, 5)


def test_block_coord_errors():
    lay = Layout([[1, 1]], 8)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        lay.block_coord(2)
    with pytest.raises(TypeError, match="block"):
        lay.block_coord(1.0)


def test_block_ids_inverse(rng):
    lay = Layout(random_layout(rng, 6, 5, 0.5), 8, z_order=True)
    ids = lay.block_ids
    for b in range(lay.blocks):
        assert ids[lay.block_coord(b)] == b
    assert (ids >= 0).sum() == lay.blocks


def test_dense_pack_roundtrip(rng):
    lay = Layout(random_layout(rng, 4, 3, 0.5), 8, z_order=True)
    w = rng.standard_normal(lay.w_shape)
    dense = lay.dense(w)
    for b in range(lay.blocks):
        c, k = lay.block_coord(b)
        np.testing.assert_array_equal(dense[c * 8:(c + 1) * 8, k * 8:(k + 1) * 8], w[b])
    assert np.count_nonzero(dense) == w.size
    np.testing.assert_array_equal(lay.pack(dense), w)
    with pytest.raises(ValueError, match="shape"):
        lay.dense(w[:-1])


# ---------------------------------------------------------------- lookup tables

def _expand(lut, num_out):
    """Walk an xprop table, checking its structure; return {output: [(inp, block), ...]}."""
    G = lut.group
    assert lut.headers.dtype == lut.entries.dtype == lut.offsets.dtype == np.int32
    assert lut.entries.shape[1] == 1 + G
    assert lut.num_groups == -(-num_out // G)
    assert lut.offsets[0] == 0 and lut.offsets[-1] == lut.num_segments
    seen = {o: [] for o in range(num_out)}
    for g in range(lut.num_groups):
        rows = lut.headers[lut.offsets[g]:lut.offsets[g + 1]]
        assert len(rows) >= 1
        assert rows[:, 0].tolist() == [g] * len(rows)
        assert rows[:, 3].tolist() == list(range(len(rows)))
        if len(rows) > 1:  # near-equal split, no empty segment
            assert rows[:, 2].max() - rows[:, 2].min() <= 1 and rows[:, 2].min() >= 1
        ent = np.concatenate([lut.entries[s:s + n] for _, s, n, _ in rows])
        assert ent[:, 0].tolist() == sorted(set(ent[:, 0].tolist()))  # sorted, distinct inputs
        for row in ent:
            assert (row[1:] >= 0).any()  # no all-empty entry
            for j, blk in enumerate(row[1:]):
                if blk >= 0:
                    assert g * G + j < num_out
                    seen[g * G + j].append((int(row[0]), int(blk)))
        if lut.max_segment is not None:
            assert rows[:, 2].max() <= lut.max_segment
    return seen


@pytest.mark.parametrize("group", [1, 2, 3, 4])
@pytest.mark.parametrize("max_segment", [None, 1, 3, 100])
@pytest.mark.parametrize("z_order", [False, True])
def test_fprop_bprop_tables(rng, max_segment, z_order, group):
    mask = random_layout(rng, 11, 9, 0.45, empty_rows=2, empty_cols=2)
    lay = Layout(mask, 16, z_order=z_order)
    ids = lay.block_ids
    for kind, m in (("fprop", mask.T), ("bprop", mask)):
        lut = getattr(lay, kind)(max_segment, group=group)
        seen = _expand(lut, m.shape[0])
        for o, got in seen.items():
            expect = [(i, ids[i, o] if kind == "fprop" else ids[o, i]) for i in np.nonzero(m[o])[0]]
            assert got == expect, (kind, o)
        for g in range(lut.num_groups):  # an empty group: a single zero-count header
            if not any(seen[o] for o in range(g * group, min((g + 1) * group, m.shape[0]))):
                rows = lut.headers[lut.offsets[g]:lut.offsets[g + 1]]
                assert rows[:, 2].tolist() == [0]
        # every block appears exactly once
        blocks = lut.entries[:, 1:][lut.entries[:, 1:] >= 0]
        assert sorted(blocks.tolist()) == list(range(lay.blocks))


def test_grouped_entries_share_inputs():
    lay = Layout([[1, 1, 0], [0, 1, 1], [1, 0, 0]], 8)
    lut = lay.fprop(group=2)  # groups: columns {0, 1} and {2}
    assert lut.entries.tolist() == [[0, 0, 1], [1, -1, 2], [2, 4, -1], [1, 3, -1]]
    assert lut.headers.tolist() == [[0, 0, 3, 0], [1, 3, 1, 0]]


@pytest.mark.parametrize("group", [1, 2, 4])
def test_updat_groups(rng, group):
    lay = Layout(random_layout(rng, 7, 9, 0.5, empty_rows=1), 8, z_order=True)
    rows = lay.updat_groups(group)
    assert rows.dtype == np.int32 and rows.shape[1] == 1 + 2 * group
    seen = []
    for row in rows:
        c, ks, bs = row[0], row[1:1 + group], row[1 + group:]
        assert ((ks >= 0) == (bs >= 0)).all() and bs[0] >= 0
        assert (ks[ks >= 0] == np.sort(ks[ks >= 0])).all()
        for k, b in zip(ks[ks >= 0], bs[bs >= 0]):
            assert lay.block_coord(int(b)) == (c, k)
            seen.append(int(b))
    assert sorted(seen) == list(range(lay.blocks))


def test_segment_split_counts():
    lay = Layout(np.ones((10, 1)), 8)
    assert lay.fprop(4).headers[:, 2].tolist() == [4, 3, 3]
    assert lay.fprop(4).parts.tolist() == [3]
    assert lay.fprop(10).num_segments == 1
    assert lay.fprop().max_count == 10


def test_tables_are_memoised_and_readonly():
    lay = Layout(np.ones((3, 3)), 8)
    assert lay.fprop(2) is lay.fprop(2)
    with pytest.raises(ValueError):
        lay.fprop().headers[0, 0] = 1
    with pytest.raises(ValueError, match="max_segment"):
        lay.fprop(0)
    with pytest.raises(TypeError, match="max_segment"):
        lay.bprop(2.5)
    with pytest.raises(ValueError, match="group"):
        lay.fprop(group=0)


def test_updat_table(rng):
    lay = Layout(random_layout(rng, 5, 5, 0.5), 8, z_order=True)
    assert lay.updat.shape == (lay.blocks, 2)
    assert [tuple(map(int, r)) for r in lay.updat] == [lay.block_coord(b) for b in range(lay.blocks)]


def test_equality_and_hash():
    a, b = Layout([[1, 0], [1, 1]], 8), Layout(np.array([[True, False], [True, True]]), 8)
    assert a == b and hash(a) == hash(b)
    assert a != Layout([[1, 0], [1, 1]], 16) and a != Layout([[1, 0], [1, 1]], 8, z_order=True)


@pytest.mark.parametrize("c, k, error, match", [
    (-1, 0, ValueError, r"c must hold integers in \[0, 2\*\*32\)"),
    (0, 2**32, ValueError, r"k must hold integers in \[0, 2\*\*32\)"),
    (1.5, 0, TypeError, "c must hold integers"),
])
def test_morton_key_refuses_what_it_cannot_interleave(c, k, error, match):
    with pytest.raises(error, match=match):
        morton_key(c, k)


def test_group_beyond_int32_is_refused():
    lay = Layout(np.ones((2, 2), dtype=np.int32), 16)
    for call in (lambda: lay.fprop(group=2**70), lambda: lay.bprop(group=2**31), lambda: lay.updat_groups(2**40)):
        with pytest.raises(ValueError, match="group must be >= 1 and <= 2147483647"):
            call()


def test_layout_reads_as_its_mask_in_numpy():
    """As the original's ``bsmm.layout`` (a bool array): numpy sees the block mask."""
    mask = np.array([[1, 0, 1], [0, 1, 1]])
    lay = Layout(mask, 8, z_order=True)
    assert np.array_equal(lay, mask) and lay.shape == (2, 3) and np.asarray(lay).dtype == bool
    assert np.asarray(lay, dtype=np.float32).sum() == 4.0
    arr = np.asarray(lay)
    arr[0, 0] = False                         # a copy: the layout is unchanged
    assert lay.mask[0, 0] and Layout(lay, 8, z_order=True) == lay
