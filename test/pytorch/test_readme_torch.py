"""The README's PyTorch example runs as printed, and its results are right."""
import pathlib
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _example(name):
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)


def test_torch_example():
    scope = {}
    exec(compile(_example("torch"), "README:torch", "exec"), scope)
    layer, x, y, bsmm, w, out = (scope[k] for k in ("layer", "x", "y", "bsmm", "w", "out"))
    dense = layer.layout.dense(layer.weight.detach().double().cpu().numpy())
    bias = layer.bias.detach().double().cpu().numpy()
    ref = x.detach().double().cpu().numpy().reshape(-1, 4096) @ dense + bias
    got = y.detach().double().cpu().numpy().reshape(-1, 4096)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4
    assert x.grad is not None and layer.weight.grad.shape == bsmm.w_shape
    assert out.shape == (32, bsmm.K)
