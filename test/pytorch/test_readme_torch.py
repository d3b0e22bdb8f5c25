"""The README's PyTorch example runs as printed, and its results are right."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import norms as ref  # noqa: E402
from readme_examples import run_readme_example  # noqa: E402


def test_torch_example():
    scope = run_readme_example("torch")
    layer, x, y, bsmm, w, out = (scope[k] for k in ("layer", "x", "y", "bsmm", "w", "out"))
    dense = layer.layout.dense(layer.weight.detach().double().cpu().numpy())
    bias = layer.bias.detach().double().cpu().numpy()
    want = x.detach().double().cpu().numpy().reshape(-1, 4096) @ dense + bias
    got = y.detach().double().cpu().numpy().reshape(-1, 4096)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4
    assert x.grad is not None and layer.weight.grad.shape == bsmm.w_shape
    assert out.shape == (32, bsmm.K)


def test_torch_norms_example():
    scope = run_readme_example("torch-norms")
    gates, gates_ln, c, c_next, h_next, y = (scope[k] for k in ("gates", "gates_ln", "c", "c_next", "h_next", "y"))
    f64 = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    ones, zeros = np.ones(gates.shape[1]), np.zeros(gates.shape[1])
    assert np.allclose(f64(gates_ln), ref.layer_norm(f64(gates), ones, zeros, segments=4), atol=1e-4)
    for got, want in zip((c_next, h_next), ref.lstm_gates(f64(c), f64(gates_ln))):
        assert np.allclose(f64(got), want, atol=1e-5)
    assert np.allclose(f64(y), ref.layer_norm(f64(gates).T, ones, zeros, axis=0, relu=True), atol=1e-4)
    assert gates.grad is not None and scope["g"].grad is not None and scope["b"].grad is not None
