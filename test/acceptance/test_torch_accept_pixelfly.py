"""Acceptance tests of ``blocksparse.torch.PixelflyLinear`` and the layout builders of
``blocksparse.layouts.butterfly`` as README documents them."""
import copy
import io
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_setup import poison_empty  # noqa: E402,F401

from blocksparse.dispatch import Plan  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout, flat_butterfly, random_row_layout  # noqa: E402
from blocksparse.torch import PixelflyLinear  # noqa: E402
from torch_acceptance import DTYPES, block_grads, close, dense_weight, draw, f64  # noqa: E402


# ---------------------------------------------------------------------------------------- layouts
def _butterfly_formula(n, n_factors):
    """i XOR j in {0, 1, 2, 4, ..., 2**(n_factors - 1)}."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return np.isin(i ^ j, [0] + [2 ** f for f in range(n_factors)])


@pytest.mark.parametrize("n, factors", [(2, None), (8, None), (8, 1), (16, 3), (64, 6)])
def test_flat_butterfly_formula(n, factors):
    got = flat_butterfly(n, factors) if factors is not None else flat_butterfly(n)
    assert got.shape == (n, n) and got.dtype == bool
    np.testing.assert_array_equal(got, _butterfly_formula(n, factors or int(np.log2(n))))


@pytest.mark.parametrize("stretch", [False, True], ids=["repeat", "stretch"])
def test_butterfly_layout_rectangles(stretch):
    base = _butterfly_formula(4, 2)
    wide = butterfly_layout(4 * 5, 8 * 5, 5, 4, stretch=stretch)           # (4, 8) blocks of 5
    tall = butterfly_layout(8 * 3, 4 * 3, block_size=3, butterfly_size=4, n_factors=2, stretch=stretch)
    assert wide.shape == (4, 8) and tall.shape == (8, 4) and wide.dtype == bool
    if stretch:
        np.testing.assert_array_equal(wide, np.repeat(base, 2, axis=1))
        np.testing.assert_array_equal(tall, np.repeat(base, 2, axis=0))
    else:
        np.testing.assert_array_equal(wide, np.tile(base, (1, 2)))
        np.testing.assert_array_equal(tall, np.tile(base, (2, 1)))
    np.testing.assert_array_equal(butterfly_layout(4 * 7, 4 * 7, 7), _butterfly_formula(4, 2))   # defaults


def test_butterfly_layout_readme_example():
    """README: 384 -> 1536 at block 48, butterfly 64 is half dense, 16 blocks per input row, 4 per output column."""
    lay = butterfly_layout(384, 1536, 48, 64)
    assert lay.shape == (8, 32) and lay.mean() == 0.5
    assert set(lay.sum(1).tolist()) == {16} and set(lay.sum(0).tolist()) == {4}


def test_random_row_layout(rng):
    seed = int(rng.integers(1 << 30))
    lay = random_row_layout(6, 9, 4, rng=np.random.default_rng(seed))
    assert lay.shape == (6, 9) and lay.dtype == bool and set(lay.sum(1).tolist()) == {4}
    np.testing.assert_array_equal(lay, random_row_layout(6, 9, 4, rng=seed))       # an int seeds the same way
    np.testing.assert_array_equal(random_row_layout(3, 3, 3), np.ones((3, 3), bool))


@pytest.mark.parametrize("call, err, words", [
    (lambda: flat_butterfly(6), ValueError, "butterfly_size must be a power of two"),
    (lambda: flat_butterfly(8, 4), ValueError, "n_factors must be in 1..log2"),
    (lambda: flat_butterfly(8.0), TypeError, "butterfly_size"),
    (lambda: butterfly_layout(20, 40, 6), ValueError, "in_features must be a multiple of block_size=6"),
    (lambda: butterfly_layout(24, 40, 6), ValueError, "out_features must be a multiple"),
    (lambda: butterfly_layout(24, 24, 0), ValueError, "block_size"),
    (lambda: random_row_layout(3, 4, 5), ValueError, "blocks_per_row must be <= out_blocks=4"),
    (lambda: random_row_layout(3, 4, 0), ValueError, "blocks_per_row"),
    (lambda: random_row_layout(3, "4", 1), TypeError, "out_blocks"),
], ids=["not-pow2", "too-many-factors", "float-size", "in-multiple", "out-multiple", "block-0", "row-too-full",
        "row-empty", "str-blocks"])
def test_layout_builders_refuse_bad_arguments(call, err, words):
    with pytest.raises(err, match=words):
        call()


# ---------------------------------------------------------------------------------------- the layer
def _reference(layer, x):
    """float64 ``x @ W + (x @ first.T) @ second.T + bias`` from the layer's own parameters."""
    bs = layer.block_size
    mask = butterfly_layout(layer.in_features, layer.out_features, bs, layer.butterfly_size, layer.n_factors,
                            stretch=layer.stretch)
    dense = dense_weight(mask, f64(layer.weight), bs)
    if layer.lowrank_first is not None:
        dense = dense + f64(layer.lowrank_first).T @ f64(layer.lowrank_second).T
    bias = f64(layer.bias) if layer.bias is not None else 0
    return mask, dense, f64(x).reshape(-1, layer.in_features) @ dense + bias


def _check(layer, x, rng):
    dtype = x.dtype
    x.requires_grad_()
    y = layer(x)
    assert y.dtype == dtype and y.shape == (*x.shape[:-1], layer.out_features)
    mask, dense, ref = _reference(layer, x)
    close(y.reshape(-1, layer.out_features), ref, dtype)
    dy = draw(rng, tuple(y.shape), dtype)
    y.backward(dy)
    dy2, x2 = f64(dy).reshape(-1, layer.out_features), f64(x).reshape(-1, layer.in_features)
    close(x.grad.reshape(x2.shape), dy2 @ dense.T, dtype)
    close(layer.weight.grad, block_grads(np.argwhere(mask), x2, dy2, layer.block_size), dtype)
    if layer.bias is not None:
        close(layer.bias.grad, dy2.sum(0), dtype)
    if layer.lowrank_first is not None:
        first, second = f64(layer.lowrank_first), f64(layer.lowrank_second)
        close(layer.lowrank_second.grad, dy2.T @ (x2 @ first.T), dtype)        # [out, N] @ [N, r]
        close(layer.lowrank_first.grad, (dy2 @ second).T @ x2, dtype)          # [r, N] @ [N, in]


CASES = {  # id: (in, out, block_size, butterfly_size, n_factors, lowrank, impls)
    "bs3-lowrank": (12, 24, 3, None, None, 2, ["auto", "portable", "dense"]),
    "bs16": (32, 64, 16, 2, 1, 0, ["auto", "portable", "dense", "reference"]),
    "bs48-tall": (192, 96, 48, 4, 2, 3, ["auto", "portable", "dense", "reference"]),
    "bs256": (512, 1024, 256, None, None, 4, ["auto", "portable", "dense", "reference"]),
}
PARAMS = [(name, impl) for name, case in CASES.items() for impl in case[-1]]


def _make(name, impl="auto", **kw):
    fin, fout, bs, n, f, r, _ = CASES[name]
    return PixelflyLinear(fin, fout, bs, n, f, r, impl=impl, **kw)


@pytest.mark.parametrize("name, impl", PARAMS, ids=[f"{n}-{i}" for n, i in PARAMS])
@pytest.mark.parametrize("lead", [(4,), (1,), (0,), (2, 3), ()], ids=["N4", "N1", "N0", "3d", "1d"])
def test_values_and_gradients(rng, name, impl, lead):
    layer = _make(name, impl)
    _check(layer, draw(rng, (*lead, layer.in_features), torch.float32), rng)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_dtypes(rng, dtype, impl):
    layer = _make("bs3-lowrank", impl, dtype=dtype)
    assert all(p.dtype == dtype for p in layer.parameters())
    _check(layer, draw(rng, (5, layer.in_features), dtype), rng)


def test_keyword_constructor_and_attributes():
    layer = PixelflyLinear(in_features=96, out_features=48, block_size=16, butterfly_size=4, n_factors=1,
                           lowrank_size=2, bias=False, device="cpu", dtype=torch.float64, stretch=True,
                           allow_tf32=False, impl="portable", cost_model=None)
    assert (layer.in_features, layer.out_features, layer.block_size) == (96, 48, 16)
    assert layer.bias is None and layer.impl == "portable"
    assert layer.weight.shape == (layer.layout.blocks, 16, 16)
    assert layer.lowrank_first.shape == (2, 96) and layer.lowrank_second.shape == (48, 2)
    np.testing.assert_array_equal(np.asarray(layer.layout.mask, bool), butterfly_layout(96, 48, 16, 4, 1, stretch=True))
    assert PixelflyLinear(np.int64(24), 24, 3).in_features == 24                  # numpy ints are ints


@pytest.mark.parametrize("name", list(CASES))
def test_dense_weight(rng, name):
    layer = _make(name)
    got = layer.dense_weight()
    assert got.shape == (layer.in_features, layer.out_features) and got.dtype == layer.weight.dtype
    close(got, _reference(layer, torch.zeros(1, layer.in_features))[1], torch.float32)
    got.square().sum().backward()                                            # differentiable
    assert layer.weight.grad is not None


def test_plan_and_impl_override(rng):
    layer = _make("bs16")
    x = draw(rng, (7, layer.in_features), torch.float32)
    layer(x)
    for plan in (layer.plan(), layer.plan(tokens=128, dtype=torch.float16, device="cpu", backward=False)):
        assert isinstance(plan, Plan) and plan.impl in ("portable", "dense", "reference", "kernels") and plan.why
    layer.impl = "dense"
    assert layer.plan().impl == "dense"
    with pytest.raises(ValueError, match="impl must be one of"):
        layer.impl = "sparse"
    with pytest.raises(ValueError, match="impl='reference' cannot run block size 3"):
        _make("bs3-lowrank", "reference")


@pytest.mark.parametrize("how", ["state_dict", "deepcopy", "pickle"])
def test_state_dict_and_copies(rng, how):
    layer = _make("bs3-lowrank", "portable")
    x = draw(rng, (4, layer.in_features), torch.float32)
    if how == "state_dict":
        buf = io.BytesIO()
        torch.save(layer.state_dict(), buf)
        buf.seek(0)
        twin = _make("bs3-lowrank", "portable")
        assert set(twin.state_dict()) == {"weight", "bias", "lowrank_first", "lowrank_second"}
        twin.load_state_dict(torch.load(buf))
    else:
        twin = copy.deepcopy(layer) if how == "deepcopy" else pickle.loads(pickle.dumps(layer))
    torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_torch_compile_fullgraph(rng, impl):
    layer = _make("bs3-lowrank", impl)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    _check(compiled, draw(rng, (2, 3, layer.in_features), torch.float32), rng)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_autocast_cpu_bfloat16(rng, impl):
    layer = _make("bs3-lowrank", impl)
    x = draw(rng, (5, layer.in_features), torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    close(y, _reference(layer, x)[2], torch.bfloat16)


@pytest.mark.parametrize("impl", ["portable", "dense"])
def test_layer_applied_twice(rng, impl):
    layer2 = PixelflyLinear(24, 24, 3, lowrank_size=2, impl=impl, dtype=torch.float64)
    x = draw(rng, (3, 24), torch.float64, requires_grad=True)
    layer2(layer2(x)).sum().backward()
    dense = torch.tensor(layer2.dense_weight().detach().numpy(), requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    b = layer2.bias.detach()
    ((xr @ dense + b) @ dense + b).sum().backward()
    close(x.grad, f64(xr.grad), torch.float64)
    dense_grad = f64(dense.grad)
    close(layer2.lowrank_second.grad, (f64(layer2.lowrank_first) @ dense_grad).T, torch.float64)


@pytest.mark.parametrize("make, err, words", [
    (lambda n: torch.zeros(3, n + 3), ValueError, r"input must have shape \(\.\.\., 12\)"),
    (lambda n: [0.0] * n, TypeError, "input must be a torch.Tensor"),
    (lambda n: torch.zeros(3, n, dtype=torch.int32), TypeError, "input must be floating point"),
    (lambda n: torch.zeros(3, n, dtype=torch.float16), TypeError, "same dtype"),
    (lambda n: torch.zeros(3, n, device="meta"), ValueError, "one device"),
], ids=["features", "list", "int", "dtype-mismatch", "device-mismatch"])
@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_bad_inputs(make, err, words, impl):
    layer = _make("bs3-lowrank", impl)
    with pytest.raises(err, match=words):
        layer(make(12))


@pytest.mark.parametrize("args, kwargs, err, words", [
    ((12.0, 24, 3), {}, TypeError, "in_features"),
    ((12, 0, 3), {}, ValueError, "out_features"),
    ((12, 24, 3), {"lowrank_size": -1}, ValueError, "lowrank_size"),
    ((12, 24, 3), {"butterfly_size": 3}, ValueError, "butterfly_size must be a power of two"),
    ((12, 24, 3), {"butterfly_size": 4, "n_factors": 3}, ValueError, "n_factors"),
    ((13, 24, 3), {}, ValueError, "in_features must be a multiple of block_size=3"),
    ((12, 24, 3), {"impl": "fast"}, ValueError, "impl must be one of"),
], ids=["float-in", "zero-out", "negative-rank", "butterfly-3", "factors", "in-multiple", "impl"])
def test_bad_constructor_args(args, kwargs, err, words):
    with pytest.raises(err, match=words):
        PixelflyLinear(*args, **kwargs)


@pytest.mark.interpreter
def test_triton_kernels_tiny(rng, monkeypatch):
    """Block size 48 runs on the refined block-16 layout through the kernels."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    layer = PixelflyLinear(96, 96, 48, lowrank_size=2, impl="kernels")
    assert layer._dispatch.refinement is not None
    _check(layer, draw(rng, (3, 96), torch.float32), rng)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_autocast_leaves_float64_alone(rng, impl):
    layer = _make("bs3-lowrank", impl, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _check(layer, draw(rng, (3, layer.in_features), torch.float64), rng)


@pytest.mark.parametrize("name, impl", PARAMS, ids=[f"{n}-{i}" for n, i in PARAMS])
def test_meta_device_init_then_to_empty(rng, name, impl):
    layer = _make(name, impl, device="meta")
    layer.to_empty(device="cpu")
    layer.reset_parameters()
    _check(layer, draw(rng, (3, layer.in_features), torch.float32), rng)
