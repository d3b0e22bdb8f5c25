"""``bench/eager_ops.py --cpu``: every case checked against float64 and timed in both modes, the
table written."""
import json

import pytest
from bench_scripts import run_bench

pytest.importorskip("torch")



def test_the_smoke_run_checks_and_times_every_case(tmp_path):
    run_bench("eager_ops.py", "--cpu", "--out", tmp_path)
    rows = json.loads((tmp_path / "eager-ops-cpu.json").read_text())["rows"]
    cases = {r["case"] for r in rows}
    assert len(cases) == 3 and len(rows) == 3 * 2 * 2  # cases x modes x (ours, torch)
    assert all(r["ok"] and r["eager_us"] > 0 for r in rows)
    table = (tmp_path / "eager-ops-cpu.md").read_text()
    assert sum(line.startswith(("| layer_norm", "| lstm_gates", "| attention")) for line in table.splitlines()) == 6
