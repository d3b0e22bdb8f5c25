"""Acceptance tests of ``blocksparse.torch.BlocksparseLinear`` as README documents it: every
``impl``, ``plan()``, bias, ``in/out_features``, inputs of any rank, dtypes, module mechanics
(``state_dict``, copies, pickling, ``torch.compile``, autocast) and bad input."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_setup import poison_empty  # noqa: E402,F401

from blocksparse.dispatch import Plan  # noqa: E402
from blocksparse.torch import BlocksparseLinear  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402
from torch_acceptance import DTYPES, block_grads, clone, close, dense_from_coords, dense_weight, draw, f64  # noqa: E402

IMPLS = ["auto", "portable", "dense", "reference"]


def _layer(rng, impl="auto", bias=True, cb=3, kb=2, bs=8, **kw):
    mask = random_layout(rng, cb, kb, 0.6, cover=True)
    return mask, BlocksparseLinear(mask, block_size=bs, bias=bias, impl=impl, **kw)


def _check(layer, mask, x, rng):
    """Forward and every gradient of ``layer(x)`` against float64 numpy (``x`` of any rank)."""
    dtype = x.dtype
    x.requires_grad_()
    y = layer(x)
    assert y.dtype == dtype and y.shape == (*x.shape[:-1], layer.out_features)
    dense = dense_weight(mask, f64(layer.weight), layer.layout.block_size)
    x2 = f64(x).reshape(-1, layer.in_features)
    ref = x2 @ dense + (f64(layer.bias) if layer.bias is not None else 0)
    close(y.reshape(-1, layer.out_features), ref, dtype)
    dy = draw(rng, tuple(y.shape), dtype)
    y.backward(dy)
    dy2 = f64(dy).reshape(-1, layer.out_features)
    close(x.grad.reshape(-1, layer.in_features), dy2 @ dense.T, dtype)
    close(layer.weight.grad, block_grads(np.argwhere(mask), x2, dy2, layer.layout.block_size), dtype)
    if layer.bias is not None:
        close(layer.bias.grad, dy2.sum(0), dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lead", [(5,), (1,), (0,), (2, 3), (2, 1, 3), (), (2, 0)],
                         ids=["N5", "N1", "N0", "3d", "4d", "1d", "3d-empty"])
def test_values_and_gradients(rng, impl, lead):
    mask, layer = _layer(rng, impl)
    assert (layer.in_features, layer.out_features) == (mask.shape[0] * 8, mask.shape[1] * 8)
    _check(layer, mask, draw(rng, (*lead, layer.in_features), torch.float32), rng)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_dtypes(rng, impl, dtype):
    mask, layer = _layer(rng, impl, dtype=dtype)
    assert layer.weight.dtype == dtype and layer.bias.dtype == dtype
    _check(layer, mask, draw(rng, (6, layer.in_features), dtype), rng)


@pytest.mark.parametrize("impl", IMPLS)
def test_without_bias_and_strided_input(rng, impl):
    mask, layer = _layer(rng, impl, bias=False, bs=16)
    assert layer.bias is None
    x = draw(rng, (layer.in_features, 4), torch.float32).t().detach()      # transposed view
    _check(layer, mask, x, rng)


@pytest.mark.parametrize("impl", IMPLS)
def test_gradient_of_weight_only_and_of_input_only(rng, impl):
    mask, layer = _layer(rng, impl)
    x = draw(rng, (4, layer.in_features), torch.float32)
    layer(x).sum().backward()                                            # x needs no gradient
    dense_ones = np.ones((4, layer.out_features))
    close(layer.weight.grad, block_grads(np.argwhere(mask), f64(x), dense_ones, 8), torch.float32)
    layer.requires_grad_(False)
    x.requires_grad_()
    layer(x).sum().backward()
    dense = dense_weight(mask, f64(layer.weight), 8)
    close(x.grad, dense_ones @ dense.T, torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_layer_applied_twice(rng, impl):
    """Weight sharing: ``layer(layer(x))`` on a square layout; the weight's gradient sums both uses."""
    mask = random_layout(rng, 2, 2, 0.75, cover=True)
    layer = BlocksparseLinear(mask, block_size=8, impl=impl, dtype=torch.float64)
    x = draw(rng, (3, 16), torch.float64, requires_grad=True)
    layer(layer(x)).square().sum().backward()
    w = f64(layer.weight)
    dense = torch.tensor(dense_weight(mask, w, 8), requires_grad=True)
    b = torch.tensor(f64(layer.bias), requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    ((xr @ dense + b) @ dense + b).square().sum().backward()
    close(x.grad, f64(xr.grad), torch.float64)
    close(layer.bias.grad, f64(b.grad), torch.float64)
    dw = np.stack([f64(dense.grad)[c * 8:(c + 1) * 8, k * 8:(k + 1) * 8] for c, k in np.argwhere(mask)])
    close(layer.weight.grad, dw, torch.float64)


def test_plan_documented_forms(rng):
    _, layer = _layer(rng)
    for plan in (layer.plan(), layer.plan(64), layer.plan(tokens=8, dtype=torch.bfloat16, device="cpu",
                                                            backward=False)):
        assert isinstance(plan, Plan)
        assert plan.impl in ("portable", "dense", "reference", "kernels")
        assert isinstance(plan.why, str) and plan.why
        assert all(isinstance(k, str) and v >= 0 for k, v in dict(plan.times_ms).items())
    layer.impl = "dense"
    assert layer.impl == "dense" and layer.plan().impl == "dense"


@pytest.mark.parametrize("impl", IMPLS)
def test_impl_chooses_what_runs(rng, impl):
    _, layer = _layer(rng, impl)
    if impl != "auto":
        assert layer.plan().impl == impl and layer.impl == impl
    other = BlocksparseLinear(np.ones((2, 2)), block_size=8)
    other.impl = impl
    assert other.impl == impl


@pytest.mark.parametrize("impl", IMPLS)
def test_state_dict_round_trip_into_fresh_layer(rng, impl):
    mask, layer = _layer(rng, impl)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    fresh = BlocksparseLinear(mask, block_size=8, impl=impl)
    assert set(fresh.state_dict()) == {"weight", "bias"}
    fresh.load_state_dict(torch.load(buf))
    x = draw(rng, (4, layer.in_features), torch.float32)
    torch.testing.assert_close(fresh(x), layer(x), rtol=0, atol=0)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_copies_are_independent_and_equal(rng, how):
    mask, layer = _layer(rng, "portable")
    x = draw(rng, (4, layer.in_features), torch.float32)
    layer(x)
    twin = clone(layer, how)
    torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)
    with torch.no_grad():
        twin.weight.mul_(2)
    assert not torch.equal(twin(x), layer(x))
    _check(twin, mask, x.clone(), rng)


@pytest.mark.parametrize("impl", IMPLS)
def test_torch_compile_fullgraph(rng, impl):
    mask, layer = _layer(rng, impl)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = draw(rng, (2, 3, layer.in_features), torch.float32)
    _check(compiled, mask, x, rng)


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_cpu_bfloat16(rng, impl):
    mask, layer = _layer(rng, impl)
    x = draw(rng, (5, layer.in_features), torch.float32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    wb, xb, bb = (f64(t.to(torch.bfloat16)) for t in (layer.weight, x, layer.bias))
    close(y, xb @ dense_weight(mask, wb, 8) + bb, torch.bfloat16)
    y.float().sum().backward()
    assert x.grad.dtype == layer.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("impl", IMPLS)
def test_vmap_is_correct_or_refused(rng, impl):
    _, layer = _layer(rng, impl)
    x = draw(rng, (3, 4, layer.in_features), torch.float32)
    try:
        y = torch.func.vmap(layer)(x)
    except RuntimeError as exc:
        assert "vmap" in str(exc)
        return
    close(y, f64(layer(x)), torch.float32)


@pytest.mark.interpreter
def test_triton_kernels_tiny(rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    mask, layer = _layer(rng, "kernels", cb=2, kb=2, bs=16)
    _check(layer, mask, draw(rng, (2, 3, layer.in_features), torch.float32), rng)


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("make, err, words", [
    (lambda n: torch.zeros(3, n + 1), ValueError, r"input must have shape \(\.\.\., 24\)"),
    (lambda n: torch.tensor(1.0), ValueError, "input must have shape"),
    (lambda n: np.zeros((3, n)), TypeError, "input must be a torch.Tensor"),
    (lambda n: torch.zeros(3, n, dtype=torch.int64), TypeError, "input must be floating point"),
    (lambda n: torch.zeros(3, n, dtype=torch.float64), TypeError, "same dtype"),
    (lambda n: torch.zeros(3, n, device="meta"), ValueError, "one device"),
], ids=["features", "scalar", "numpy", "int", "dtype-mismatch", "device-mismatch"])
def test_bad_inputs(rng, impl, make, err, words):
    mask = random_layout(rng, 3, 2, 0.6, cover=True)
    layer = BlocksparseLinear(mask, block_size=8, impl=impl)
    with pytest.raises(err, match=words):
        layer(make(24))


@pytest.mark.parametrize("kwargs, err, words", [
    ({"impl": "fast"}, ValueError, "impl must be one of"),
    ({"block_size": 0}, ValueError, "block_size"),
    ({"block_size": 3, "impl": "kernels"}, ValueError, "cannot run block size 3"),
    ({"layout": np.ones((2, 2, 2))}, ValueError, "layout"),
], ids=["impl", "block-size", "block-size-kernels", "3d-layout"])
def test_bad_constructor_args(kwargs, err, words):
    args = {"layout": np.ones((2, 2)), "block_size": 8, **kwargs}
    with pytest.raises(err, match=words):
        BlocksparseLinear(**args)


def test_bad_plan_and_impl_arguments(rng):
    _, layer = _layer(rng)
    for tokens in (0, -3):
        with pytest.raises(ValueError, match=f"tokens must be >= 1; got {tokens}"):
            layer.plan(tokens)
    for tokens in (2.5, True, "8"):
        with pytest.raises(TypeError, match="tokens must be an int or None"):
            layer.plan(tokens)
    assert layer.plan(np.int64(8)) == layer.plan(8)
    with pytest.raises(ValueError, match="impl must be one of"):
        layer.impl = "quick"
    with pytest.raises(TypeError, match="dtype"):
        layer.plan(8, dtype=torch.int32)


@pytest.mark.parametrize("impl", IMPLS)
def test_z_order_numbers_blocks_like_the_layout(rng, impl):
    """With ``z_order=True`` block ``b`` of ``weight`` sits at ``layout.coords[b]`` on every path."""
    mask = random_layout(rng, 4, 4, 0.5, cover=True)
    layer = BlocksparseLinear(mask, block_size=8, impl=impl, z_order=True, dtype=torch.float64)
    coords = np.asarray(layer.layout.coords)
    assert sorted(map(tuple, coords.tolist())) == sorted(map(tuple, np.argwhere(mask).tolist()))
    x = draw(rng, (3, 32), torch.float64, requires_grad=True)
    y = layer(x)
    dense = dense_from_coords(coords, f64(layer.weight), 8, 32, 32)
    close(y, f64(x) @ dense + f64(layer.bias), torch.float64)
    y.backward(torch.ones_like(y))
    close(layer.weight.grad, block_grads(coords, f64(x), np.ones((3, 32)), 8), torch.float64)


@pytest.mark.parametrize("impl", IMPLS)
def test_weight_written_in_place_is_used_next_call(rng, impl):
    """In-place writes to the parameter (optimizer steps, ``load_state_dict``, ``no_grad`` updates)
    reach the next call on every path."""
    mask, layer = _layer(rng, impl)
    x = draw(rng, (4, layer.in_features), torch.float32)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    for _ in range(2):
        layer(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            close(layer(x), f64(x) @ dense_weight(mask, f64(layer.weight), 8) + f64(layer.bias), torch.float32)
    with torch.no_grad():
        layer.weight.mul_(-1.5)
    layer.load_state_dict({k: v * 2 for k, v in layer.state_dict().items()})
    close(layer(x), f64(x) @ dense_weight(mask, f64(layer.weight), 8) + f64(layer.bias), torch.float32)


def test_weight_written_through_data_is_used_next_call(rng):
    mask, layer = _layer(rng, "dense")
    x = draw(rng, (4, layer.in_features), torch.float32)
    layer(x)
    layer.weight.data.mul_(2)
    close(layer(x), f64(x) @ dense_weight(mask, f64(layer.weight), 8) + f64(layer.bias), torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_leaves_float64_alone(rng, impl):
    """As ``nn.Linear``: a float64 layer on float64 input stays float64 under autocast."""
    mask, layer = _layer(rng, impl, dtype=torch.float64)
    x = draw(rng, (3, layer.in_features), torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _check(layer, mask, x, rng)
        with pytest.raises(TypeError, match="same dtype"):
            layer(x.float())


@pytest.mark.parametrize("impl", IMPLS)
def test_meta_device_init_then_to_empty(rng, impl):
    """Large-model initialisation: build on ``meta``, ``to_empty()``, ``reset_parameters()``."""
    mask = random_layout(rng, 3, 2, 0.6, cover=True)
    layer = BlocksparseLinear(mask, block_size=8, impl=impl, device="meta")
    assert layer.weight.is_meta
    layer.to_empty(device="cpu")
    layer.reset_parameters()
    _check(layer, mask, draw(rng, (5, layer.in_features), torch.float32), rng)
