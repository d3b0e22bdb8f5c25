"""blocksparse.torch on a CUDA GPU: the Triton kernels (TMA and pointer paths) through the public
API against float64, torch.compile, autocast.  Skipped without a GPU."""
import pytest

torch = pytest.importorskip("torch")

from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul  # noqa: E402
from blocksparse.testing.matmul import check_torch_products, random_layout  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _check(bsmm, rng, n, dtype, tol=None):
    check_torch_products(bsmm, rng, n, DTYPES[dtype], "cuda", tol)


@pytest.mark.parametrize("n", [7, 257, 2048])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs", [16, 32, 64, 128])
def test_bf16_block_sizes(rng, bs, axis, n):
    mask = random_layout(rng, 1024 // bs, 768 // bs, 0.3, empty_rows=1, empty_cols=1)
    _check(BlocksparseMatMul(mask, bs, axis), rng, n, "bfloat16")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("n", [64, 2048])
@pytest.mark.parametrize("bs", [32, 128])
def test_other_dtypes(rng, dtype, n, bs):
    mask = random_layout(rng, 512 // bs, 1024 // bs, 0.4, empty_cols=1)
    _check(BlocksparseMatMul(mask, bs), rng, n, dtype)


def test_tf32_flag(rng):
    mask = random_layout(rng, 8, 8, 0.5)
    _check(BlocksparseMatMul(mask, 64, allow_tf32=True), rng, 512, "float32", tol=3e-3)


def test_block_size_8_reference_on_gpu(rng):
    _check(BlocksparseMatMul(random_layout(rng, 6, 5, 0.5), 8), rng, 33, "float32")


def test_unaligned_tokens_fall_back_to_pointer_kernels(rng):
    """(C, N) activations with N * 2 bytes not a multiple of 16: no tensor descriptors."""
    _check(BlocksparseMatMul(random_layout(rng, 4, 6, 0.5), 32, feature_axis=0), rng, 13, "bfloat16")


def test_linear_compiled_and_autocast(rng):
    lin = BlocksparseLinear(random_layout(rng, 8, 4, 0.5), block_size=64, device="cuda")
    x = torch.randn(4, 100, 512, device="cuda", requires_grad=True)
    compiled = torch.compile(lin, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = compiled(x)
        ref = lin(x)
    assert y.dtype == torch.bfloat16
    # the compiled graph may round the bias add differently: bfloat16 tolerances
    torch.testing.assert_close(y, ref, atol=4e-3, rtol=1.6e-2)
    y.float().square().mean().backward()
    assert torch.isfinite(lin.weight.grad).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("n", [1, 300, 20000])
def test_bias_gradient_column_sums(rng, dtype, n):
    """The layers' bias gradient (a row of ones times dy through cuBLAS for 16-bit dy, grown past its
    first 8192 tokens) against float64, both layouts, and after a larger call a smaller one still
    reads the right prefix of the cached row."""
    from blocksparse.testing import tolerance
    from blocksparse.torch._reduce import column_sums

    for rows in (n, 5):
        t = torch.from_numpy(rng.standard_normal((rows, 96))).to("cuda", DTYPES[dtype])
        ref = t.double().sum(0)
        for got in (column_sums(t), column_sums(t.t().contiguous().t())):
            assert got.dtype == t.dtype and got.shape == (96,)
            err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
            assert err <= tolerance(t.dtype), err
