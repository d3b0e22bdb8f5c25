"""bench/conv_implicit.py runs (``--quick --cpu``: Triton's interpreter, one tiny layer): each path
checked against float64 and timed, the implicit row saying which launches served it, written as
JSON and Markdown."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.interpreter
def test_the_benchmark_smoke_run(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "conv_implicit.py"), "--quick", "--cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "conv-implicit-cpu.json").read_text())
    (row,) = result["rows"]
    assert result["meta"]["kernels"]["launch"] in ("aot", "jit")
    for path in ("implicit", "grouped"):
        assert row[path]["max_rel_err"] < 1e-4 and row[path]["fwd_ms"] > 0, row
    assert row["implicit"]["launch"] == "jit/jit"  # CPU tensors: Triton's interpreter
    assert "[jit/jit]" in (tmp_path / "conv-implicit-cpu.md").read_text()
