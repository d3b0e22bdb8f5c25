"""blocksparse.torch: BlocksparseMatMul / BlocksparseLinear values and gradients against float64,
backend selection, torch.compile, autocast, and bad input."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul  # noqa: E402
from blocksparse.testing import TOLERANCE as TOL  # noqa: E402
from blocksparse.testing.matmul import dense_products as products  # noqa: E402
from blocksparse.testing import rel_error as rel_err  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def _run(bsmm, x, w, dy):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = bsmm(x, w)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def _check(bsmm, rng, n, dtype):
    t = lambda a: torch.from_numpy(a).to(DTYPES[dtype])  # noqa: E731
    x = t(rng.standard_normal(bsmm.i_shape(n)))
    w = t(rng.standard_normal(bsmm.w_shape) / np.sqrt(bsmm.block_size))
    dy = t(rng.standard_normal(bsmm.o_shape(n)))
    y, dx, dw = _run(bsmm, x, w, dy)
    assert (y.dtype, dx.dtype, dw.dtype) == (x.dtype,) * 3
    refs = products(bsmm.layout, x.double().numpy(), w.double().numpy(), dy.double().numpy(), bsmm.axis)
    for name, got, ref in zip(("y", "dx", "dw"), (y, dx, dw), refs):
        assert rel_err(got.double().numpy(), ref) < TOL[dtype], name


@pytest.mark.parametrize("bs", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("axis", [1, 0])
def test_reference_block_sizes(rng, monkeypatch, bs, axis):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 3, 0.5, empty_rows=1, empty_cols=1), bs, axis)
    _check(bsmm, rng, 7, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("n", [1, 7, 64, 257])
def test_reference_dtypes_and_sizes(rng, monkeypatch, dtype, n):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    bsmm = BlocksparseMatMul(random_layout(rng, 5, 6, 0.4, empty_rows=1, empty_cols=2), 16,
                             feature_axis=n % 2)
    _check(bsmm, rng, n, dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize("bs, axis, n, dtype", [(16, 1, 7, "float32"), (32, 0, 20, "bfloat16"),
                                                (16, 0, 1, "float16"), (8, 1, 5, "float32")],
                         ids=["bs16-nc", "bs32-cn-bf16", "bs16-cn-fp16-n1", "bs8-fallback"])
def test_triton_backend_through_module(rng, monkeypatch, bs, axis, n, dtype):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bsmm = BlocksparseMatMul(random_layout(rng, 3, 4, 0.5, empty_cols=1), bs, axis, z_order=True)
    _check(bsmm, rng, n, dtype)


@pytest.mark.interpreter
def test_float32_cn_weight_gradient_runs_on_transposed_copies(rng, monkeypatch):
    """float32 (C, N) with many tokens: updat's plan copies x and dy to (N, C) first (the (N, C)
    product is ~3x faster there) and gives the same gradient; fewer tokens and bf16 keep their layout."""
    from blocksparse.torch._matmul import products

    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 3, 0.5, empty_cols=1), 16, feature_axis=0)
    _check(bsmm, rng, 520, "float32")
    state = products._plan.state(bsmm._handle)  # shared by equal layouts: other tests' plans may be there
    updat = [p for key, p in state.plans.items() if p.kind == "updat" and key[1] == bsmm.i_shape(520)]
    assert updat and all(p.transpose_inputs for p in updat)
    x = torch.from_numpy(rng.standard_normal(bsmm.i_shape(40))).float()
    dy = torch.from_numpy(rng.standard_normal(bsmm.o_shape(40))).float()
    few = products.plan_of("updat", x, dy, bsmm._handle, 0, "ieee", torch.float32)
    assert not few.transpose_inputs
    assert not products.plan_of("updat", x.bfloat16(), dy.bfloat16(), bsmm._handle, 0, "ieee", torch.bfloat16
                                ).transpose_inputs


@pytest.mark.interpreter
def test_16bit_cn_products_pad_odd_token_counts(rng, monkeypatch):
    """16-bit (C, N) with many tokens, not a multiple of 16: the plans pad the activations with zero
    tokens (vector loads) and give the same products (fprop: the first N tokens); a multiple of 16,
    few tokens, float32 or bprop (measured slower padded) run as they are."""
    from blocksparse.torch._matmul import products

    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 3, 0.5, empty_cols=1), 16, feature_axis=0)
    _check(bsmm, rng, 521, "bfloat16")
    w = torch.from_numpy(rng.standard_normal(bsmm.w_shape)).bfloat16()
    for n, dtype, pad in ((521, torch.bfloat16, 528), (528, torch.bfloat16, 0), (41, torch.float16, 0),
                          (521, torch.float32, 0)):
        x = torch.from_numpy(rng.standard_normal(bsmm.i_shape(n))).to(dtype)
        dy = torch.from_numpy(rng.standard_normal(bsmm.o_shape(n))).to(dtype)
        assert products.plan_of("updat", x, dy, bsmm._handle, 0, "ieee", dtype).pad_tokens == pad
        assert products.plan_of("fprop", x, w.to(dtype), bsmm._handle, 0, "ieee").pad_tokens == pad
        assert not products.plan_of("bprop", dy, w.to(dtype), bsmm._handle, 0, "ieee").pad_tokens  # slower so


def test_backend_choice(monkeypatch):
    from blocksparse.torch._matmul.products import use_triton

    cpu = torch.zeros(1)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
    assert use_triton(cpu, 32) is False  # auto: CPU tensors take the reference path
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    assert use_triton(cpu, 32) is False
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton(cpu, 32) is True
    assert use_triton(cpu, 8) is False  # block size 8 always takes the reference path
    assert use_triton(cpu.double(), 32) is False
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        use_triton(cpu, 32)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "fast")
    with pytest.raises(ValueError, match="BLOCKSPARSE_BACKEND"):
        use_triton(cpu, 32)


def test_weights_share_a_layout(rng):
    bsmm = BlocksparseMatMul(random_layout(rng, 3, 3, 0.6), 16)
    x = torch.randn(5, bsmm.C, dtype=torch.float64)
    w1, w2 = (torch.randn(bsmm.w_shape, dtype=torch.float64) for _ in range(2))
    for w in (w1, w2):
        ref = x.numpy() @ bsmm.layout.dense(w.numpy())
        assert rel_err(bsmm(x, w).numpy(), ref) < 1e-12


def test_shape_helpers():
    bsmm = BlocksparseMatMul(np.array([[1, 0, 1], [0, 1, 0]]), 32, feature_axis=0, z_order=True)
    assert bsmm.w_shape == (3, 32, 32) and (bsmm.C, bsmm.K) == (64, 96)
    assert bsmm.i_shape(7) == (64, 7) and bsmm.o_shape(7) == (96, 7)
    assert sorted(bsmm.block_coord(b) for b in range(3)) == [(0, 0), (0, 2), (1, 1)]
    assert BlocksparseMatMul([[1]], 16).i_shape(3) == (3, 16)
    assert bsmm.i_shape(None) == (64, None) and bsmm.o_shape(torch.tensor(5)) == (96, torch.tensor(5))
    with pytest.raises(ValueError, match="N must be >= 0; got -1"):
        bsmm.i_shape(-1)
    with pytest.raises(TypeError, match="N must be an int or None; got 2.5"):
        bsmm.o_shape(2.5)


# ---------------------------------------------------------------- BlocksparseLinear

def test_linear_forward_backward(rng):
    mask = random_layout(rng, 3, 4, 0.5, empty_cols=1)
    lin = BlocksparseLinear(mask, block_size=16, dtype=torch.float64)
    assert lin.weight.shape == lin.bsmm.w_shape and lin.bias.shape == (64,)
    x = torch.randn(2, 5, 48, dtype=torch.float64, requires_grad=True)
    y = lin(x)
    assert y.shape == (2, 5, 64)
    W = lin.layout.dense(lin.weight.detach().numpy())
    ref = x.detach().numpy().reshape(-1, 48) @ W + lin.bias.detach().numpy()
    assert rel_err(y.detach().numpy().reshape(-1, 64), ref) < 1e-12
    y.square().sum().backward()
    assert x.grad.shape == x.shape and lin.weight.grad.shape == lin.weight.shape
    assert lin.bias.grad is not None
    assert "blocks=" in repr(lin)


def test_linear_init_bounds():
    mask = np.zeros((4, 2), dtype=int)
    mask[:, 0] = 1  # column 0: fan-in 4 blocks; column 1: fan-in 1 block
    mask[0, 1] = 1
    lin = BlocksparseLinear(mask, block_size=16, bias=False)
    assert lin.bias is None
    bound = {0: 1 / np.sqrt(64), 1: 1 / np.sqrt(16)}
    for b in range(lin.layout.blocks):
        k = lin.layout.block_coord(b)[1]
        wb = lin.weight[b].detach().abs()
        assert wb.max() <= bound[k] and wb.max() > 0.5 * bound[k]


def test_linear_no_bias_and_dtype():
    lin = BlocksparseLinear(np.ones((2, 2)), block_size=16, bias=False, dtype=torch.bfloat16)
    assert lin.weight.dtype == torch.bfloat16 and lin.bias is None
    assert lin(torch.randn(3, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert sum(p.numel() for p in lin.parameters()) == 4 * 16 * 16


def test_torch_compile_fullgraph(rng):
    lin = BlocksparseLinear(random_layout(rng, 2, 3, 0.7), block_size=16)
    x = torch.randn(4, 32, requires_grad=True)
    compiled = torch.compile(lin, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    y.sum().backward()
    torch.testing.assert_close(y, lin(x))
    g_compiled = x.grad.clone()
    x.grad = None
    lin(x).sum().backward()
    torch.testing.assert_close(g_compiled, x.grad)


def test_autocast_cpu(rng):
    lin = BlocksparseLinear(random_layout(rng, 2, 2, 0.7), block_size=16)
    x = torch.randn(3, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    assert rel_err(y.float().detach().numpy(), lin(x).detach().numpy()) < TOL["bfloat16"]


# ---------------------------------------------------------------- bad input

@pytest.fixture
def bsmm():
    return BlocksparseMatMul([[1, 0], [1, 1]], 16)


@pytest.mark.parametrize("x_shape, w_shape, err, words", [
    ((4, 31), (3, 16, 16), ValueError, "x must have 32 features"),
    ((4, 32, 1), (3, 16, 16), ValueError, "x must be 2-D"),
    ((4, 32), (2, 16, 16), ValueError, r"w must have shape \(3, 16, 16\)"),
    ((4, 32), (3, 16, 8), ValueError, r"w must have shape \(3, 16, 16\)"),
], ids=["features", "rank", "w-blocks", "w-block-size"])
def test_bad_shapes(bsmm, x_shape, w_shape, err, words):
    with pytest.raises(err, match=words):
        bsmm(torch.randn(x_shape), torch.randn(w_shape))


def test_bad_dtypes(bsmm):
    with pytest.raises(TypeError, match="x must be floating point"):
        bsmm(torch.ones(4, 32, dtype=torch.int32), torch.randn(3, 16, 16))
    with pytest.raises(TypeError, match="w must be floating point"):
        bsmm(torch.randn(4, 32), torch.ones(3, 16, 16, dtype=torch.int64))
    with pytest.raises(TypeError, match="same dtype"):
        bsmm(torch.randn(4, 32), torch.randn(3, 16, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        bsmm(np.ones((4, 32)), torch.randn(3, 16, 16))


def test_bad_constructor_args():
    with pytest.raises(ValueError, match=r"feature_axis must be 0 \(activations \(C, N\)\) or 1"):
        BlocksparseMatMul([[1]], 16, feature_axis=2)
    with pytest.raises(ValueError, match="layout"):
        BlocksparseMatMul([[0, 0]], 16)
    with pytest.raises(ValueError, match="block_size"):
        BlocksparseLinear([[1]], block_size=0)
    with pytest.raises(ValueError, match="block_size must match"):
        BlocksparseLinear(Layout([[1]], 48, any_block_size=True), block_size=32)
    with pytest.raises(ValueError, match="block_size must match"):
        BlocksparseMatMul(Layout([[1]], 16), block_size=32)
    for make, name in ((lambda: BlocksparseMatMul([[1]], 16, z_order=1), "z_order"),
                       (lambda: BlocksparseMatMul([[1]], 16, allow_tf32="yes"), "allow_tf32"),
                       (lambda: BlocksparseLinear([[1]], 16, bias="no"), "bias")):
        with pytest.raises(TypeError, match=f"{name} must be a bool"):
            make()


def test_linear_bad_input():
    lin = BlocksparseLinear([[1]], block_size=16)
    with pytest.raises(ValueError, match=r"\(\.\.\., 16\)"):
        lin(torch.randn(3, 17))


@pytest.mark.parametrize("grads", ["all", "bias-only"])
@pytest.mark.parametrize("lead", [(7,), (2, 3)], ids=["2d", "3d"])
def test_linear_bias_gradient_against_float64(rng, grads, lead):
    """The bias is added inside the product's autograd function: its gradient (and the others')
    against a float64 formula, also when only the bias wants one."""
    mask = random_layout(rng, 3, 4, 0.5, empty_cols=1)
    lin = BlocksparseLinear(mask, block_size=16, dtype=torch.float64)
    if grads == "bias-only":
        lin.weight.requires_grad_(False)
    x = torch.from_numpy(rng.standard_normal((*lead, lin.in_features))).requires_grad_(grads == "all")
    dy = torch.from_numpy(rng.standard_normal((*lead, lin.out_features)))
    lin(x).backward(dy)
    dense = lin.layout.dense(lin.weight.detach().numpy())
    x2, dy2 = x.detach().numpy().reshape(-1, lin.in_features), dy.numpy().reshape(-1, lin.out_features)
    assert rel_err(lin.bias.grad.numpy(), dy2.sum(0)) < 1e-12
    if grads == "all":
        assert rel_err(x.grad.numpy().reshape(x2.shape), dy2 @ dense.T) < 1e-12
        assert rel_err(lin.weight.grad.numpy(), lin.layout.pack(x2.T @ dy2)) < 1e-12
    else:
        assert lin.weight.grad is None and x.grad is None


@pytest.mark.parametrize("axis", [1, 0])
def test_twice_differentiable_on_the_reference_path(rng, monkeypatch, axis):
    """create_graph=True backwards (gradient penalties, meta learning) differentiate through the
    products' gradients: gradgradcheck in float64."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    bsmm = BlocksparseMatMul(random_layout(rng, 3, 2, 0.6, cover=True), 8, feature_axis=axis)
    x = torch.from_numpy(rng.standard_normal(bsmm.i_shape(5))).requires_grad_()
    w = torch.from_numpy(rng.standard_normal(bsmm.w_shape)).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x, w: bsmm(x, w), (x, w))


@pytest.mark.interpreter
def test_gradient_penalty_through_the_kernels(rng, monkeypatch):
    """The gradient of a gradient norm, through the kernels, against the dense float64 product's."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 3, 0.5, cover=True), 16)
    x = torch.from_numpy(rng.standard_normal(bsmm.i_shape(6))).float().requires_grad_()
    w = torch.from_numpy(rng.standard_normal(bsmm.w_shape) / 4).float().requires_grad_()
    r = torch.from_numpy(rng.standard_normal(bsmm.o_shape(6))).float()

    def penalty(y, x, w):
        gx, gw = torch.autograd.grad((y * r).sum(), (x, w), create_graph=True)
        return gx.square().sum() + (gw * gw).sum() + (y * y).sum()

    got = torch.autograd.grad(penalty(bsmm(x, w), x, w), (x, w))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bs, full = bsmm.block_size, torch.zeros(bsmm.layout.C, bsmm.layout.K, dtype=torch.float64)
    for b, (c, k) in enumerate(bsmm.layout.coords):  # the dense weight, independent of the kernels
        full[c * bs:(c + 1) * bs, k * bs:(k + 1) * bs] = w64[b]
    want = torch.autograd.grad(penalty(x64 @ full, x64, w64), (x64, w64))
    for g, ref in zip(got, want):
        assert rel_err(g.double().numpy(), ref.numpy()) < 1e-4


@pytest.mark.interpreter
@pytest.mark.parametrize("cols_in, cols_out", [(521, 528), (528, 521), (13, 13), (0, 16)])
def test_copy_rows_pads_with_zeros_or_cuts(rng, cols_in, cols_out):
    from blocksparse.torch._matmul.plan import copy_rows

    wide = torch.from_numpy(rng.standard_normal((9, cols_in + 7))).bfloat16()
    x = wide[:, 3:3 + cols_in]  # a row stride of its own, rows not 16-byte aligned
    y = copy_rows(x, cols_out)
    want = torch.zeros(9, cols_out, dtype=torch.bfloat16)
    keep = min(cols_in, cols_out)
    want[:, :keep] = x[:, :keep]
    assert y.is_contiguous() and y.shape == (9, cols_out) and torch.equal(y, want)


@pytest.mark.parametrize("bs, impls", [(1, ("auto", "portable", "dense")), (3, ("auto", "portable", "dense")),
                                       (48, ("auto", "portable", "dense", "kernels", "reference"))],
                         ids=["bs1", "bs3", "bs48"])
def test_linear_any_block_size(rng, bs, impls):
    """Block sizes the kernels do not take run the portable and dense paths (and the kernels on a
    refined layout where a kernel size divides them), as PixelflyLinear's do; float64 references."""
    mask = random_layout(rng, 4, 5, 0.5, empty_rows=1)
    for impl in impls:
        lin = BlocksparseLinear(mask, block_size=bs, dtype=torch.float64, impl=impl)
        x = torch.from_numpy(rng.standard_normal((3, 2, lin.in_features))).requires_grad_()
        y = lin(x)
        dense = torch.from_numpy(lin.layout.dense(lin.weight.detach().numpy()))
        assert rel_err(y, x.detach() @ dense + lin.bias.detach()) < 1e-12, impl
        dy = torch.from_numpy(rng.standard_normal(y.shape))
        y.backward(dy)
        assert rel_err(x.grad, dy @ dense.t()) < 1e-12, impl
    if bs < 8:
        with pytest.raises(ValueError, match="cannot run block size"):
            BlocksparseLinear(mask, block_size=bs, impl="kernels")


@pytest.mark.parametrize("axis", [0, 1])
def test_numpy_test_helpers_take_torch_tensors(rng, axis):
    """The original's numpy helpers on the PyTorch class (shared with TensorFlow's) accept tensors
    and agree with the op."""
    layout = np.array([[1, 0, 1], [0, 1, 1]])
    bsmm = BlocksparseMatMul(layout, block_size=8, feature_axis=axis)
    W = torch.randn(bsmm.w_shape, dtype=torch.float64, requires_grad=True)
    x = torch.randn(bsmm.i_shape(5), dtype=torch.float64, requires_grad=True)
    dy = torch.randn(bsmm.o_shape(5), dtype=torch.float64)
    y = bsmm(x, W)
    y.backward(dy)
    for got, want in ((y, bsmm.fprop_test(x, W)), (x.grad, bsmm.bprop_test(dy, W)), (W.grad, bsmm.updat_test(x, dy))):
        assert isinstance(want, np.ndarray) and want.dtype == np.float64
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-10, atol=1e-10)
    assert bsmm.updat_list == [(0, 0), (0, 2), (1, 1), (1, 2)]
    for dtype in (torch.bfloat16, torch.float16):  # 16-bit tensors: their values, exactly, in float64
        x16, w16 = x.detach().to(dtype), W.detach().to(dtype)
        want = bsmm.fprop_test(x16.double(), w16.double())
        np.testing.assert_array_equal(bsmm.fprop_test(x16, w16), want)
        np.testing.assert_array_equal(bsmm.l2_normalize_test(w16), bsmm.l2_normalize_test(w16.double()))
