"""bench/aot_vs_jit.py runs (``--quick --cpu``: Triton's interpreter, tiny sizes, the session's
kernel library): every row planned against the library's few-token specs, checked against float64,
timed, and written as JSON and Markdown."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.interpreter
def test_the_benchmark_smoke_run(kernel_library_path, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "aot_vs_jit.py"), "--quick", "--cpu",
                           "--kernels", str(kernel_library_path), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "aot-vs-jit-cpu.json").read_text())
    rows = result["rows"]
    assert result["cpu"] is True and len(rows) == 6 and {r["op"] for r in rows} == {"fprop", "bprop", "updat"}
    for row in rows:
        assert row["ok"] and row["bitwise_equal"] and row["aot_over_jit"] > 0, row
        assert row["N"] <= 64 and row["max_tokens"] == 512 and "_few_" in row["spec"], row
    assert "| fprop | bf16 | 32 |" in (tmp_path / "aot-vs-jit-cpu.md").read_text()
