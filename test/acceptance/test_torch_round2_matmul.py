"""Second acceptance audit of ``blocksparse.torch.BlocksparseMatMul`` / ``BlocksparseLinear``: layouts
with an empty row and column, fully dense and one-block layouts (every impl, both feature axes, the
kernels through Triton's interpreter), ``no_grad`` / ``inference_mode``, double backward, ``.to(dtype)``,
the documented positional constructor, ``torch.compile(dynamic=True)``, the meta device and a
``cost_model`` given by the caller."""
import gc
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_setup import poison_empty  # noqa: E402,F401

from blocksparse.dispatch import CostModel, Plan, Table  # noqa: E402
from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul, PixelflyLinear  # noqa: E402
from torch_acceptance import DTYPES, block_grads, clone, close, dense_weight, draw, f64  # noqa: E402

IMPLS = ["auto", "portable", "dense", "reference"]
LAYOUTS = {  # layouts the first audit's random ``cover=True`` layouts never produce
    "empty-row-and-col": [[1, 0, 1], [0, 0, 0], [1, 0, 0]],
    "dense": [[1, 1, 1], [1, 1, 1]],
    "one-block": [[0, 0], [0, 1], [0, 0]],
    "1x1": [[1]],
}


def _expect(mask, w, x, dy, bs, bias=None):
    """float64 ``y``, ``dx``, ``dW`` (and ``dbias``) of ``y = x @ W + bias`` for ``x`` ``(N, C)``."""
    dense = dense_weight(mask, w, bs)
    y = x @ dense + (0 if bias is None else bias)
    return y, dy @ dense.T, block_grads(np.argwhere(mask), x, dy, bs), dy.sum(0)


def _check_linear(layer, mask, x, rng):
    x.requires_grad_()
    y = layer(x)
    dy = draw(rng, tuple(y.shape), x.dtype)
    y.backward(dy)
    bias = f64(layer.bias) if layer.bias is not None else None
    ref_y, ref_dx, ref_dw, ref_db = _expect(mask, f64(layer.weight), f64(x), f64(dy), layer.layout.block_size, bias)
    close(y, ref_y, x.dtype)
    close(x.grad, ref_dx, x.dtype)
    close(layer.weight.grad, ref_dw, x.dtype)
    if bias is not None:
        close(layer.bias.grad, ref_db, x.dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_linear_special_layouts(rng, name, impl):
    mask = np.array(LAYOUTS[name])
    layer = BlocksparseLinear(mask, block_size=8, impl=impl)
    _check_linear(layer, mask, draw(rng, (5, layer.in_features), torch.float32), rng)


def _check_bsmm(bsmm, mask, rng, dtype=torch.float32, n=3, call=None):
    """``(call or bsmm)(x, w)`` and both gradients against float64 (``call``: e.g. a compiled ``bsmm``)."""
    w = draw(rng, bsmm.w_shape, dtype, requires_grad=True)
    x = draw(rng, bsmm.i_shape(n), dtype, requires_grad=True)
    y = (call or bsmm)(x, w)
    assert y.shape == bsmm.o_shape(n) and y.dtype == dtype
    dy = draw(rng, tuple(y.shape), dtype)
    y.backward(dy)
    t = (lambda a: a.T) if bsmm.axis == 0 else (lambda a: a)   # feature_axis=0: (C, N) activations
    ref_y, ref_dx, ref_dw, _ = _expect(mask, f64(w), t(f64(x)), t(f64(dy)), bsmm.block_size)
    close(t(f64(y)), ref_y, dtype)
    close(t(f64(x.grad)), ref_dx, dtype)
    close(w.grad, ref_dw, dtype)


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_matmul_special_layouts_reference(rng, name, axis):
    mask = np.array(LAYOUTS[name])
    _check_bsmm(BlocksparseMatMul(mask, block_size=8, feature_axis=axis), mask, rng)


@pytest.mark.interpreter
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("name", ["empty-row-and-col", "one-block"])
def test_matmul_special_layouts_triton_kernels(rng, monkeypatch, name, axis):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    mask = np.array(LAYOUTS[name])
    _check_bsmm(BlocksparseMatMul(mask, block_size=16, feature_axis=axis), mask, rng)


# ------------------------------------------------------------------ gradient modes
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("impl", IMPLS)
def test_linear_without_gradient(rng, impl, mode):
    mask = np.array(LAYOUTS["empty-row-and-col"])
    layer = BlocksparseLinear(mask, block_size=8, impl=impl)
    x = draw(rng, (4, layer.in_features), torch.float32, requires_grad=True)
    with getattr(torch, mode)():
        y = layer(x)
    assert not y.requires_grad
    ref = f64(x) @ dense_weight(mask, f64(layer.weight), 8) + f64(layer.bias)
    close(y, ref, torch.float32)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_matmul_without_gradient(rng, mode):
    mask = np.array(LAYOUTS["empty-row-and-col"])
    bsmm = BlocksparseMatMul(mask, block_size=8)
    w = draw(rng, bsmm.w_shape, torch.float32, requires_grad=True)
    x = draw(rng, (4, bsmm.C), torch.float32, requires_grad=True)
    with getattr(torch, mode)():
        y = bsmm(x, w)
    assert not y.requires_grad
    close(y, f64(x) @ dense_weight(mask, f64(w), 8), torch.float32)


def _double_backward(layer, x):
    """``d/dW sum(d/dx sum(y**2))`` -- a Hessian-vector product (as in a gradient penalty)."""
    y = layer(x)
    gx, = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    gx.sum().backward()
    return layer.weight.grad


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_double_backward_is_right_or_refused(rng, impl):
    """Where the second derivative is supported it is exact; elsewhere a clear error, never a wrong value."""
    mask = np.array(LAYOUTS["empty-row-and-col"])
    layer = BlocksparseLinear(mask, block_size=8, impl=impl, dtype=torch.float64)
    x = draw(rng, (4, layer.in_features), torch.float64, requires_grad=True)
    try:
        got = _double_backward(layer, x)
    except RuntimeError as err:   # NotImplementedError is one; torch names what cannot be differentiated twice
        assert impl in ("portable", "reference") and ("differentiat" in str(err) or "derivative" in str(err))
        return
    # sum(gx) = 2 sum(y W^T) = 2 sum_nk y[n, k] s[k], s = column sums of W, so
    # d/dW = 2 x^T (1 s) + 2 1^T y (both terms dense (C, K); the blocks of the layout are the gradient)
    dense = dense_weight(mask, f64(layer.weight), 8)
    xn, bias = f64(x), f64(layer.bias)
    ones = np.ones_like(xn)
    ref_dense = 2 * (xn.T @ (ones @ dense)) + 2 * (ones.T @ (xn @ dense + bias))
    close(got, np.stack([ref_dense[c * 8:(c + 1) * 8, k * 8:(k + 1) * 8] for c, k in np.argwhere(mask)]),
          torch.float64)


# ------------------------------------------------------------------ module mechanics
@pytest.mark.parametrize("to", ["float64", "half", "bfloat16"])
@pytest.mark.parametrize("impl", IMPLS)
def test_linear_moved_with_to_dtype(rng, impl, to):
    mask = np.array(LAYOUTS["empty-row-and-col"])
    layer = BlocksparseLinear(mask, block_size=8, impl=impl)
    dtype = {"float64": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}[to]
    layer = layer.half() if to == "half" else layer.to(dtype)
    assert layer.weight.dtype == dtype and layer.bias.dtype == dtype
    _check_linear(layer, mask, draw(rng, (3, layer.in_features), dtype), rng)


def test_linear_documented_positional_constructor(rng):
    """``BlocksparseLinear(layout, block_size=32, bias=True, device=None, dtype=None)`` positionally."""
    mask = np.array(LAYOUTS["dense"])
    layer = BlocksparseLinear(mask, 8, False, "cpu", torch.float64)
    assert layer.bias is None and layer.weight.dtype == torch.float64 and layer.weight.shape == (6, 8, 8)
    assert (layer.in_features, layer.out_features) == (16, 24) and layer.impl == "auto"
    _check_linear(layer, mask, draw(rng, (2, 16), torch.float64), rng)
    default = BlocksparseLinear(np.ones((1, 1)))
    assert default.layout.block_size == 32 and default.bias is not None and default.weight.dtype == torch.float32


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_compiled_with_dynamic_shapes(rng, impl):
    """Compiled with dynamic shapes, every batch size (an empty one included) gives the eager answers."""
    mask = np.array(LAYOUTS["empty-row-and-col"])
    layer = BlocksparseLinear(mask, block_size=8, impl=impl)
    torch._dynamo.reset()   # every layer's forward is one code object: earlier tests' graphs count to its limit
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=True)
    for lead in [(3,), (7,), (0,)]:
        x = draw(rng, (*lead, layer.in_features), torch.float32, requires_grad=True)
        y = compiled(x)
        ref = f64(x).reshape(-1, 24) @ dense_weight(mask, f64(layer.weight), 8) + f64(layer.bias)
        assert y.shape == (*lead, 24)
        close(y.reshape(-1, 24), ref, torch.float32)
        y.sum().backward()
        close(x.grad.reshape(-1, 24), np.ones((ref.shape[0], 24)) @ dense_weight(mask, f64(layer.weight), 8).T,
              torch.float32)


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_matmul_compiled_gradients_match_eager(rng, axis):
    mask = np.array(LAYOUTS["empty-row-and-col"])
    bsmm = BlocksparseMatMul(mask, block_size=8, feature_axis=axis)
    compiled = torch.compile(lambda x, w: bsmm(x, w), fullgraph=True, backend="aot_eager")
    _check_bsmm(bsmm, mask, rng, n=5, call=compiled)


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_on_the_meta_device(impl):
    """Like ``nn.Linear``, a layer on ``meta`` maps meta inputs to meta outputs of the right shape."""
    layer = BlocksparseLinear(np.array(LAYOUTS["empty-row-and-col"]), block_size=8, impl=impl, device="meta")
    y = layer(torch.empty(2, 5, 24, device="meta", requires_grad=True))
    assert y.is_meta and y.shape == (2, 5, 24)


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_matmul_on_the_meta_device(monkeypatch, backend):
    """Shapes only, also where the kernels are forced (they never see a meta tensor)."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    bsmm = BlocksparseMatMul(np.array(LAYOUTS["empty-row-and-col"]), block_size=16)
    w = torch.empty(bsmm.w_shape, device="meta", requires_grad=True)
    y = bsmm(torch.empty(4, 48, device="meta"), w)
    assert y.is_meta and y.shape == (4, 48)
    y.sum().backward()
    assert w.grad.is_meta and w.grad.shape == bsmm.w_shape


# ------------------------------------------------------------------ a cost model the caller gives
def _table_file(tmp_path, mask, tokens, fwdbwd, fwd):
    """A one-problem table (both ``structured`` values, so the row matches exactly) in the README's format."""
    lay = np.asarray(mask)
    rows = [{"tokens": tokens, "in_features": lay.shape[0] * 8, "out_features": lay.shape[1] * 8, "block_size": 8,
             "density": float(lay.mean()), "dtype": "float32", "layout": "random", "structured": s,
             "fwd_ms": fwd, "fwdbwd_ms": fwdbwd} for s in (False, True)]
    path = tmp_path / "my-table.json"
    path.write_text(json.dumps({"format": 1, "framework": "torch", "device": "cpu", "rows": rows}))
    return path


@pytest.mark.parametrize("fwdbwd, fwd, train, infer", [
    ({"dense": 3.0, "portable": 1.0, "reference": 2.0}, {"dense": 1.0, "portable": 2.0, "reference": 3.0},
     "portable", "dense"),
    ({"dense": 1.04, "portable": 1.0, "reference": 2.0}, {"dense": 5.0, "portable": 4.0, "reference": 1.0},
     "dense", "reference"),
], ids=["portable-then-dense", "dense-within-5pct-then-reference"])
def test_linear_plans_from_a_given_table(rng, tmp_path, fwdbwd, fwd, train, infer):
    """``cost_model=CostModel(Table.load(path))``: the plan is the table's measurement and the margin rule's choice."""
    mask = np.array(LAYOUTS["empty-row-and-col"])
    path = _table_file(tmp_path, mask, 6, fwdbwd, fwd)
    layer = BlocksparseLinear(mask, block_size=8, cost_model=CostModel(Table.load(path)))
    plan = layer.plan(tokens=6)
    assert isinstance(plan, Plan) and plan.impl == train and plan.source == "my-table.json"
    assert dict(plan.times_ms) == pytest.approx(fwdbwd)
    assert layer.plan(tokens=6, backward=False).impl == infer
    x = draw(rng, (2, 3, layer.in_features), torch.float32)
    _check_linear(layer, mask, x.reshape(6, -1), rng)
    assert layer.plan().impl == train                        # the last call's 6 tokens are the default
    layer.impl = "reference"
    assert layer.plan(tokens=6).impl == "reference" and layer.plan(tokens=6).source == "override"


@pytest.mark.parametrize("bad", ["table.json", 3], ids=["path", "int"])
def test_linear_refuses_a_cost_model_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match="cost_model"):
        BlocksparseLinear(np.ones((2, 2)), block_size=8, cost_model=bad)


@pytest.mark.parametrize("make, err, words", [
    (lambda: CostModel("torch-cpu.json"), TypeError, "table must be a blocksparse.dispatch.Table"),
    (lambda: CostModel(None, margin="5%"), TypeError, "margin must be a number"),
    (lambda: CostModel(None, margin=1.5), ValueError, "margin must be in"),
], ids=["table-path", "margin-str", "margin-1.5"])
def test_cost_model_refuses_bad_arguments(make, err, words):
    with pytest.raises(err, match=words):
        make()


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_linear_one_block_every_dtype(rng, dtype):
    mask = np.array(LAYOUTS["one-block"])
    layer = BlocksparseLinear(mask, block_size=8, dtype=dtype)
    _check_linear(layer, mask, draw(rng, (1, layer.in_features), dtype), rng)


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
@pytest.mark.parametrize("make", [lambda: BlocksparseLinear(np.array(LAYOUTS["empty-row-and-col"]), block_size=8),
                                  lambda: PixelflyLinear(12, 24, 3, lowrank_size=2)], ids=["linear", "pixelfly"])
def test_copy_compiles_after_the_original_is_gone(rng, make, how):
    layer = make()
    layer(draw(rng, (3, layer.in_features), torch.float32))
    twin = clone(layer, how)
    del layer
    gc.collect()
    torch._dynamo.reset()
    x = draw(rng, (4, twin.in_features), torch.float32)
    torch.testing.assert_close(torch.compile(twin, fullgraph=True, backend="aot_eager")(x), twin(x))


@pytest.mark.parametrize("blocks", [2, 4], ids=["fewer-blocks", "more-blocks"])
@pytest.mark.parametrize("impl", ["portable", "dense"])
def test_linear_refuses_a_replaced_weight_of_the_wrong_shape(rng, impl, blocks):
    layer = BlocksparseLinear(np.array([[1, 0], [1, 1]]), block_size=8, impl=impl)
    layer.weight = torch.nn.Parameter(draw(rng, (blocks, 8, 8), torch.float32))
    with pytest.raises(ValueError, match=r"weight must have shape \(3, 8, 8\)"):
        layer(draw(rng, (3, 16), torch.float32))


# ------------------------------------------------------------------ the launch path (kernels, Triton's interpreter)
@pytest.mark.interpreter
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_kernels_compiled_fullgraph(rng, monkeypatch, axis):
    """Under ``torch.compile`` the kernels run as custom ops with fake functions: same values, both gradients."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    mask = np.array(LAYOUTS["empty-row-and-col"])
    bsmm = BlocksparseMatMul(mask, block_size=16, feature_axis=axis)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: bsmm(x, w), fullgraph=True, backend="aot_eager")
    _check_bsmm(bsmm, mask, rng, n=4, call=compiled)


@pytest.mark.interpreter
def test_kernels_linear_compiled_with_bias(rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    mask = np.array(LAYOUTS["empty-row-and-col"])
    layer = BlocksparseLinear(mask, block_size=16)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = draw(rng, (3, layer.in_features), torch.float32, requires_grad=True)
    y = compiled(x)
    dy = draw(rng, tuple(y.shape), torch.float32)
    y.backward(dy)
    ref_y, ref_dx, ref_dw, ref_db = _expect(mask, f64(layer.weight), f64(x), f64(dy), 16, f64(layer.bias))
    for got, ref in ((y, ref_y), (x.grad, ref_dx), (layer.weight.grad, ref_dw), (layer.bias.grad, ref_db)):
        close(got, ref, torch.float32)


@pytest.mark.interpreter
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_kernels_without_gradient(rng, monkeypatch, mode):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    mask = np.array(LAYOUTS["one-block"])
    layer = BlocksparseLinear(mask, block_size=16)
    x = draw(rng, (3, layer.in_features), torch.float32, requires_grad=True)
    with getattr(torch, mode)():
        y = layer(x)
    assert not y.requires_grad
    close(y, f64(x) @ dense_weight(mask, f64(layer.weight), 16) + f64(layer.bias), torch.float32)


@pytest.mark.interpreter
def test_kernels_under_cpu_autocast(rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    mask = np.array(LAYOUTS["empty-row-and-col"])
    layer = BlocksparseLinear(mask, block_size=16)
    x = draw(rng, (3, layer.in_features), torch.float32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    wb, xb, bb = (f64(t.to(torch.bfloat16)) for t in (layer.weight, x, layer.bias))
    close(y, xb @ dense_weight(mask, wb, 16) + bb, torch.bfloat16)
    dy = draw(rng, tuple(y.shape), torch.float32)
    y.float().backward(dy)
    assert x.grad.dtype == layer.weight.grad.dtype == layer.bias.grad.dtype == torch.float32
    close(x.grad, f64(dy) @ dense_weight(mask, wb, 16).T, torch.bfloat16)
    close(layer.weight.grad, block_grads(np.argwhere(mask), xb, f64(dy), 16), torch.bfloat16)


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_checkpointed_and_backward_twice(rng, impl):
    """Activation checkpointing recomputes the same product; a retained graph gives the same gradients twice."""
    mask = np.array(LAYOUTS["empty-row-and-col"])
    layer = BlocksparseLinear(mask, block_size=8, impl=impl, dtype=torch.float64)
    x = draw(rng, (3, 24), torch.float64, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    dy = draw(rng, tuple(y.shape), torch.float64)
    y.backward(dy, retain_graph=True)
    ref_y, ref_dx, ref_dw, _ = _expect(mask, f64(layer.weight), f64(x), f64(dy), 8, f64(layer.bias))
    close(y, ref_y, torch.float64)
    close(x.grad, ref_dx, torch.float64)
    close(layer.weight.grad, ref_dw, torch.float64)
    y.backward(dy)
    close(x.grad, 2 * ref_dx, torch.float64)
    close(layer.weight.grad, 2 * ref_dw, torch.float64)


def test_linear_plan_refuses_an_unknown_device():
    with pytest.raises(ValueError, match="device"):
        BlocksparseLinear(np.ones((1, 1)), block_size=8).plan(device="gpu0")
