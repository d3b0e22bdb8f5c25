"""The round-2 kernel candidates (issue 16): the stream kernel's tables and schedules (numpy), the
persistent / stream-K / grouped kernel through Triton's interpreter against float64 references, and
updat's balanced token slices."""
import doctest
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.ops.matmul import stream_table as st  # noqa: E402
from blocksparse.ops.matmul import updat_balance  # noqa: E402
from blocksparse.ops.matmul.updat_balance import balanced_split  # noqa: E402
from blocksparse.ops.matmul.xprop_stream import StreamConfig, device_plan, plan_stream, xprop_stream  # noqa: E402
from blocksparse.testing import TOLERANCE as TOL  # noqa: E402
from blocksparse.testing import rel_error  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def test_doctests():
    assert doctest.testmod(st).failed == 0
    assert doctest.testmod(updat_balance).failed == 0


# ----------------------------------------------------------------------------- tables (numpy)

def _paired_layout(rng, pairs=4, rows=3):
    """Columns that come in pairs with identical rows, shuffled: perfect groups exist."""
    base = np.kron(np.eye(pairs, dtype=int), np.ones((rows, 2), dtype=int))
    return base[:, rng.permutation(2 * pairs)]


@pytest.mark.parametrize("group", [2, 4])
def test_overlap_groups_find_shared_inputs(rng, group):
    mask = _paired_layout(rng, pairs=4)
    groups = st.overlap_groups(mask, group)
    assert sorted(groups[groups >= 0].tolist()) == list(range(8))
    lay = Layout(mask, 8)
    # pairs share every row: each loaded input tile serves 2 blocks (G=4 merges two disjoint pairs)
    assert st.reuse(lay, "fprop", groups) == 2.0
    assert st.reuse(lay, "fprop", st.adjacent_groups(8, group)) <= 2.0
    for g in groups:
        if group == 2:
            assert (mask[:, g[0]] == mask[:, g[1]]).all()


def test_overlap_groups_odd_count_and_determinism(rng):
    mask = random_layout(rng, 5, 7, 0.5)
    groups = st.overlap_groups(mask, 4)
    assert groups.shape == (2, 4)
    assert sorted(groups[groups >= 0].tolist()) == list(range(7))
    assert np.array_equal(groups, st.overlap_groups(mask, 4))
    assert np.array_equal(st.overlap_groups(mask, 1), np.arange(7)[:, None])


@pytest.mark.parametrize("kind", ["fprop", "bprop"])
@pytest.mark.parametrize("group, grouping", [(1, "adjacent"), (2, "overlap"), (4, "overlap"), (4, "adjacent")],
                         ids=["G1", "G2-overlap", "G4-overlap", "G4-adjacent"])
def test_stream_table_walk(rng, kind, group, grouping):
    """Rebuild the layout from the table: every block once, at its (input, output), rows sorted,
    one zero row per empty group, ``last`` on each group's final row."""
    lay = Layout(random_layout(rng, 6, 7, 0.4, empty_rows=1, empty_cols=2), 8)
    mask = lay.mask if kind == "fprop" else lay.mask.T
    groups = (st.overlap_groups(mask, group) if grouping == "overlap"
              else st.adjacent_groups(mask.shape[1], group))
    t = st.stream_table(lay, kind, groups)
    assert t.entries.dtype == np.int32 and not t.entries.flags.writeable
    assert t.entries.shape == (t.num_entries, 3 + group) and t.group == group
    seen = np.zeros(lay.blocks, dtype=int)
    for g in range(t.num_groups):
        rows = t.entries[t.offsets[g]:t.offsets[g + 1]]
        assert len(rows) >= 1 and (rows[:, 1] == g).all()
        assert rows[:, 2].tolist() == [0] * (len(rows) - 1) + [1]
        assert (np.diff(rows[:, 0]) > 0).all()
        if (rows[:, 3:] < 0).all():
            assert len(rows) == 1 and not mask[:, t.outs[g][t.outs[g] >= 0]].any()
            continue
        for row in rows:
            for j, blk in enumerate(row[3:]):
                out = t.outs[g, j]
                if blk >= 0:
                    seen[blk] += 1
                    c, k = lay.block_coord(int(blk))
                    assert (row[0], out) == ((c, k) if kind == "fprop" else (k, c))
                elif out >= 0:
                    assert not mask[row[0], out]
    assert (seen == 1).all()


@pytest.mark.parametrize("programs", [1, 3, 7])
def test_aligned_schedule(rng, programs):
    lay = Layout(random_layout(rng, 4, 5, 0.5, empty_cols=1), 8)
    t = st.stream_table(lay, "fprop", st.overlap_groups(lay.mask, 2))
    steps, cuts = st.aligned_schedule(t, token_tiles=3, programs=programs)
    assert sorted(steps.tolist()) == list(range(3 * t.num_entries))   # every step once
    E = t.num_entries
    for p in range(programs):
        mine = steps[cuts[p]:cuts[p + 1]]
        m, e = mine // E, mine % E
        items = sorted(set(zip(m.tolist(), t.entries[e, 1].tolist())))
        # round-robin: program p owns items p, p + P, ... and each whole, in order
        assert [mm * t.num_groups + g for mm, g in items] == list(range(p, 3 * t.num_groups, programs))
        assert t.entries[e[-1], 2] == 1 if len(e) else True
    assert np.array_equal(st.split_schedule(t, 2), np.arange(2 * E))


@pytest.mark.parametrize("split", [False, True], ids=["aligned", "stream-K"])
def test_plan_rows(rng, split):
    """The kernel's step rows are (token tile, the entry) of each step code; programs fit the work."""
    lay = Layout(random_layout(rng, 4, 6, 0.5, empty_cols=1), 32)
    cfg = StreamConfig(BM=16, G=2, num_warps=4, num_stages=2, BK=16, SPLIT=split, PER_SM=3)
    plan = plan_stream(lay, "bprop", 40, cfg, sms=2)
    E = plan.table.num_entries
    assert plan.token_tiles == 3 and plan.sub_steps == 2 and plan.programs == 6
    assert plan.rows.shape == (3 * E, 4 + 2) and plan.rows.dtype == np.int32
    assert np.array_equal(plan.rows[:, 0], plan.steps // E)
    assert np.array_equal(plan.rows[:, 1:], plan.table.entries[plan.steps % E])
    assert (plan.cuts is None) == split


@pytest.mark.parametrize("call, err, words", [
    (lambda lay: st.overlap_groups(lay.mask, 3), ValueError, "group must be one of"),
    (lambda lay: st.adjacent_groups(4, 2.0), TypeError, "group must be an int"),
    (lambda lay: st.stream_table(lay, "updat", st.adjacent_groups(2, 1)), ValueError, "kind"),
    (lambda lay: st.stream_table(lay, "fprop", np.array([[0, 0], [1, -1]])), ValueError, "exactly once"),
    (lambda lay: st.stream_table(lay, "fprop", np.array([0, 1])), ValueError, "2-D"),
    (lambda lay: plan_stream(lay, "fprop", 16, StreamConfig(16, 1, 4, 1, SPLIT=True), 2), ValueError, "PER_SM"),
    (lambda lay: plan_stream(lay, "fprop", 16, StreamConfig(16, 1, 4, 1, GROUPING="rows"), 2), ValueError,
     "GROUPING"),
], ids=["group-3", "group-float", "kind", "output-twice", "groups-1d", "split-no-programs", "grouping"])
def test_bad_input(call, err, words):
    with pytest.raises(err, match=words):
        call(Layout([[1, 1], [0, 1]], 16))


# ----------------------------------------------------------------------------- kernel (interpreter)

def _setup(rng, bs, axis, n, dtype, CB, KB, density):
    lay = Layout(random_layout(rng, CB, KB, density, empty_rows=1, empty_cols=1), bs)
    x = rng.standard_normal((n, lay.C) if axis == 1 else (lay.C, n))
    dy = rng.standard_normal((n, lay.K) if axis == 1 else (lay.K, n))
    w = rng.standard_normal(lay.w_shape) / np.sqrt(bs)
    t = lambda a: torch.from_numpy(a).to(DTYPES[dtype])  # noqa: E731
    refs = dense_products(lay, t(x).double().numpy(), t(w).double().numpy(), t(dy).double().numpy(), axis)
    return lay, t(x), t(w), t(dy), refs


def _max_parts(plan):
    """Most programs any output item is split between (the kernel's stream-K arithmetic)."""
    units = plan.steps.size * plan.sub_steps
    owner = lambda u: ((u + 1) * plan.programs - 1) // units  # noqa: E731
    t, most = plan.table, 1
    for m in range(plan.token_tiles):
        for g in range(t.num_groups):
            a = (m * t.num_entries + t.offsets[g]) * plan.sub_steps
            b = (m * t.num_entries + t.offsets[g + 1]) * plan.sub_steps
            most = max(most, owner(b - 1) - owner(a) + 1)
    return most


#: (bs, G, BK, SKIP, SPLIT, PER_SM, GROUPING, tokens, axis, dtype, layout CB x KB, density)
CASES = {
    "persist-G1": (16, 1, 0, False, False, 1, "overlap", 33, 1, "float32", 3, 6, 0.5),
    "items-G2-skip": (16, 2, 0, True, False, 0, "overlap", 20, 1, "bfloat16", 3, 6, 0.5),
    "persist-G4-skip-adjacent-axis0": (16, 4, 0, True, False, 1, "adjacent", 24, 0, "float16", 3, 6, 0.5),
    "streamk-G1-BK16-tall": (32, 1, 16, False, True, 3, "overlap", 16, 1, "float32", 6, 2, 1.0),  # every column splits
    "streamk-G2-BK16-axis0": (32, 2, 16, False, True, 2, "overlap", 24, 0, "bfloat16", 3, 5, 0.5),
    "streamk-G4-skip": (16, 4, 0, True, True, 2, "overlap", 17, 1, "float32", 4, 6, 0.5),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES)
def test_xprop_stream(rng, case):
    bs, group, bk, skip, split, per_sm, grouping, n, axis, dtype, CB, KB, density = CASES[case]
    lay, x, w, dy, (y_ref, dx_ref, _) = _setup(rng, bs, axis, n, dtype, CB, KB, density)
    cfg = StreamConfig(BM=16, G=group, num_warps=4, num_stages=2, BK=bk, SKIP=skip, SPLIT=split,
                       PER_SM=per_sm, GROUPING=grouping)
    for kind, inp, out_features, ref in (("fprop", x, lay.K, y_ref), ("bprop", dy, lay.C, dx_ref)):
        plan = plan_stream(lay, kind, n, cfg, sms=2)
        tables = device_plan(plan, "cpu")
        got = xprop_stream(inp, w, plan, tables, out_features=out_features, bs=bs, axis=axis,
                           trans=kind == "bprop", cfg=cfg)
        assert got.dtype == inp.dtype and got.shape == ref.shape
        assert rel_error(got.double().numpy(), ref) < TOL[dtype], kind
        assert not tables["counters"].any(), "ticket counters must be back at zero"
        if case == "streamk-G1-BK16-tall" and kind == "fprop":
            assert _max_parts(plan) >= 3, "the case must split an output between three programs"


@pytest.mark.interpreter
def test_stream_k_repeat_and_single_block(rng):
    """Counters left at zero serve the next call; a one-block layout with more programs than
    sub-steps runs on as many programs as there are sub-steps."""
    lay = Layout([[1]], 32)
    x = torch.from_numpy(rng.standard_normal((9, 32))).float()
    w = torch.from_numpy(rng.standard_normal(lay.w_shape)).float()
    cfg = StreamConfig(BM=16, G=1, num_warps=4, num_stages=2, BK=16, SPLIT=True, PER_SM=4)
    plan = plan_stream(lay, "fprop", 9, cfg, sms=2)
    assert plan.programs == 2
    tables = device_plan(plan, "cpu")
    first = xprop_stream(x, w, plan, tables, out_features=32, bs=32, axis=1, trans=False, cfg=cfg)
    second = xprop_stream(x, w, plan, tables, out_features=32, bs=32, axis=1, trans=False, cfg=cfg)
    ref = x.double().numpy() @ w[0].double().numpy()
    assert rel_error(first.double().numpy(), ref) < TOL["float32"]
    assert torch.equal(first, second)


def test_xprop_stream_tokens(rng):
    lay = Layout([[1, 0], [1, 1]], 16)
    cfg = StreamConfig(BM=16, G=2, num_warps=4, num_stages=1, PER_SM=1)
    plan = plan_stream(lay, "fprop", 0, cfg, sms=2)
    w = torch.randn(lay.w_shape)
    y = xprop_stream(torch.empty(0, 32), w, plan, device_plan(plan, "cpu"), out_features=32, bs=16, axis=1,
                     trans=False, cfg=cfg)
    assert y.shape == (0, 32)
    with pytest.raises(ValueError, match="token tiles"):
        xprop_stream(torch.randn(40, 32), w, plan, device_plan(plan, "cpu"), out_features=32, bs=16, axis=1,
                     trans=False, cfg=cfg)


# ----------------------------------------------------------------------------- updat slices

@pytest.mark.parametrize("runs, tokens, bk, slots, expect_split", [
    (150, 8192, 64, 132, True), (512, 8192, 64, 264, False), (7, 64, 64, 132, False),
    (1090, 8192, 64, 396, False), (133, 4096, 64, 132, True)],
    ids=["bs128-d0.1-tail", "1.94-rounds", "few-tokens", "2.75-rounds", "one-over"])
def test_balanced_split(runs, tokens, bk, slots, expect_split):
    """More slices only where they shorten the estimated time by 15%; then the fewest within 5%
    of the best."""
    split = balanced_split(runs, tokens, bk, slots)
    most = max(1, math.ceil(tokens / (4 * bk)))
    cost = lambda s: math.ceil(runs * s / slots) / s  # noqa: E731
    best = min(cost(s) for s in range(1, most + 1))
    assert (split > 1) == expect_split
    if split > 1:
        assert cost(split) <= 1.05 * best < 0.85 * 1.05 * cost(1)
        assert all(cost(s) > 1.05 * best for s in range(1, split))


@pytest.mark.parametrize("args, err", [((0, 64, 64, 132), ValueError), ((10, -1, 64, 132), ValueError),
                                       ((10, 64, 64, 0), ValueError), ((10.0, 64, 64, 132), TypeError),
                                       ((10, 64, True, 132), TypeError)],
                         ids=["no-runs", "negative-tokens", "no-slots", "float-runs", "bool-bk"])
def test_balanced_split_bad_input(args, err):
    with pytest.raises(err, match="runs|n_tokens|bk|slots"):
        balanced_split(*args)
