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
