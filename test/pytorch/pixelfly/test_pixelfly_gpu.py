"""PixelflyLinear on a CUDA GPU: every implementation (the kernels on refined layouts with grouped
outputs included) against float64, torch.compile and autocast, the shipped GPU table.  Skipped
without a GPU."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout  # noqa: E402
from blocksparse.testing import rel_error, rounded_once_bound, tolerance  # noqa: E402
from blocksparse.testing.matmul import dense_products_torch  # noqa: E402
from blocksparse.torch import PixelflyLinear  # noqa: E402
from blocksparse.torch._matmul import plan as _plan  # noqa: E402
from blocksparse.torch._matmul import products  # noqa: E402
from blocksparse.torch._portable.dispatch import for_layout  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _check(dispatch, impl, rng, n, dtype):
    lay = dispatch.layout
    t = lambda a: torch.from_numpy(a).to("cuda", DTYPES[dtype])  # noqa: E731
    x = t(rng.standard_normal((n, lay.C))).requires_grad_()
    w = t(rng.standard_normal(lay.w_shape) / np.sqrt(lay.block_size * lay.CB * lay.density)).requires_grad_()
    dy = t(rng.standard_normal((n, lay.K)))
    y = dispatch.run(impl, x, w)
    y.backward(dy)
    refs = dense_products_torch(lay, x, w, dy)
    for name, got, ref in zip(("y", "dx", "dw"), (y, x.grad, w.grad), refs):
        assert got.dtype == x.dtype and rel_error(got, ref) < tolerance(dtype), f"{impl} {name}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("impl", ["kernels", "portable", "dense"])
@pytest.mark.parametrize("fin, fout, bs", [(384, 1536, 48), (1536, 384, 48), (1024, 2048, 256), (2048, 512, 256)],
                         ids=["bs48-up", "bs48-down", "bs256-up", "bs256-down"])
def test_pixelfly_layers_every_impl(rng, dtype, impl, fin, fout, bs):
    dispatch = for_layout(Layout(butterfly_layout(fin, fout, bs, 64 if bs == 48 else 8), bs, any_block_size=True),
                          device="cuda")
    _check(dispatch, impl, rng, 1000, dtype)


@pytest.mark.parametrize("fin, fout, bs, butterfly, fine, group", [(1536, 3072, 96, 16, 32, 2), (2048, 4096, 256, 8, 128, 1)],
                         ids=["bs96-grouped", "bs256-ungrouped"])
def test_refined_butterfly_runs_grouped_kernels(rng, monkeypatch, fin, fout, bs, butterfly, fine, group):
    """The JIT's tile for a refined butterfly: grouped where the refined block is at most
    GROUPED_MAX_BLOCK (64), G = 1 above (grouped tiles measured slower there); right either way."""
    monkeypatch.setenv("BLOCKSPARSE_KERNELS", "jit")  # the grouped tiles are the JIT's (compiled specs: G = 1)
    dispatch = for_layout(Layout(butterfly_layout(fin, fout, bs, butterfly), bs, any_block_size=True), device="cuda")
    lay = dispatch.bsmm.layout
    assert dispatch.bsmm.block_size == fine
    x = torch.empty(4096, lay.C, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(lay.w_shape, device="cuda", dtype=torch.bfloat16)
    plan = products.plan_of("fprop", x, w, _plan.handle(lay, lay), 1, "ieee")
    assert plan.config.G == group
    _check(dispatch, "kernels", rng, 4096, "bfloat16")


@pytest.mark.parametrize("impl", ["kernels", "portable", "dense"])
def test_compiled_under_autocast_against_float64(impl):
    """torch.compile(fullgraph=True) of each implementation under bfloat16 autocast, against the
    float64 product of the layer's whole matrix (butterfly + low-rank) and bias."""
    layer = PixelflyLinear(384, 1536, 48, 64, lowrank_size=8, device="cuda", impl=impl)
    x = torch.randn(400, 384, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.compile(layer, fullgraph=True)(x)
    assert y.dtype == torch.bfloat16
    ref = x.detach().double() @ layer.dense_weight().detach().double() + layer.bias.detach().double()
    assert rel_error(y, ref) < tolerance("bfloat16")
    y.float().square().mean().backward()
    assert torch.isfinite(layer.weight.grad).all() and torch.isfinite(x.grad).all()


def test_gpu_plan_names_its_source():
    layer = PixelflyLinear(2048, 8192, 256, 64, device="cuda", dtype=torch.bfloat16)
    plan = layer.plan(8192)
    assert plan.impl in ("kernels", "portable", "dense") and plan.why
    assert plan.source in ("torch-cuda.json", "default rule")


@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_portable_16bit_products_round_once(rng, dtype, autocast):
    """A column of two nearly cancelling blocks: the portable path's slabs are float32 products
    (``bmm`` with float32 results on CUDA), so the sum is rounded once, as the dense product's."""
    dispatch = for_layout(Layout(np.ones((2, 1), dtype=int), 48, any_block_size=True), device="cuda")
    x = torch.from_numpy(rng.standard_normal((64, 96))).cuda()
    w = torch.from_numpy(rng.standard_normal((2, 48, 48))).cuda()
    w[1] = -w[0] * 1.001
    x[:, 48:] = x[:, :48]
    low = DTYPES[dtype]
    exact = dispatch.run("dense", x.to(low).double(), w.to(low).double())
    magnitude = dispatch.run("dense", x.to(low).double().abs(), w.to(low).double().abs())
    for impl in ("portable", "dense"):
        if autocast:
            with torch.autocast("cuda", dtype=low):
                y = dispatch.run(impl, x.float(), w.float())
        else:
            y = dispatch.run(impl, x.to(low), w.to(low))
        assert y.dtype == low
        bound = torch.from_numpy(rounded_once_bound(exact, y, magnitude, 96, low)).cuda()
        assert ((y.double() - exact).abs() <= bound).all(), impl


def test_torch_func_through_the_kernels(rng):
    """vmap and grad of a layer that runs the kernels: the transforms take the dense product."""
    from blocksparse.torch import BlocksparseLinear

    layer = BlocksparseLinear(np.ones((4, 2)), 32, device="cuda", impl="kernels")
    xs = torch.randn(3, 5, 128, device="cuda")
    got = torch.func.vmap(layer)(xs)
    assert rel_error(got, torch.stack([layer(x) for x in xs])) < tolerance("float32")
    params = dict(layer.named_parameters())
    grads = torch.func.grad(lambda p, x: torch.func.functional_call(layer, p, (x,)).sum())(params, xs[0])
    ref = torch.autograd.grad(layer(xs[0]).sum(), [layer.weight, layer.bias])
    assert rel_error(grads["weight"], ref[0]) < tolerance("float32")
    assert rel_error(grads["bias"], ref[1]) < tolerance("float32")
