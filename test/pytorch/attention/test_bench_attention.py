"""bench/attention.py runs (``--quick --cpu``: Triton's interpreter, tiny shapes): every case checked
against float64 -- ours as users call it and, on layouts that drop no block, the fused kernels
alone -- then timed, written as JSON and Markdown with the launches that served."""
import json

import pytest
from bench_scripts import run_bench

pytest.importorskip("torch")



@pytest.mark.interpreter
def test_the_benchmark_smoke_run(tmp_path):
    run_bench("attention.py", "--quick", "--cpu", "--out", tmp_path)
    rows = json.loads((tmp_path / "attention-cpu.json").read_text())["rows"]
    assert {r["layout"] for r in rows} == {"causal", "fixed", "bigbird"}
    assert all("error" not in r and r["ok"] and r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 for r in rows), rows
    ours = {r["layout"]: r for r in rows if r["impl"] == "ours"}
    assert all(r["launches"] == ["jit"] for r in ours.values())  # CPU tensors: Triton's interpreter
    assert any(r["impl"] == "kernels" and r["layout"] == "causal" for r in rows)
    table = (tmp_path / "attention-cpu.md").read_text()
    assert "| kernels fwd / fwd+bwd |" in table and table.count("| ok |") == 3


@pytest.mark.interpreter
def test_the_reduce_dq_sweep_smoke_run(tmp_path):
    """``--sweep --reduce-dq``: the table's backward and the bulk reduce-add variants, each checked
    against float64, then timed."""
    run_bench("attention.py", "--sweep", "--reduce-dq", "--cpu", "--out", tmp_path)
    rows = json.loads((tmp_path / "attention-sweep-cpu.json").read_text())["rows"]
    bwd = [r for r in rows if r["kind"] == "bwd"]
    assert len(bwd) == 6 and sum(r["config"]["atomic_dq"] for r in bwd) == 5
    assert all(r["ok"] and r["ms"] > 0 for r in rows), rows


@pytest.mark.interpreter
def test_the_long_bwd_sweep_smoke_run(tmp_path):
    """``--sweep --long-bwd``: the head-dim 128 table's backward and its neighbours, each checked
    against float64, then timed."""
    run_bench("attention.py", "--sweep", "--long-bwd", "--cpu", "--out", tmp_path)
    rows = json.loads((tmp_path / "attention-sweep-cpu.json").read_text())["rows"]
    bwd = [r for r in rows if r["kind"] == "bwd"]
    assert len(bwd) == 15 and len({json.dumps(r["config"], sort_keys=True) for r in bwd}) == 15
    assert all(r["ok"] and r["ms"] > 0 for r in rows), rows
