"""The portable path and the dense masked product in PyTorch against float64: block sizes 1, 3, 48
and 256, layouts with several row lengths and empty rows / columns, every dtype, autocast, the
TF32 flag, torch.compile; the refined kernels through Triton's interpreter."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout  # noqa: E402
from blocksparse.testing import rel_error, rounded_once_bound, tolerance  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402
from blocksparse.torch._portable.dispatch import for_layout  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def _inputs(rng, lay, n, dtype):
    t = lambda a: torch.from_numpy(a).to(DTYPES[dtype])  # noqa: E731
    return (t(rng.standard_normal((n, lay.C))), t(rng.standard_normal(lay.w_shape) / np.sqrt(lay.block_size)),
            t(rng.standard_normal((n, lay.K))))


def check(dispatch, impl, rng, n, dtype, tol=None):
    lay = dispatch.layout
    x, w, dy = _inputs(rng, lay, n, dtype)
    x.requires_grad_()
    w.requires_grad_()
    y = dispatch.run(impl, x, w)
    y.backward(dy)
    assert (y.dtype, x.grad.dtype, w.grad.dtype) == (x.dtype,) * 3 and y.shape == (n, lay.K)
    refs = dense_products(lay, *(a.detach().double().numpy() for a in (x, w, dy)), 1)
    for name, got, ref in zip(("y", "dx", "dw"), (y, x.grad, w.grad), refs):
        assert rel_error(got, ref) < (tol or tolerance(dtype)), f"{impl} {name}"


@pytest.mark.parametrize("impl", ["portable", "dense"])
@pytest.mark.parametrize("bs, cb, kb", [(1, 24, 40), (3, 10, 6), (48, 3, 5), (256, 2, 2)],
                         ids=["bs1", "bs3", "bs48", "bs256"])
def test_any_block_size_random_layouts(rng, impl, bs, cb, kb):
    """Random layouts: rows of several lengths (one batched matmul each), empty rows and columns."""
    mask = random_layout(rng, cb, kb, 0.5, empty_rows=1, empty_cols=1)
    check(for_layout(Layout(mask, bs, any_block_size=True)), impl, rng, 7, "float32")


@pytest.mark.parametrize("impl", ["portable", "dense"])
@pytest.mark.parametrize("bs, fin, fout, n_bfly", [(1, 32, 64, 8), (3, 24, 48, 8), (48, 192, 384, 4),
                                                   (256, 512, 256, 2)], ids=["bs1", "bs3", "bs48", "bs256"])
def test_any_block_size_butterflies(rng, impl, bs, fin, fout, n_bfly):
    mask = butterfly_layout(fin, fout, bs, n_bfly)
    check(for_layout(Layout(mask, bs, any_block_size=True), impl=impl), impl, rng, 5, "float32")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("impl", ["portable", "dense", "reference"])
def test_dtypes(rng, impl, dtype):
    mask = random_layout(rng, 4, 5, 0.5, empty_cols=1)
    check(for_layout(Layout(mask, 48, any_block_size=True, z_order=True)), impl, rng, 9, dtype)


def test_fixed_row_layout_runs_one_matmul(rng):
    """A butterfly: one row group, no gathers -- one bmm and one embedding_bag forward."""
    dispatch = for_layout(Layout(butterfly_layout(96, 192, 12, 8), 12, any_block_size=True))
    assert len(dispatch.tables.groups) == 1 and dispatch.tables.tables.identity_order
    x, w, _ = _inputs(rng, dispatch.layout, 4, "float32")
    with torch.profiler.profile() as prof:
        dispatch.run("portable", x, w)
    names = [e.name for e in prof.events()]
    assert names.count("aten::bmm") == 1 and names.count("aten::embedding_bag") == 1
    assert "aten::index_select" not in names


def test_the_output_is_never_left_unwritten(rng):
    """Empty output columns come out as zeros, not as the NaN of a poisoned buffer."""
    mask = np.zeros((3, 4), dtype=bool)
    mask[0, 1] = mask[2, 3] = True
    dispatch = for_layout(Layout(mask, 5, any_block_size=True))
    x, w, _ = _inputs(rng, dispatch.layout, 6, "float32")
    for impl in ("portable", "dense"):
        y = dispatch.run(impl, x, w)
        assert torch.isfinite(y).all() and (y[:, :5] == 0).all() and (y[:, 10:15] == 0).all()


@pytest.mark.parametrize("impl", ["portable", "dense"])
def test_autocast(rng, impl):
    dispatch = for_layout(Layout(random_layout(rng, 3, 4, 0.6), 24, any_block_size=True))
    x, w, _ = _inputs(rng, dispatch.layout, 5, "float32")
    bias = torch.randn(dispatch.layout.K)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = dispatch.run(impl, x, w, bias)
    assert y.dtype == torch.bfloat16
    ref = x.double().numpy() @ dispatch.layout.dense(w.double().numpy()) + bias.double().numpy()
    assert rel_error(y, ref) < tolerance("bfloat16")


@pytest.fixture
def cuda_tf32():
    """Set PyTorch's CUDA TF32 switch (``cuda_tf32(True)``) for one test, restored after.  By
    assignment: some torch releases keep it behind the module's ``__setattr__`` only, where
    ``monkeypatch.setattr`` finds no attribute to patch."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32

    def switch(on):
        matmul.allow_tf32 = on

    yield switch
    matmul.allow_tf32 = before


def test_tf32_flag_keys_the_plan(cuda_tf32):
    """float32 on CUDA with PyTorch's TF32 switch on is planned as TF32 (its own table rows)."""
    from blocksparse.dispatch import CostModel, Table

    rows = [{"tokens": 64, "in_features": 48, "out_features": 96, "block_size": 24, "density": 0.5,
             "dtype": dt, "fwd_ms": t, "fwdbwd_ms": t}
            for dt, t in (("float32", {"dense": 1.0, "portable": 2.0}), ("tf32", {"dense": 2.0, "portable": 1.0}))]
    model = CostModel(Table.from_dict({"format": 1, "framework": "torch", "device": "cuda", "rows": rows}))
    mask = np.eye(2, 4, dtype=bool)
    dispatch = for_layout(Layout(mask, 24, any_block_size=True), cost_model=model)
    cuda_tf32(False)
    assert dispatch.plan(64, torch.float32, "cuda").impl == "dense"
    cuda_tf32(True)
    assert dispatch.plan(64, torch.float32, "cuda").impl == "portable"
    assert dispatch.plan(64, torch.float32, "cpu").impl == "dense"   # the CPU has no TF32


def test_tf32_values_within_tf32_tolerance(rng, cuda_tf32):
    cuda_tf32(True)
    dispatch = for_layout(Layout(random_layout(rng, 3, 3, 0.7), 16), allow_tf32=True)
    check(dispatch, "portable", rng, 6, "float32", tol=tolerance("float32", tf32=True))


@pytest.mark.parametrize("impl", ["portable", "dense", "auto"])
def test_torch_compile_fullgraph(rng, impl):
    from blocksparse.torch import PixelflyLinear

    layer = PixelflyLinear(96, 144, 48, 2, lowrank_size=2, impl=impl)
    x = torch.randn(3, 4, 96, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    y.square().sum().backward()
    g = x.grad.clone()
    x.grad = None
    ref = layer(x)
    ref.square().sum().backward()
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(g, x.grad)


@pytest.mark.interpreter
@pytest.mark.parametrize("bs, fine", [(48, 16), (96, 32)])
def test_refined_kernels_match(rng, monkeypatch, bs, fine):
    """A block size the kernels do not take runs on them through the refined layout; values and
    gradients (back through the re-blocking) agree with float64."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    dispatch = for_layout(Layout(random_layout(rng, 2, 3, 0.5), bs, any_block_size=True))
    assert dispatch.refinement is not None and dispatch.bsmm.block_size == fine
    check(dispatch, "kernels", rng, 5, "float32")


def test_kernel_weight_reblocks_exactly(rng):
    lay = Layout(random_layout(rng, 3, 2, 0.6), 48, any_block_size=True, z_order=True)
    dispatch = for_layout(lay)
    w = torch.from_numpy(rng.standard_normal(lay.w_shape))
    fine = dispatch.kernel_weight(w)
    np.testing.assert_array_equal(dispatch.bsmm.layout.dense(fine.numpy()), lay.dense(w.numpy()))


def test_bad_inputs():
    dispatch = for_layout(Layout(np.eye(2, dtype=int), 3, any_block_size=True))
    w = torch.randn(dispatch.layout.w_shape)
    with pytest.raises(TypeError, match="same dtype"):
        dispatch.run("portable", torch.randn(2, 6, dtype=torch.float64), w)
    with pytest.raises(TypeError, match="floating point"):
        dispatch.run("dense", torch.ones(2, 6, dtype=torch.int64), w)
    with pytest.raises(ValueError, match="impl='kernels' cannot run block size 3"):
        dispatch.run("kernels", torch.randn(2, 6), w)
    with pytest.raises(ValueError, match="impl='reference' cannot run block size 3"):
        for_layout(Layout(np.eye(2, dtype=int), 3, any_block_size=True), impl="reference")
    with pytest.raises(ValueError, match="impl must be one of"):
        for_layout(Layout(np.eye(2, dtype=int), 3, any_block_size=True), impl="gpu")


def test_dense_path_uses_the_current_weight_every_call(rng):
    """No stale dense matrix: an optimizer step, an in-place write and a write through ``.data``
    (which bumps no version counter) all reach the next call."""
    dispatch = for_layout(Layout(random_layout(rng, 3, 4, 0.5), 8))
    x, w, _ = _inputs(rng, dispatch.layout, 4, "float32")
    w = torch.nn.Parameter(w)
    opt = torch.optim.SGD([w], lr=0.5)
    dispatch.run("dense", x, w).sum().backward()
    opt.step()

    def ref():
        return x.double().numpy() @ dispatch.layout.dense(w.detach().double().numpy())

    assert rel_error(dispatch.run("dense", x, w), ref()) < 1e-5
    with torch.no_grad():
        w.mul_(2)
    assert rel_error(dispatch.run("dense", x, w), ref()) < 1e-5
    w.data.mul_(-0.5)
    assert rel_error(dispatch.run("dense", x, w), ref()) < 1e-5


@pytest.mark.parametrize("impl", ["portable", "dense", "reference"])
def test_twice_differentiable(rng, impl):
    """Gradients of gradients (gradient penalties, Hessian-vector products) on every framework path:
    the portable path's segment sum has a differentiable backward of its own."""
    mask = random_layout(rng, 3, 4, 0.5, empty_rows=1)
    dispatch = for_layout(Layout(mask, 16 if impl == "reference" else 3, any_block_size=True))
    x, w, _ = _inputs(rng, dispatch.layout, 4, "float64")
    assert torch.autograd.gradgradcheck(lambda a, b: dispatch.run(impl, a, b),
                                        (x.requires_grad_(), w.requires_grad_()))


def test_pixelfly_kernels_off_cuda_run_the_reference_path(rng):
    """``impl="kernels"`` off CUDA runs the matmul ops' reference path, as BlocksparseLinear's does."""
    from blocksparse.torch import PixelflyLinear

    layer = PixelflyLinear(64, 96, 16, 2, impl="kernels")
    x = torch.from_numpy(rng.standard_normal((5, 64))).float()
    y = layer(x)
    ref = x.double() @ layer.dense_weight().detach().double() + layer.bias.detach().double()
    assert rel_error(y, ref) < tolerance("float32")


@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_products_round_once(rng, dtype, autocast):
    """A column fed by two nearly cancelling blocks: every path rounds the float32 sum once (the
    portable path once summed 16-bit products of each block: ~1000x the error of one rounding)."""
    dispatch = for_layout(Layout(np.ones((2, 1), dtype=int), 16))
    x, w, _ = _inputs(rng, dispatch.layout, 8, "float64")
    w[1] = -w[0] * 1.001
    x[:, 16:] = x[:, :16]
    low = DTYPES[dtype]
    exact = dispatch.run("dense", x.to(low).double(), w.to(low).double())
    magnitude = dispatch.run("dense", x.to(low).double().abs(), w.to(low).double().abs())
    for impl in ("portable", "dense") if autocast else ("portable", "dense", "reference"):
        if autocast:  # the framework paths multiply the operands autocast rounds, as nn.Linear
            with torch.autocast("cpu", dtype=low):
                y = dispatch.run(impl, x.float(), w.float())
        else:
            y = dispatch.run(impl, x.to(low), w.to(low))
        assert y.dtype == low
        err = (y.double() - exact).abs().numpy()
        bound = rounded_once_bound(exact, y, magnitude, 32, low)
        assert (err <= bound).all(), f"{impl}: {(err / bound).max():.3g}x the bound of one rounding"


def test_torch_func_through_the_portable_path(rng):
    """vmap, forward-mode (jvp) and reverse-mode (jacrev) transforms of the portable path against
    the dense masked product (plain PyTorch ops), per sample."""
    mask = random_layout(rng, 3, 4, 0.5, empty_rows=1)
    dispatch = for_layout(Layout(mask, 3, any_block_size=True))
    x, w, _ = _inputs(rng, dispatch.layout, 4, "float64")
    xs = torch.from_numpy(rng.standard_normal((5, 4, dispatch.layout.C)))
    portable = lambda a, b=w: dispatch.run("portable", a, b)  # noqa: E731
    dense = lambda a, b=w: dispatch.run("dense", a, b)  # noqa: E731
    assert rel_error(torch.func.vmap(portable)(xs), torch.stack([dense(a) for a in xs])) < 1e-12
    tangent = torch.randn_like(x)
    (y, dy), (y_ref, dy_ref) = (torch.func.jvp(f, (x,), (tangent,)) for f in (portable, dense))
    assert rel_error(y, y_ref) < 1e-12 and rel_error(dy, dy_ref) < 1e-12
    jac = torch.func.jacrev(lambda b: portable(x, b))(w)
    assert rel_error(jac, torch.func.jacrev(lambda b: dense(x, b))(w)) < 1e-12


def test_forced_kernels_plan_names_what_runs(monkeypatch):
    """``impl="kernels"`` off CUDA runs the kernels' reference path, and the plan says so; on CUDA
    (planned without a GPU) and under ``BLOCKSPARSE_BACKEND=triton`` it is the kernels."""
    from blocksparse.torch import BlocksparseLinear, PixelflyLinear

    monkeypatch.delenv("BLOCKSPARSE_BACKEND", raising=False)
    for layer in (BlocksparseLinear(np.eye(2, dtype=int), block_size=16, impl="kernels"),
                  PixelflyLinear(96, 96, 48, 2, impl="kernels")):
        cpu = layer.plan(tokens=4)
        assert cpu.impl == "reference" and "impl='kernels' was asked for" in cpu.why and "cpu" in cpu.why
        assert layer.plan(tokens=4, device="cuda", dtype="bfloat16").impl == "kernels"
        assert layer.plan(tokens=4, device="cuda", dtype="float64").impl == "reference"
        x = torch.randn(4, layer.in_features, dtype=torch.float64)
        want = layer.to(torch.float64)(x)
        layer.impl = "reference"
        assert torch.equal(layer(x), want)   # what ran as "kernels" is the reference path
        layer.impl = "kernels"
        monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
        assert layer.plan(tokens=4).impl == "kernels"
        monkeypatch.delenv("BLOCKSPARSE_BACKEND")
