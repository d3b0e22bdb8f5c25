"""``bench/norms_split.py --cpu``: both backwards of a long ``(C, N)`` segment checked against
float64 and timed, the split one being the launcher's choice."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]


def test_the_smoke_run_checks_both_backwards(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "norms_split.py"), "--cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    [row] = json.loads((tmp_path / "norms-split-bwd-cpu.json").read_text())["rows"]
    assert row["split"] and row["C"] > row["old_tile"][1]  # chunked by the old tile, split by the new
    assert row["old_err"] < 1e-5 and row["new_err"] < 1e-5
    assert row["old_ms"] > 0 and row["new_ms"] > 0
