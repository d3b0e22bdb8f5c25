"""The implicit path's filter gradient over the present blocks (``blocksparse/ops/conv/wgrad.py``)
through Triton's interpreter, against the float64 reference: every geometry of the test cases
(strides, dilations, padding modes, 1-D to 3-D), arbitrary channels, pixel splits, a half type, the
public op's backward where the rule takes it, and the rule."""
import numpy as np
import pytest
import torch

from blocksparse.ops.conv import wgrad
from blocksparse.testing import rel_error, tolerance
from blocksparse.testing.conv import CASES, conv_products, make_op, random_inputs
from blocksparse.torch import BlocksparseConv
from blocksparse.torch._conv import implicit as glue

pytestmark = pytest.mark.interpreter


@pytest.fixture
def kernels(monkeypatch):
    """The kernels serve CPU tensors (through the interpreter)."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")


def _wgrad(op, x, dy, dtype=torch.float32):
    t = op._tables.on(torch.device("cpu"))
    return glue.conv_implicit_wgrad(torch.from_numpy(x).to(dtype), torch.from_numpy(dy).to(dtype), op.spec, t,
                                    "ieee")


@pytest.mark.parametrize("layout", ["uniform", "random"])
@pytest.mark.parametrize("case", list(CASES))
def test_filter_gradient(rng, kernels, case, layout):
    op, ref = make_op(BlocksparseConv, rng, case, layout=layout, edge_bias=False)
    F, x, dy = random_inputs(rng, op)[:3]
    got = _wgrad(op, x, dy)
    assert got.shape == (op.spec.blocks.size,) and got.dtype == torch.float32
    assert rel_error(got, conv_products(ref, F, x, dy)[2].reshape(-1)) < 1e-5


@pytest.mark.parametrize("splits", [2, 5])
def test_pixel_splits(rng, kernels, monkeypatch, splits):
    """Programs splitting the pixels write rows of partial sums; their sum is the gradient."""
    monkeypatch.setattr(glue, "wgrad_splits", lambda *a: splits)
    op, ref = make_op(BlocksparseConv, rng, "2d-same-stride-dilate", layout="random", edge_bias=False)
    F, x, dy = random_inputs(rng, op, N=3)[:3]
    assert rel_error(_wgrad(op, x, dy), conv_products(ref, F, x, dy)[2].reshape(-1)) < 1e-5


@pytest.mark.parametrize("bm", [16, 128])
def test_pixel_tile_sizes(rng, kernels, monkeypatch, bm):
    """The launch reads its pixels a step (and warps, stages) from the module at call time; any
    tile size gives the same gradient."""
    monkeypatch.setattr(wgrad, "WGRAD_BM", bm)
    monkeypatch.setattr(wgrad, "WGRAD_WARPS", 8)
    op, ref = make_op(BlocksparseConv, rng, "2d-same-stride-dilate", layout="random", edge_bias=False)
    F, x, dy = random_inputs(rng, op, N=2)[:3]
    assert rel_error(_wgrad(op, x, dy), conv_products(ref, F, x, dy)[2].reshape(-1)) < 1e-5


def test_half_type(rng, kernels):
    op, ref = make_op(BlocksparseConv, rng, "2d-same-even-filter", layout="uniform", edge_bias=False)
    F, x, dy = random_inputs(rng, op)[:3]
    as16 = lambda a: torch.from_numpy(a).bfloat16().double().numpy()  # noqa: E731
    got = _wgrad(op, x, dy, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert rel_error(got, conv_products(ref, F, as16(x), as16(dy))[2].reshape(-1)) < tolerance("bfloat16")


def test_empty_batch(rng, kernels):
    op, _ = make_op(BlocksparseConv, rng, "1d-same-s2", layout="random", edge_bias=False)
    x, dy = np.zeros(op.i_shape(0), np.float32), np.zeros(op.o_shape(0), np.float32)
    assert torch.equal(_wgrad(op, x, dy), torch.zeros(op.spec.blocks.size))


@pytest.mark.parametrize("case", ["2d-same-even-filter", "2d-valid-stride-dilate"])
def test_the_op_takes_it_where_the_rule_says(rng, kernels, monkeypatch, case):
    """With the rule on, the public op's backward (Python path) computes the filter gradient with the
    kernel -- beside the transposed kernel's input gradient, or the dense one's of a strided layer."""
    monkeypatch.setattr(wgrad, "SPARSE_WGRAD_MAX_DENSITY", {1: 1.0})  # the test layouts' blocks are narrow
    calls = []
    kernel = glue.conv_implicit_wgrad
    monkeypatch.setattr(glue, "conv_implicit_wgrad", lambda *a: calls.append(1) or kernel(*a))
    op, ref = make_op(BlocksparseConv, rng, case, layout="random", edge_bias=False, path="implicit")
    F, x, dy = random_inputs(rng, op)[:3]
    Ft, xt = torch.tensor(F, requires_grad=True), torch.tensor(x, requires_grad=True)
    dx, dF = torch.autograd.grad(op(Ft, xt), (xt, Ft), torch.tensor(dy))
    assert calls == [1]
    _, dx_want, dF_want = conv_products(ref, F, x, dy)[:3]
    assert rel_error(dx, dx_want) < 1e-5 and rel_error(dF, dF_want) < 1e-5


def test_rule(monkeypatch):
    """Never by default (unmeasured); a table entry applies from its width up, to its density;
    ``BLOCKSPARSE_CONV_WGRAD`` overrides the table."""
    op = BlocksparseConv([(range(0, 32), range(0, 32)), (range(32, 64), range(32, 64))], TRS=(3, 3), DHW=(4, 4))
    plan, density = op.spec.implicit, op.spec.blocks.density
    assert not wgrad.worth_sparse_wgrad(plan, density)
    table = {32: 0.5, 64: 0.0}
    saved, wgrad.SPARSE_WGRAD_MAX_DENSITY = wgrad.SPARSE_WGRAD_MAX_DENSITY, table
    try:
        assert wgrad.worth_sparse_wgrad(plan, 0.5) and not wgrad.worth_sparse_wgrad(plan, 0.6)
        assert not wgrad.worth_sparse_wgrad(None, 0.1)
    finally:
        wgrad.SPARSE_WGRAD_MAX_DENSITY = saved
    monkeypatch.setenv("BLOCKSPARSE_CONV_WGRAD", "sparse")
    assert wgrad.worth_sparse_wgrad(plan, 1.0) and not wgrad.worth_sparse_wgrad(None, 0.1)
    monkeypatch.setenv("BLOCKSPARSE_CONV_WGRAD", "dense")
    monkeypatch.setattr(wgrad, "SPARSE_WGRAD_MAX_DENSITY", {1: 1.0})
    assert not wgrad.worth_sparse_wgrad(plan, 0.1)
    monkeypatch.setenv("BLOCKSPARSE_CONV_WGRAD", "fast")
    with pytest.raises(ValueError, match="BLOCKSPARSE_CONV_WGRAD must be one of"):
        wgrad.worth_sparse_wgrad(plan, 0.1)


def test_the_environment_takes_it_for_the_op(rng, kernels, monkeypatch):
    """``BLOCKSPARSE_CONV_WGRAD=sparse``: the public op's filter gradient from the kernel, as float64."""
    monkeypatch.setenv("BLOCKSPARSE_CONV_WGRAD", "sparse")
    calls = []
    kernel = glue.conv_implicit_wgrad
    monkeypatch.setattr(glue, "conv_implicit_wgrad", lambda *a: calls.append(1) or kernel(*a))
    op, ref = make_op(BlocksparseConv, rng, "3d-same", layout="uniform", edge_bias=False, path="implicit")
    F, x, dy = random_inputs(rng, op)[:3]
    Ft = torch.tensor(F, requires_grad=True)
    (dF,) = torch.autograd.grad(op(Ft, torch.tensor(x)), (Ft,), torch.tensor(dy))
    assert calls == [1] and rel_error(dF, conv_products(ref, F, x, dy)[2]) < 1e-5


def test_traced(rng, kernels, monkeypatch):
    """Under ``torch.compile`` the backward takes the kernel through its custom op."""
    monkeypatch.setenv("BLOCKSPARSE_CONV_WGRAD", "sparse")
    calls = []
    kernel = glue.conv_implicit_wgrad
    monkeypatch.setattr(glue, "conv_implicit_wgrad", lambda *a: calls.append(1) or kernel(*a))
    op, ref = make_op(BlocksparseConv, rng, "2d-same-even-filter", layout="random", edge_bias=False, path="implicit")
    F, x, dy = random_inputs(rng, op)[:3]
    fn = torch.compile(lambda F, x: op(F, x), fullgraph=True, backend="aot_eager")
    Ft, xt = torch.tensor(F, requires_grad=True), torch.tensor(x, requires_grad=True)
    dx, dF = torch.autograd.grad(fn(Ft, xt), (xt, Ft), torch.tensor(dy))
    _, dx_want, dF_want = conv_products(ref, F, x, dy)[:3]
    assert calls and rel_error(dx, dx_want) < 1e-5 and rel_error(dF, dF_want) < 1e-5
