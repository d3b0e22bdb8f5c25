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


def test_torch_norms_example():
    from blocksparse.testing import layer_norm as ln_ref
    from blocksparse.testing import lstm_gates as lstm_ref

    scope = {}
    exec(compile(_example("torch-norms"), "README:torch-norms", "exec"), scope)
    gates, gates_ln, c, c_next, h_next, y = (scope[k] for k in ("gates", "gates_ln", "c", "c_next", "h_next", "y"))
    f64 = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    ones, zeros = np.ones(gates.shape[1]), np.zeros(gates.shape[1])
    assert np.allclose(f64(gates_ln), ln_ref.layer_norm(f64(gates), ones, zeros, segments=4), atol=1e-4)
    for got, want in zip((c_next, h_next), lstm_ref.lstm_gates(f64(c), f64(gates_ln))):
        assert np.allclose(f64(got), want, atol=1e-5)
    assert np.allclose(f64(y), ln_ref.layer_norm(f64(gates).T, ones, zeros, axis=0, relu=True), atol=1e-4)
    assert gates.grad is not None and scope["g"].grad is not None and scope["b"].grad is not None
