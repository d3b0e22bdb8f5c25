"""The layers' eager fast path on a CUDA GPU: ``BlocksparseLinear`` and ``PixelflyLinear`` (blocks
of 48 and 256: the weight refined inside the native op) as one C++ autograd node, against float64
and against the general path; autocast, inference, strided inputs, token counts that change, and
the calls that must not take it.  Skipped without a GPU."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402
from blocksparse.torch import BlocksparseLinear, PixelflyLinear, _native  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.fixture
def native(aot):
    if not _native.available():
        pytest.skip(f"the native op cannot be built here: {_native._state.get('why')}")


def _layer(kind, rng, dtype):
    if kind == "linear-bs32":
        return BlocksparseLinear(random_layout(rng, 8, 6, 0.4, cover=True), 32, device="cuda", dtype=dtype,
                                 impl="kernels")
    fin, fout, bs = {"pixelfly-bs48": (384, 768, 48), "pixelfly-bs256": (1024, 2048, 256)}[kind]
    return PixelflyLinear(fin, fout, bs, 8, device="cuda", dtype=dtype, impl="kernels")


def _reference(layer, x, dy):
    """float64 ``y``, ``dx``, ``dW`` (dense, inside the blocks) and ``db``."""
    dense = torch.from_numpy(layer.layout.dense(layer.weight.detach().double().cpu().numpy())).cuda()
    mask = torch.from_numpy(layer.layout.dense(np.ones(layer.layout.w_shape))).cuda()
    xd, dyd = x.detach().double().reshape(-1, layer.in_features), dy.double().reshape(-1, layer.out_features)
    return xd @ dense + layer.bias.detach().double(), dyd @ dense.T, (xd.T @ dyd) * mask, dyd.sum(0)


def _grads(layer, x, y, dy):
    """``dx``, dense ``dW`` and ``db`` of ``y`` for the output gradient ``dy`` (None: ``y`` a scalar)."""
    dx, dw, db = torch.autograd.grad(y, (x, layer.weight, layer.bias), dy)
    dense_dw = torch.from_numpy(layer.layout.dense(dw.double().cpu().numpy())).cuda()
    return dx.reshape(-1, layer.in_features), dense_dw, db


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", ["linear-bs32", "pixelfly-bs48", "pixelfly-bs256"])
def test_one_cpp_node_against_float64_and_the_general_path(native, rng, monkeypatch, kind, dtype):
    dt = DTYPES[dtype]
    layer = _layer(kind, rng, dt)
    tol = tolerance(dtype)
    for n in (300, 64, 300):  # token counts that change, and come back
        x = torch.randn(3, n // 3, layer.in_features, device="cuda", dtype=dt, requires_grad=True)
        y = layer(x)
        assert y.shape == (3, n // 3, layer.out_features) and y.dtype == dt
        assert type(y.grad_fn.next_functions[0][0]).__name__ == "CppFunction"  # under the reshape
        dy = torch.randn_like(y)
        got = (y.reshape(-1, layer.out_features), *_grads(layer, x, y, dy))
        for name, g, ref in zip(("y", "dx", "dw", "db"), got, _reference(layer, x, dy)):
            assert rel_error(g, ref) < tol, f"{name} at {n} tokens"
    monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", "off")  # the general path, the same launches
    y_py = layer(x)
    assert "CppFunction" not in type(y_py.grad_fn.next_functions[0][0]).__name__
    general = (y_py.reshape(-1, layer.out_features), *_grads(layer, x, y_py, dy))
    # to rounding: split products add by atomics, and where they accumulate in float32 the native
    # op adds the bias before rounding to the output dtype, the general path after (y: one rounding)
    eps = torch.finfo(dt).eps
    for name, g, py in zip(("y", "dx", "dw", "db"), got, general):
        assert rel_error(g, py) < tol / 10 + (eps / 2 if name == "y" else 0), name


@pytest.mark.parametrize("kind", ["linear-bs32", "pixelfly-bs256"])
def test_autocast_inference_and_strided_inputs(native, rng, kind):
    layer = _layer(kind, rng, torch.float32)
    base = torch.randn(200, layer.in_features + 8, device="cuda")
    x = base[:, 3:3 + layer.in_features]  # strided rows, not on a 16-byte boundary
    dy = torch.randn(200, layer.out_features, device="cuda")
    y_ref, dx_ref, dw_ref, db_ref = _reference(layer, x, dy)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        xg = x.detach().requires_grad_()
        y = layer(xg)
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "CppFunction"
    dx, dw, db = _grads(layer, xg, y, dy.bfloat16())
    assert layer.weight.dtype == torch.float32 and db.dtype == torch.float32
    for name, g, ref in zip(("y", "dx", "dw", "db"), (y, dx, dw, db), (y_ref, dx_ref, dw_ref, db_ref)):
        assert rel_error(g, ref) < tolerance("bfloat16"), name
    with torch.no_grad():
        y = layer(x)
    assert y.grad_fn is None and rel_error(y, y_ref) < tolerance("float32")


def test_calls_the_fast_path_does_not_take(native, rng):
    layer = _layer("linear-bs32", rng, torch.float32)
    x = torch.randn(64, layer.in_features, device="cuda", requires_grad=True)
    layer.impl = "dense"
    assert type(layer(x).grad_fn).__name__ != "CppFunction"
    layer.impl = "kernels"
    assert type(layer(x).grad_fn).__name__ == "CppFunction"
    with pytest.raises(TypeError, match="same dtype"):  # float64: not the kernels' (nor the weight's)
        layer(x.double())
    with pytest.raises(ValueError, match="must have shape"):
        layer.weight = torch.nn.Parameter(torch.randn(3, 32, 32, device="cuda"))
        layer(x)


@pytest.mark.parametrize("native_path", ["on", "off"])
def test_the_gradient_of_a_sum_against_float64(native, rng, monkeypatch, native_path):
    """``layer(x).sum() * s``: a broadcast gradient, made dense as 8-byte words (over 2^20 elements)
    and its bias gradient one multiply, in the native op and the general path alike."""
    monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", native_path)
    layer = _layer("pixelfly-bs256", rng, torch.bfloat16)
    x = torch.randn(2, 600, layer.in_features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    scale = float(rng.uniform(0.5, 2.0))
    dy = torch.full(y.shape, scale, device="cuda", dtype=torch.bfloat16)
    got = _grads(layer, x, y.sum() * scale, None)
    for name, g, ref in zip(("dx", "dw", "db"), got, _reference(layer, x, dy)[1:]):
        assert rel_error(g, ref) < tolerance("bfloat16"), name
