"""bench/conv_implicit.py runs (``--quick --cpu``: Triton's interpreter, one tiny layer): each path
checked against float64 and timed, the implicit row saying which launches served it, written as
JSON and Markdown."""
import json
import sys

import pytest
from bench_scripts import BENCH, run_bench

pytest.importorskip("torch")



@pytest.mark.interpreter
def test_the_benchmark_smoke_run(tmp_path):
    run_bench("conv_implicit.py", "--quick", "--cpu", "--out", tmp_path)
    result = json.loads((tmp_path / "conv-implicit-cpu.json").read_text())
    (row,) = result["rows"]
    assert result["meta"]["kernels"]["launch"] in ("aot", "jit")
    for path in ("implicit", "grouped"):
        assert row[path]["max_rel_err"] < 1e-4 and row[path]["fwd_ms"] > 0, row
    assert row["implicit"]["launch"] == "jit/jit"  # CPU tensors: Triton's interpreter
    assert "[jit/jit]" in (tmp_path / "conv-implicit-cpu.md").read_text()


def test_a_part_of_a_run_keeps_only_the_named_shapes_and_dtypes():
    sys.path.insert(0, str(BENCH))
    try:
        import conv
        import conv_implicit
    finally:
        sys.path.remove(str(BENCH))
    every = conv_implicit.cases(False, False)
    part = conv_implicit.cases(False, False, "28x28x512-3x3,14x14x1024-1x1", "bf16")
    assert part and set(part) < set(every)
    assert {(dt, shape) for dt, shape, _, _ in part} == {("bf16", "28x28x512-3x3"), ("bf16", "14x14x1024-1x1")}
    assert [r for r in every if r[:2] in {("bf16", "28x28x512-3x3"), ("bf16", "14x14x1024-1x1")}] == \
        sorted(part, key=every.index)
    assert {r[1] for r in conv.cases(False, False, None, "fp32")} <= set(conv.SHAPES)
    assert {r[0] for r in conv.cases(False, False, None, "fp32")} == {"fp32"}
    with pytest.raises(ValueError, match="28x28x512"):
        conv_implicit.cases(False, False, "28x28x512", None)
