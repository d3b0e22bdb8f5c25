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
