"""PixelflyLinear (shapes, low-rank term, bias, gradients against float64, state, bad input) and
the dispatch of both PyTorch layers: plan(), the impl override, decisions from a given table."""
import copy
import doctest

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import blocksparse.torch.pixelfly as pixelfly_mod  # noqa: E402
from blocksparse.dispatch import CostModel, Plan, Table  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402
from blocksparse.torch import BlocksparseLinear, PixelflyLinear  # noqa: E402


def test_doctests():
    assert doctest.testmod(pixelfly_mod).failed == 0


def _reference(layer, x):
    """float64 numpy: x @ (butterfly + low-rank) + bias, and its gradients for loss = sum(y * r)."""
    lay = layer.layout
    w = lay.dense(layer.weight.detach().double().numpy())
    if layer.lowrank_first is not None:
        w = w + layer.lowrank_first.detach().double().numpy().T @ layer.lowrank_second.detach().double().numpy().T
    b = layer.bias.detach().double().numpy() if layer.bias is not None else 0.0
    return x @ w + b, w


@pytest.mark.parametrize("impl", ["portable", "dense", "reference", "auto"])
@pytest.mark.parametrize("lowrank, bias", [(0, True), (3, False), (5, True)], ids=["plain", "lowrank", "both"])
def test_values_and_gradients(rng, impl, lowrank, bias):
    layer = PixelflyLinear(96, 192, 24, 4, 2, lowrank_size=lowrank, bias=bias, dtype=torch.float64, impl=impl)
    x = torch.from_numpy(rng.standard_normal((2, 3, 96))).requires_grad_()
    r = torch.from_numpy(rng.standard_normal((2, 3, 192)))
    y = layer(x)
    assert y.shape == (2, 3, 192)
    (y * r).sum().backward()
    ref, w = _reference(layer, x.detach().numpy().reshape(-1, 96))
    assert rel_error(y.detach().reshape(-1, 192), ref) < 1e-12
    rr = r.numpy().reshape(-1, 192)
    assert rel_error(x.grad.reshape(-1, 96), rr @ w.T) < 1e-12
    dense_dw = x.detach().numpy().reshape(-1, 96).T @ rr
    assert rel_error(layer.weight.grad, layer.layout.pack(dense_dw)) < 1e-12
    if lowrank:
        first, second = (p.detach().numpy() for p in (layer.lowrank_first, layer.lowrank_second))
        xr = x.detach().numpy().reshape(-1, 96)
        assert rel_error(layer.lowrank_second.grad, rr.T @ (xr @ first.T)) < 1e-12
        assert rel_error(layer.lowrank_first.grad, (rr @ second).T @ xr) < 1e-12
    if bias:
        assert rel_error(layer.bias.grad, rr.sum(axis=0)) < 1e-12


def test_parameters_and_layout():
    layer = PixelflyLinear(384, 1536, 48, 64, 6, lowrank_size=16)
    np.testing.assert_array_equal(layer.layout.mask, butterfly_layout(384, 1536, 48, 64, 6))
    assert layer.weight.shape == (128, 48, 48) and layer.layout.density == 0.5
    assert layer.lowrank_first.shape == (16, 384) and layer.lowrank_second.shape == (1536, 16)
    assert layer.bias.shape == (1536,)
    assert sum(p.numel() for p in layer.parameters()) == 128 * 48 * 48 + 16 * (384 + 1536) + 1536
    assert set(layer.state_dict()) == {"weight", "lowrank_first", "lowrank_second", "bias"}
    assert "butterfly_size=64" in repr(layer) and "impl='auto'" in repr(layer)
    assert PixelflyLinear(384, 1536, 48).butterfly_size == 8        # pixelfly's default
    assert PixelflyLinear(64, 64, 16, stretch=True).stretch


def test_init_scales_like_linear():
    layer = PixelflyLinear(256, 256, 16, 16, 2)                     # 3 blocks per column
    bound = 1 / np.sqrt(3 * 16)
    w = layer.weight.detach().abs()
    assert w.max() <= bound and w.max() > 0.9 * bound
    assert layer.bias.detach().abs().max() <= bound


def test_state_dict_round_trip_across_impls(rng):
    a = PixelflyLinear(96, 48, 24, 4, lowrank_size=2, impl="portable")
    b = PixelflyLinear(96, 48, 24, 4, lowrank_size=2, impl="dense")
    b.load_state_dict(a.state_dict())
    x = torch.from_numpy(rng.standard_normal((4, 96)).astype(np.float32))
    torch.testing.assert_close(a(x), b(x))


def test_low_precision_and_autocast(rng):
    layer = PixelflyLinear(96, 192, 48, 2, lowrank_size=4, dtype=torch.bfloat16)
    x = torch.from_numpy(rng.standard_normal((5, 96))).to(torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    assert rel_error(y, _reference(layer, x.double().numpy())[0]) < tolerance("bfloat16")
    f32 = PixelflyLinear(96, 192, 48, 2, lowrank_size=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = f32(x.float())
    assert y.dtype == torch.bfloat16
    assert rel_error(y, _reference(f32, x.double().numpy())[0]) < tolerance("bfloat16")


# ---------------------------------------------------------------- dispatch: plan and override

def _model(**times):
    rows = [{"tokens": 64, "in_features": 96, "out_features": 192, "block_size": 24, "density": 0.5,
             "dtype": "float32", "fwd_ms": times, "fwdbwd_ms": times}]
    return CostModel(Table.from_dict({"format": 1, "framework": "torch", "device": "cpu", "rows": rows}))


def test_plan_follows_the_table():
    layer = PixelflyLinear(96, 192, 24, 4, 1, cost_model=_model(dense=2.0, portable=1.0, reference=3.0))
    assert layer.layout.density == 0.5
    plan = layer.plan(64)
    assert isinstance(plan, Plan) and plan.impl == "portable"
    assert set(plan.times_ms) == {"dense", "portable", "reference"}
    layer(torch.randn(64, 96))
    assert layer.plan().impl == "portable"                          # the last call's token count
    near_tie = PixelflyLinear(96, 192, 24, 4, 1, cost_model=_model(dense=1.04, portable=1.0))
    assert near_tie.plan(64).impl == "dense" and "within 5%" in near_tie.plan(64).why
    # dtypes by name too, as the constructors take them
    assert layer.plan(64, "float32") == layer.plan(64, torch.float32) == plan
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64"):
        layer.plan(64, "int8")


def test_the_chosen_impl_runs(monkeypatch):
    layer = PixelflyLinear(96, 192, 24, 4, 1, cost_model=_model(dense=2.0, portable=1.0))
    calls = []
    from blocksparse.torch._portable import dispatch as dispatch_mod

    monkeypatch.setattr(dispatch_mod, "portable_matmul",
                        lambda *a: calls.append("portable") or a[0] @ torch.zeros(96, 192))
    layer(torch.randn(64, 96))
    assert calls == ["portable"]


def test_a_margin_set_later_changes_what_runs(monkeypatch):
    """A model's margin (or table) set after a layer has run takes effect at the next call."""
    model = _model(dense=1.04, portable=1.0)
    layer = PixelflyLinear(96, 192, 24, 4, 1, cost_model=model)
    calls = []
    from blocksparse.torch._portable import dispatch as dispatch_mod

    monkeypatch.setattr(dispatch_mod, "portable_matmul",
                        lambda *a: calls.append("portable") or a[0] @ torch.zeros(96, 192))
    x = torch.randn(64, 96)
    layer(x)
    assert calls == [] and layer.plan(64).impl == "dense"
    model.margin = 0.0
    layer(x)
    assert calls == ["portable"] and layer.plan(64).impl == "portable"
    model.table = _model(dense=0.5, portable=1.0).table
    layer(x)
    assert calls == ["portable"] and layer.plan(64).impl == "dense"
    assert layer._dispatch._choices and not copy.deepcopy(layer)._dispatch._choices  # a copy plans anew


def test_a_margin_set_later_reaches_a_compiled_layer(monkeypatch):
    """The compiled graph's choice is traced anew when the layer's model moves."""
    model = _model(dense=1.04, portable=1.0)
    layer = PixelflyLinear(96, 192, 24, 4, 1, cost_model=model)
    from blocksparse.torch._portable import dispatch as dispatch_mod

    monkeypatch.setattr(dispatch_mod, "portable_matmul", lambda x, *a, **k: torch.zeros(x.shape[0], 192))
    x = torch.randn(64, 96)
    compiled = torch.compile(layer, backend="eager")
    with torch.no_grad():
        assert layer(x).abs().sum() > 0 and compiled(x).abs().sum() > 0  # dense on the near tie
        model.margin = 0.0
        assert layer(x).abs().sum() == 0 and compiled(x).abs().sum() == 0  # portable (the stand-in)


def test_a_gpu_plan_without_the_kernel_library_counts_the_jit_launches(monkeypatch):
    """On CUDA, where no kernel library serves the call, the kernels launch through Triton's JIT: the
    plan raises their time to its host cost, so a host-bound layer is planned dense."""
    from blocksparse import _kernels
    from blocksparse.aot.abi import KernelLibrary
    from blocksparse.aot.targets import spec_rank

    class Library:  # the library's own spec search over a manifest of our own
        find = KernelLibrary.find

        def __init__(self, **fields):
            self.specs = [{"family": "matmul", "product": "fprop", "dtype": "fp32", "block_size": 16, "arch": 90,
                           "target": "sm_90a", "image": "cubin", "shared": 1024, **fields}]

        def rank(self, index, arch):
            return spec_rank(self.specs[index], arch)

    mask = np.ones((2, 3), dtype=int)
    times = {"kernels": 0.3, "dense": 0.5}
    rows = [{"tokens": 64, "in_features": 32, "out_features": 48, "block_size": 16, "density": 1.0,
             "dtype": "float32", "fwd_ms": times, "fwdbwd_ms": times}]
    model = CostModel(Table.from_dict({"format": 1, "framework": "torch", "device": "cuda", "rows": rows}))
    layer = BlocksparseLinear(mask, 16, cost_model=model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # planned for a GPU this process does not see
    monkeypatch.setattr(_kernels, "load", lambda: Library())
    assert layer.plan(64, torch.float32, "cuda").impl == "kernels"
    monkeypatch.setattr(_kernels, "load", lambda: None)
    plan = layer.plan(64, torch.float32, "cuda")
    assert plan.impl == "dense" and "Triton's JIT" in plan.why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cases = ((Library(), (9, 0), "kernels"), (Library(), (10, 0), "dense"),  # sm_90a cubins: not on a 10.0 GPU
             (Library(block_size=32), (9, 0), "dense"), (Library(dtype="bf16"), (9, 0), "dense"))  # not this call's
    for library, capability, impl in cases:
        monkeypatch.setattr(_kernels, "load", lambda lib=library: lib)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert layer.plan(64, torch.float32, "cuda").impl == impl, (library.specs, capability)
    assert layer.plan(64, torch.float32, "cpu").impl != "kernels"  # off CUDA the kernels are no candidate


def test_override(monkeypatch):
    layer = PixelflyLinear(96, 192, 24, 4, 1, cost_model=_model(dense=2.0, portable=1.0), impl="dense")
    assert layer.plan(64).impl == "dense" and layer.plan(64).source == "override"
    layer.impl = "auto"
    assert layer.plan(64).impl == "portable"
    with pytest.raises(ValueError, match="impl must be one of"):
        layer.impl = "fastest"
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    assert layer.plan(64).impl == "reference" and "BLOCKSPARSE_BACKEND=reference" in layer.plan(64).why
    assert PixelflyLinear(9, 18, 3, 2).plan().impl == "portable"   # no reference path for block size 3
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(ValueError, match="BLOCKSPARSE_BACKEND=triton asks for the kernels"):
        PixelflyLinear(9, 18, 3, 2).plan()
    # blocks of 8 have a matmul but no kernels: its reference path serves, and the plan says so
    small = BlocksparseLinear(np.eye(2), 8).plan(4)
    assert small.impl == "reference" and "no blocks of 8" in small.why
    assert BlocksparseLinear(np.eye(2), 16).plan(4).impl == "kernels"


def test_blocksparse_linear_dispatches(rng):
    mask = random_layout(rng, 6, 12, 0.5)
    rows = [{"tokens": 8, "in_features": 96, "out_features": 192, "block_size": 16, "density": float(mask.mean()),
             "dtype": "float64", "fwd_ms": {"dense": 1.0, "reference": 5.0},
             "fwdbwd_ms": {"dense": 1.0, "reference": 5.0}}]
    model = CostModel(Table.from_dict({"format": 1, "framework": "torch", "device": "cpu", "rows": rows}))
    layer = BlocksparseLinear(mask, 16, dtype=torch.float64, cost_model=model)
    assert layer.plan(8).impl == "dense" and layer.impl == "auto"
    x = torch.from_numpy(rng.standard_normal((8, 96)))
    ref = x.numpy() @ layer.layout.dense(layer.weight.detach().numpy()) + layer.bias.detach().numpy()
    outs = {}
    for impl in ("auto", "dense", "portable", "reference"):
        layer.impl = impl
        outs[impl] = layer(x)
        assert rel_error(outs[impl], ref) < 1e-12, impl
    assert layer.plan(8).source == "override" and "impl='reference'" in repr(layer)
    assert set(layer.state_dict()) == {"weight", "bias"}


@pytest.mark.parametrize("args, err, words", [
    ((100, 96, 48), ValueError, "in_features must be a multiple of block_size=48; got 100"),
    ((96, 100, 48), ValueError, "out_features must be a multiple"),
    ((96, 96, 48, 3), ValueError, "butterfly_size must be a power of two"),
    ((96, 96, 48, 2, 2), ValueError, r"n_factors must be in 1..log2\(butterfly_size\) = 1..1"),
    ((0, 96, 48), ValueError, "in_features must be >= 1; got 0"),
    ((96, 96, 0), ValueError, "block_size must be an int >= 1"),
], ids=["in", "out", "butterfly", "factors", "zero-in", "zero-bs"])
def test_bad_constructor_args(args, err, words):
    with pytest.raises(err, match=words):
        PixelflyLinear(*args)
    with pytest.raises(ValueError, match="lowrank_size must be >= 0; got -1"):
        PixelflyLinear(96, 96, 48, lowrank_size=-1)


def test_bad_call_args():
    layer = PixelflyLinear(96, 96, 48)
    with pytest.raises(ValueError, match=r"input must have shape \(\.\.\., 96\); got \(3, 95\)"):
        layer(torch.randn(3, 95))
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        layer(np.ones((3, 96)))
    with pytest.raises(TypeError, match="same dtype"):
        layer.impl = "portable"
        layer(torch.randn(3, 96, dtype=torch.float64))
    with pytest.raises(ValueError, match="tokens must be >= 1; got 0"):
        layer.plan(0)


def test_readme_example():
    """The README's pixelfly example runs as printed (on smaller inputs) and trains through."""
    from readme_examples import readme_example

    code = readme_example("pixelfly")
    scope = {}
    exec(compile(code.replace("torch.randn(16, 512, 384", "torch.randn(2, 8, 384"), "README:pixelfly", "exec"), scope)
    mlp, x = scope["mlp"], scope["x"]
    assert x.grad is not None and mlp[0].weight.grad is not None and mlp[0].lowrank_first.grad is not None
    assert mlp[0].impl == "dense" and mlp[0].plan().source == "override"


@pytest.mark.parametrize("impl", ["portable", "dense", "reference"])
@pytest.mark.parametrize("recipe", ["assign", "to_empty"])
@pytest.mark.parametrize("make", ["linear", "pixelfly"])
def test_meta_device_layer_loaded_from_a_state_dict(rng, impl, recipe, make):
    """A layer built on the meta device and given a trained state dict -- ``load_state_dict(assign=True)``,
    or ``to_empty()`` then ``load_state_dict()`` -- computes what the trained layer does: the index
    tables (buffers outside the state dict) follow the weight and are refilled on every move."""
    if make == "linear":
        build = lambda **kw: BlocksparseLinear(random_layout(np.random.default_rng(5), 4, 3, 0.5, cover=True), 8,  # noqa: E731
                                               impl=impl, **kw)
    else:
        build = lambda **kw: PixelflyLinear(64, 48, 16, 2, impl=impl if impl != "reference" else "dense", **kw)  # noqa: E731
    trained = build()
    with torch.no_grad():
        for p in trained.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(p.shape)))
    x = torch.from_numpy(rng.standard_normal((5, trained.in_features))).float()
    with torch.device("meta"):
        layer = build()
    if recipe == "assign":
        layer.load_state_dict(trained.state_dict(), assign=True)
    else:
        layer.to_empty(device="cpu")
        layer.load_state_dict(trained.state_dict())
    torch.testing.assert_close(layer(x), trained(x))


@pytest.mark.parametrize("block_size", [48, 256])
@pytest.mark.parametrize("impl", ["reference", "kernels"])
def test_torch_func_on_packed_refinements(rng, block_size, impl):
    """Blocks of 48 and 256 run the kernels' product on a packed refinement (the weight kept in its
    coarse blocks): vmap and forward-mode tangents through it take the dense product of those blocks."""
    layer = BlocksparseLinear(np.array([[1, 0], [1, 1]]), block_size, impl=impl).double()
    x = torch.from_numpy(rng.standard_normal((3, 2, 2 * block_size)))
    dense = layer._dispatch.run("dense", torch.eye(2 * block_size, dtype=torch.float64), layer.weight)
    want = x @ dense + layer.bias
    with torch.no_grad():
        assert rel_error(torch.func.vmap(layer)(x), want) < 1e-12
        tangent = torch.from_numpy(rng.standard_normal(x[0].shape))
        y, dy = torch.func.jvp(layer, (x[0],), (tangent,))
    assert rel_error(y, want[0]) < 1e-12 and rel_error(dy, tangent @ dense) < 1e-12


def test_constructor_checks_do_not_depend_on_the_block_size():
    for bs in (3, 16):
        with pytest.raises(TypeError, match="allow_tf32 must be a bool; got 1"):
            BlocksparseLinear(np.ones((2, 2)), bs, allow_tf32=1)
    with pytest.raises(TypeError, match="allow_tf32 must be a bool"):
        PixelflyLinear(12, 24, 3, allow_tf32="no")
    with pytest.raises(TypeError, match="block_size must be an int >= 1; got 16.0"):
        BlocksparseLinear(np.ones((2, 2)), 16.0)
    for make in (lambda: BlocksparseLinear(np.ones((2, 2)), 16, dtype=torch.int32),
                 lambda: PixelflyLinear(96, 96, 48, dtype="int64")):
        with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64"):
            make()
    assert PixelflyLinear(96, 96, 48, dtype="bfloat16").weight.dtype == torch.bfloat16


@pytest.mark.parametrize("impl", ["dense", "portable", "reference", "auto"])
@pytest.mark.parametrize("stack_buffers", [False, True], ids=["shared-buffers", "stacked-buffers"])
def test_vmap_over_an_ensemble_of_weights(rng, impl, stack_buffers):
    """``torch.func``'s ensembling recipe: ``stack_module_state`` then ``vmap`` of ``functional_call``
    over the stacked weights (and, as the recipe has it, the stacked index buffers of one layout);
    each model's output against float64."""
    from torch.func import functional_call, stack_module_state, vmap

    models = [PixelflyLinear(32, 64, 8, 4, 1, impl=impl).double() for _ in range(3)]
    params, buffers = stack_module_state(models)
    x = torch.from_numpy(rng.standard_normal((5, 32)))
    base = models[0]
    if stack_buffers:
        got = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)), in_dims=(0, 0, None))(params, buffers, x)
    else:
        shared = dict(base.named_buffers())
        got = vmap(lambda p, x: functional_call(base, (p, shared), (x,)), in_dims=(0, None))(params, x)
    for m, y in zip(models, got):
        dense = m._dispatch.run("dense", torch.eye(32, dtype=torch.float64), m.weight).detach().numpy()
        want = x.numpy() @ dense + m.bias.detach().numpy()
        assert rel_error(y.detach().numpy(), want) < 1e-12


@pytest.mark.parametrize("impl", ["dense", "reference", "kernels", "auto"])
def test_vmap_over_layers_of_different_layouts(rng, impl):
    """Stacked layers of different layouts (buffers stacked too): each model by its own layout,
    against float64 (the matmul's paths take the layer's index buffers inside the transform)."""
    from torch.func import functional_call, stack_module_state, vmap

    models = [BlocksparseLinear(np.array(lay), 8, impl=impl).double() for lay in ([[1, 0], [0, 1]], [[0, 1], [1, 0]])]
    params, buffers = stack_module_state(models)
    x = torch.from_numpy(rng.standard_normal((3, 16)))
    got = vmap(lambda p, b, x: functional_call(models[0], (p, b), (x,)), in_dims=(0, 0, None))(params, buffers, x)
    for m, y in zip(models, got):
        dense = m._dispatch.run("dense", torch.eye(16, dtype=torch.float64), m.weight).detach().numpy()
        assert rel_error(y.detach().numpy(), x.numpy() @ dense + m.bias.detach().numpy()) < 1e-12


def test_vmap_refuses_portable_tables_of_different_layouts(rng):
    from torch.func import functional_call, stack_module_state, vmap

    models = [BlocksparseLinear(np.array(lay), 8, impl="portable") for lay in ([[1, 0], [0, 1]], [[0, 1], [1, 0]])]
    params, buffers = stack_module_state(models)
    x = torch.from_numpy(rng.standard_normal((3, 16)).astype(np.float32))
    with pytest.raises(ValueError, match="index tables differ across the vmap batch"):
        vmap(lambda p, b, x: functional_call(models[0], (p, b), (x,)), in_dims=(0, 0, None))(params, buffers, x)


def test_plans_of_many_token_counts_stay_bounded(monkeypatch):
    """A layer fed ever new token counts (dynamic padding) keeps a bounded number of plans."""
    from blocksparse.torch._portable import dispatch as dispatch_mod

    monkeypatch.setattr(dispatch_mod, "PLAN_CACHE_SIZE", 8)
    layer = PixelflyLinear(96, 192, 24, 4, 1, cost_model=_model(dense=2.0, portable=1.0))
    x = torch.randn(40, 96)
    for n in range(1, 40):
        assert torch.allclose(layer(x[:n]), layer(x)[:n], atol=1e-5)
    assert 0 < len(layer._dispatch._plans) <= 8 and 0 < len(layer._dispatch._choices) <= 8
