"""Acceptance: ``blocksparse.torch.BlocksparseTransformer`` as the README documents it, against
float64 numpy (CPU: the reference path; the Triton kernels through the interpreter on tiny shapes)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attention_cases import (CASES, DROP_ROWS, IDS, PRODUCTS, product_reference, product_shapes,  # noqa: E402
                             assert_all_raise, bad_calls, tril_callback)
from attention_reference import Ref  # noqa: E402

from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.torch import BlocksparseTransformer  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _t(a, dtype=torch.float64, grad=True):
    return torch.tensor(np.asarray(a), dtype=dtype, requires_grad=grad)


def _f64(t):
    return t.detach().double().numpy()


def _check_products(bst, R, op, rng, dtype, N=2, D=4):
    a_shape, b_shape, out_shape = product_shapes(bst, op, N, D)
    a, b = _t(rng.standard_normal(a_shape), dtype), _t(rng.standard_normal(b_shape), dtype)
    y = getattr(bst, op)(a, b)
    assert y.dtype == dtype and tuple(y.shape) == tuple(out_shape)
    gy = torch.tensor(rng.standard_normal(out_shape), dtype=dtype)
    y.backward(gy)
    for out, want in zip((y, a.grad, b.grad), product_reference(R, op, _f64(a), _f64(b), _f64(gy))):
        assert rel_error(out, want) < 2 * tolerance(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("op", PRODUCTS)
@pytest.mark.parametrize("case", CASES[:2], ids=IDS[:2])
def test_products(case, op, dtype, rng):
    _check_products(case.make(BlocksparseTransformer), case.ref(), op, rng, DTYPES[dtype])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("autoregress_at_key", [None, 0, 5], ids=["no-autoregress", "causal", "prefix-5"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masked_softmax(case, autoregress_at_key, dtype, rng):
    bst, R = case.make(BlocksparseTransformer), case.ref()
    dt = DTYPES[dtype]
    x = _t(3 * rng.standard_normal(bst.w_shape(2)), dt)
    y = bst.masked_softmax(x, scale=0.7, autoregress_at_key=autoregress_at_key)
    assert y.dtype == dt
    gy = torch.tensor(rng.standard_normal(bst.w_shape(2)), dtype=dt)
    y.backward(gy)
    want = R.softmax(_f64(x), 0.7, autoregress_at_key)
    tol = 2 * tolerance(dtype)
    assert rel_error(y, want) < tol
    assert rel_error(x.grad, R.softmax_grad(_f64(gy), want, 0.7)) < tol


def test_softmax_and_out_dtype(rng):
    case = CASES[0]
    bst, R = case.make(BlocksparseTransformer), case.ref()
    x = _t(rng.standard_normal(bst.w_shape(1)), torch.float32, grad=False)
    y = bst.softmax(x, scale=2.0)
    assert rel_error(y, R.softmax(_f64(x), 2.0, masked=False)) < 2e-5
    assert bst.masked_softmax(x.half(), dtype=torch.float32).dtype == torch.float32


def test_fully_masked_rows_are_zero(rng):
    bst, R = DROP_ROWS.make(BlocksparseTransformer), DROP_ROWS.ref()
    x = _t(rng.standard_normal(bst.w_shape(2)), torch.float32)
    y = bst.masked_softmax(x, autoregress_at_key=0)
    gy = torch.randn(y.shape)
    y.backward(gy)
    assert torch.all(y[:, :, :, ::2] == 0) and torch.all(x.grad[:, :, :, ::2] == 0)
    want = R.softmax(_f64(x), 1.0, 0)
    assert rel_error(y, want) < 2e-5
    assert rel_error(x.grad, R.softmax_grad(_f64(gy), want)) < 2e-5


def test_compile_fullgraph(rng):
    case = CASES[0]
    bst, R = case.make(BlocksparseTransformer), case.ref()
    q, k, v = (_t(rng.standard_normal(bst.q_shape(2, 8)), torch.float32) for _ in range(3))

    def attn(q, k, v):
        return bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), scale=0.5, autoregress_at_key=0), v)

    torch._dynamo.reset()
    y = torch.compile(attn, fullgraph=True, backend="aot_eager")(q, k, v)
    y.sum().backward()
    want = R.nn(R.softmax(R.nt(_f64(q), _f64(k)), 0.5, 0), _f64(v))
    assert rel_error(y, want) < 1e-5
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_autocast(rng):
    bst = CASES[0].make(BlocksparseTransformer)
    q = torch.tensor(rng.standard_normal(bst.q_shape(1, 8)), dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w = bst.query_key_op(q, q)
    assert w.dtype == torch.bfloat16
    assert rel_error(w, CASES[0].ref().nt(_f64(q), _f64(q))) < 2 * tolerance("bfloat16")


def test_same_numbers_as_tensorflow(rng):
    tf = pytest.importorskip("tensorflow")
    from blocksparse.transformer import BlocksparseTransformer as TFBST

    case = CASES[2]
    a, b = case.make(BlocksparseTransformer), case.make(TFBST)
    x = rng.standard_normal(a.w_shape(2)).astype(np.float32)
    ya = a.masked_softmax(torch.tensor(x), scale=0.3, autoregress_at_key=4).numpy()
    yb = b.masked_softmax(tf.constant(x), scale=0.3, autoregress_at_key=4).numpy()
    assert rel_error(ya, yb.astype(np.float64)) < 1e-5


@pytest.mark.interpreter
@pytest.mark.parametrize("op", ["query_key_op", "weight_value_op", "tn_op"])
def test_kernels_through_interpreter(op, rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    layout = np.array([[1, 0], [1, 1]])
    bst = BlocksparseTransformer(layout, block_size=16, heads=1)
    _check_products(bst, Ref(layout[None], 16), op, rng, torch.float32, N=1, D=16)


@pytest.mark.interpreter
def test_softmax_kernel_through_interpreter(rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")

    def callback(blk_shape, head, q_blk, k_blk, blk_id):
        m = np.random.default_rng([q_blk, k_blk]).random(blk_shape) < 0.7
        m[0] = q_blk != 1  # row 0 of query block 1 keeps nothing in that block
        return m

    layout = np.array([[1, 0], [1, 1]])
    bst = BlocksparseTransformer(layout, block_size=16, heads=1, mask_callback=callback)
    R = Ref(layout[None], 16, [[[callback((16, 16), 0, q, k, 0) for k in range(2)] for q in range(2)]])
    x = _t(rng.standard_normal(bst.w_shape(1)), torch.float32)
    y = bst.masked_softmax(x, scale=0.5, autoregress_at_key=3)
    gy = torch.randn(y.shape)
    y.backward(gy)
    want = R.softmax(_f64(x), 0.5, 3)
    assert rel_error(y, want) < 1e-5
    assert rel_error(x.grad, R.softmax_grad(_f64(gy), want, 0.5)) < 1e-5


def test_bad_call_args(rng):
    bst = BlocksparseTransformer(CASES[0].layout, block_size=8, heads=2, mask_callback=tril_callback)
    q = torch.randn(bst.q_shape(2, 8))
    w = torch.randn(bst.w_shape(2))
    assert_all_raise(bad_calls(bst, q, w) + [
        (lambda: bst.query_key_op(q, q.double()), TypeError, "dtype"),
        (lambda: bst.query_key_op(q.int(), q), TypeError, "q"),
        (lambda: bst.query_key_op(q.numpy(), q), TypeError, "q"),
        (lambda: bst.query_key_op(q, q[:1]), ValueError, "batch"),
        (lambda: bst.masked_softmax(w, dtype=torch.int32), TypeError, "dtype"),
    ])


def test_empty_batch():
    bst = CASES[0].make(BlocksparseTransformer)
    q, k, v = (torch.zeros(bst.q_shape(0, 8), requires_grad=True) for _ in range(3))
    w = bst.query_key_op(q, k)
    assert tuple(w.shape) == bst.w_shape(0)
    y = bst.weight_value_op(bst.masked_softmax(w, autoregress_at_key=0), v)
    assert tuple(y.shape) == bst.q_shape(0, 8)
    assert tuple(bst.tn_op(w, q).shape) == bst.k_shape(0, 8)
    y.sum().backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("dtype, want", [(torch.float16, torch.float16), (np.float32, torch.float32),
                                         ("bfloat16", torch.bfloat16)], ids=["torch", "numpy", "name"])
def test_softmax_dtype_forms(dtype, want, rng):
    bst = CASES[0].make(BlocksparseTransformer)
    x = torch.tensor(rng.standard_normal(bst.w_shape(1)), dtype=torch.float32)
    assert bst.masked_softmax(x, dtype=dtype).dtype == want


def test_documented_positional_and_keyword_forms(rng):
    layout = np.tril(np.ones((2, 2)))
    a = BlocksparseTransformer(layout, 8, 2, tril_callback, "attn")
    b = BlocksparseTransformer(layout=layout, block_size=8, heads=2, mask_callback=tril_callback, name="attn")
    q = torch.tensor(rng.standard_normal(a.q_shape(1, 8)))
    w1 = a.masked_softmax(a.query_key_op(q, q), 0.5, 0)
    w2 = b.masked_softmax(x=b.query_key_op(q=q, k=q, name="qk", bench=0), scale=0.5, autoregress_at_key=0, dtype=None)
    assert torch.equal(w1, w2)
    assert torch.equal(a.weight_value_op(w1, q), b.weight_value_op(w=w2, v=q))
