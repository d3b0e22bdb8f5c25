"""bench/aot_vs_jit.py runs (``--quick --cpu``: Triton's interpreter, tiny sizes, the session's
kernel library): every row planned against the library's few-token specs, checked against float64,
timed, and written as JSON and Markdown."""
import json

import pytest
from bench_scripts import run_bench

pytest.importorskip("torch")



@pytest.mark.interpreter
def test_the_benchmark_smoke_run(kernel_library_path, tmp_path):
    run_bench("aot_vs_jit.py", "--quick", "--cpu", "--kernels", kernel_library_path, "--out", tmp_path)
    result = json.loads((tmp_path / "aot-vs-jit-cpu.json").read_text())
    rows = result["rows"]
    assert result["cpu"] is True and len(rows) == 6 and {r["op"] for r in rows} == {"fprop", "bprop", "updat"}
    for row in rows:
        assert row["ok"] and row["bitwise_equal"] and row["aot_over_jit"] > 0, row
        assert row["N"] <= 64 and row["max_tokens"] == 512 and "_few_" in row["spec"], row
    assert "| fprop | bf16 | 32 |" in (tmp_path / "aot-vs-jit-cpu.md").read_text()
