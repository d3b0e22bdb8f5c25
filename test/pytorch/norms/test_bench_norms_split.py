"""``bench/norms_split.py --cpu``: both backwards of a long ``(C, N)`` segment checked against
float64 and timed, the split one being the launcher's choice."""
import json

import pytest
from bench_scripts import run_bench

pytest.importorskip("torch")
pytest.importorskip("triton")



def test_the_smoke_run_checks_both_backwards(tmp_path):
    run_bench("norms_split.py", "--cpu", "--out", tmp_path)
    [row] = json.loads((tmp_path / "norms-split-bwd-cpu.json").read_text())["rows"]
    assert row["split"] and row["C"] > row["old_tile"][1]  # chunked by the old tile, split by the new
    assert row["old_err"] < 1e-5 and row["new_err"] < 1e-5
    assert row["old_ms"] > 0 and row["new_ms"] > 0


def test_the_forward_smoke_run_checks_the_chunked_and_split_forwards(tmp_path):
    run_bench("norms_split.py", "--cpu", "--forward", "--out", tmp_path)
    [row] = json.loads((tmp_path / "norms-split-fwd-cpu.json").read_text())["rows"]
    assert row["C"] > row["old_tile"][1] and not row["split"]  # chunked; too small for the split forward
    splits = [k for k in row if k.startswith("split_") and k.endswith("_err")]
    assert splits and all(row[k] < 1e-5 for k in ["old_err", "new_err"] + splits)
    assert row["best"] + "_ms" in row
