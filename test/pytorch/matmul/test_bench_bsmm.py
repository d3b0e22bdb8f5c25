"""bench/bsmm.py's measurement rules, without a GPU: the pooled dense baseline, the agreement of two
runs (and its ``--agree`` command), and the extra rounds a noisy problem gets."""
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import bsmm  # noqa: E402


def _row(impl, ms, op="fprop", dtype="bf16", n=8192, bs=32, density=0.5, useful=0.5):
    flops = 2.0 * n * bsmm.C * bsmm.K * (1.0 if impl == "dense" else useful)
    return dict(impl=impl, op=op, dtype=dtype, bs=bs, density=density, N=n, ms=ms, tflops=flops / ms / 1e9)


def test_frac_of_dense_divides_by_the_median_dense_time_of_the_op_dtype_and_n():
    rng = random.Random(7)
    dense = [rng.uniform(0.3, 0.4) for _ in range(5)]
    rows = [_row("dense", ms, density=d) for ms, d in zip(dense, (0.1, 0.25, 0.5, 0.5, 0.1))]
    rows += [_row("blocksparse", 0.25), _row("blocksparse", 0.25, op="updat"), _row("torch-bsr", 0.9)]
    bsmm.pool_dense(rows)
    median = sorted(dense)[2]
    ours, other_op, bsr = rows[5], rows[6], rows[7]
    assert ours["pooled_dense_ms"] == bsr["pooled_dense_ms"] == median
    assert ours["frac_of_dense"] == pytest.approx(0.5 * median / 0.25)   # useful work / time, over dense's
    assert bsr["frac_of_dense"] == pytest.approx(0.5 * median / 0.9)
    assert "pooled_dense_ms" not in other_op and "frac_of_dense" not in other_op  # no dense updat timed


def test_agreement_names_the_largest_relative_difference(tmp_path):
    a = [dict(_row("blocksparse", 1.0, bs=bs), frac_of_dense=f) for bs, f in ((32, 0.30), (64, 0.50))]
    b = [dict(_row("blocksparse", 1.0, bs=bs), frac_of_dense=f) for bs, f in ((32, 0.33), (64, 0.51))]
    a.append(dict(_row("dense", 1.0), frac_of_dense=1.0))
    worst, where, diffs = bsmm.agreement(a, b)
    assert where == ("blocksparse", "fprop", "bf16", 32, 0.5, 8192) and worst == pytest.approx(0.03 / 0.33)
    assert len(diffs) == 2  # dense rows are not compared
    for i, rows in enumerate((a, b)):
        (tmp_path / f"run{i}.json").write_text(json.dumps({"rows": rows}))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bsmm.py"), "--agree", str(tmp_path / "run0.json"),
                           str(tmp_path / "run1.json"), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "bsmm-h200-agreement.json").read_text())
    assert summary["rows_compared"] == 2 and summary["largest_rel_diff"] == pytest.approx(worst)
    assert [row[:6] for row in summary["over_5_percent"]] == [list(where)]


class _Timer:
    def __init__(self, noise, rng):
        self.noise, self.rng, self.calls = noise, rng, 0

    def ms(self, first=False):
        self.calls += 1
        return 1.0 + self.noise * self.rng.random()


@pytest.mark.parametrize("noise, rounds", [(0.01, 5), (0.5, 10)], ids=["steady", "noisy"])
def test_a_noisy_problem_gets_as_many_rounds_again(noise, rounds):
    rng = random.Random(3)
    timers = {"dense": _Timer(0.01, rng), "blocksparse": _Timer(noise, rng)}
    got = bsmm.interleaved(timers, 5)
    assert {name: taken for name, (_, _, taken) in got.items()} == {"dense": rounds, "blocksparse": rounds}
    assert all(t.calls == rounds for t in timers.values())
    assert (got["blocksparse"][1] > bsmm.NOISY_SPREAD) == (noise > bsmm.NOISY_SPREAD)


def _part(dtypes, hbm, rows):
    return dict(device="GPU", torch="t", triton="t", date="2026-01-01", hbm_gbs=hbm, l2_gbs=2 * hbm,
                C=bsmm.C, K=bsmm.K, dtypes=list(dtypes), rounds=5, run=2, rows=rows)


def test_merge_joins_parts_of_one_run_timed_in_separate_calls(tmp_path):
    rng = random.Random(11)
    a = [dict(_row(impl, rng.uniform(0.2, 0.4), dtype=dt), frac_of_dense=rng.random())
         for dt in ("bf16", "fp16") for impl in ("dense", "blocksparse")]
    b = [dict(_row(impl, rng.uniform(0.5, 0.9), dtype="fp32"), frac_of_dense=rng.random())
         for impl in ("dense", "blocksparse")]
    parts = [tmp_path / "a.json", tmp_path / "b.json"]
    parts[0].write_text(json.dumps(_part(("bf16", "fp16"), 4000.0, a)))
    parts[1].write_text(json.dumps(_part(("fp32",), 3900.0, b)))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bsmm.py"), "--merge", *map(str, parts),
                           "--run", "2", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((tmp_path / "out" / "bsmm-h200-run2.json").read_text())
    assert run["rows"] == a + b and run["dtypes"] == ["bf16", "fp16", "fp32"]
    assert run["hbm_gbs"] == 3900.0 and [p["dtypes"] for p in run["parts"]] == [["bf16", "fp16"], ["fp32"]]
    table = (tmp_path / "out" / "bsmm-h200-run2.md").read_text()
    assert "## N = 8192 (compute bound), fp32" in table and "`bsmm-h200-run2.json`" in table


def test_merge_refuses_parts_that_time_the_same_problems():
    rows = [dict(_row("blocksparse", 0.3), frac_of_dense=0.5)]
    with pytest.raises(ValueError, match=r"part 1 repeats \(dtype, N\) \('bf16', 8192\) of part 0"):
        bsmm.merge([_part(("bf16",), 4000.0, rows), _part(("bf16",), 4000.0, list(rows))])


@pytest.mark.parametrize("replay_ms, replays", [(0.5, 10), (4.0, 10), (10.0, 4), (13.0, 4), (30.0, 3), (400.0, 3)])
def test_graph_timings_replay_about_the_budget(replay_ms, replays):
    assert bsmm.graph_replays(replay_ms) == replays
    if 3 < replays < 10:  # enough replays to fill the budget, one fewer would not
        assert replays * replay_ms >= bsmm.GRAPH_BUDGET_MS > (replays - 1) * replay_ms


def test_bsr_copies_share_the_structure_and_own_their_values():
    import common
    import torch

    case = bsmm.Case.__new__(bsmm.Case)
    case.p, case._bsr = common.Problem(128, 96, 8, 32, 0.5, torch.float32, seed=random.randrange(1000),
                                       device="cpu"), None
    dense = case.p.dense_w(torch.float32)
    wt, w = case.bsr(case.p.w)
    assert torch.equal(w.to_dense(), dense) and torch.equal(wt.to_dense(), dense.t())
    assert case.bsr(case.p.w)[0] is wt  # the problem's own weight: converted once
    copy = case.p.w.clone()
    for mine, theirs in zip(case.bsr(copy), (wt, w)):
        assert torch.equal(mine.to_dense(), theirs.to_dense())
        assert mine.values().data_ptr() != theirs.values().data_ptr()  # its own bytes to read
    other = torch.randn_like(copy)  # not a copy: converted for itself
    assert torch.equal(case.bsr(other)[1].to_dense(), case.dense(other))


def test_the_table_tells_a_failed_call_from_a_problem_not_reached():
    meta = dict(device="GPU", torch="t", triton="t", date="2026-01-01", hbm_gbs=4000.0, l2_gbs=9000.0,
                dtypes=["bf16"], rounds=5)
    rows = [dict(_row("dense", 0.35, op=op), frac_of_dense=1.0) for op in bsmm.OPS]
    rows += [dict(_row("blocksparse", 0.3, op=op), frac_of_dense=0.61, ok=True) for op in bsmm.OPS]
    rows += [dict(impl="torch-bsr", op=op, dtype="bf16", bs=32, density=0.5, N=8192, error="RuntimeError()")
             for op in bsmm.OPS]
    table = bsmm.markdown(meta, rows)
    row = next(line for line in table.splitlines() if line.startswith("| 32 | 0.5 |"))
    assert row.split(" | ")[2:] == ["0.61", "err"] * 2 + ["0.61", "err |"]
    unreached = next(line for line in table.splitlines() if line.startswith("| 64 | 0.5 |"))
    assert unreached.count("–") == 6 and "err" not in unreached
    assert "## N = 64 (memory bound), bf16\n\nNot reached in this run." in table  # no row of that N
