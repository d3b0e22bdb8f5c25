"""``bench/eager_ops.py --cpu``: every case checked against float64 and timed in both modes, the
table written."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_the_smoke_run_checks_and_times_every_case(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "eager_ops.py"), "--cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "eager-ops-cpu.json").read_text())["rows"]
    cases = {r["case"] for r in rows}
    assert len(cases) == 3 and len(rows) == 3 * 2 * 2  # cases x modes x (ours, torch)
    assert all(r["ok"] and r["eager_us"] > 0 for r in rows)
    table = (tmp_path / "eager-ops-cpu.md").read_text()
    assert sum(line.startswith(("| layer_norm", "| lstm_gates", "| attention")) for line in table.splitlines()) == 6
