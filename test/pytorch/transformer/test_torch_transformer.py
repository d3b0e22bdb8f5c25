"""blocksparse.torch.BlocksparseTransformer: attention values and gradients against float64 dense
attention with the same masks, every op and its gradients, the Triton path, torch.compile,
autocast, and bad input."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import attention as ref  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.torch import BlocksparseTransformer  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}



def _layout(rng, kind, heads, QB):
    if kind == "causal":
        return ref.causal_layout(QB), heads
    if kind == "shared":
        return ref.random_layout(rng, 1, QB, QB, 0.5, empty_rows=1)[0], heads
    return ref.random_layout(rng, heads, QB, QB, 0.5, empty_rows=1), None


def _attention(bst, q, k, v, do, scale, autoregress_at_key=None):
    """Run the chain and its backward; return (o, dq, dk, dv) and the inputs as the op saw them."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    w = bst.query_key_op(leaves[0], leaves[1])
    p = bst.masked_softmax(w, scale=scale, autoregress_at_key=autoregress_at_key)
    o = bst.weight_value_op(p, leaves[2])
    o.backward(do)
    return (o.detach(), *(t.grad for t in leaves))


def _check_attention(rng, bst, dtype, head_dim=8, batch=2, scale=0.35, autoregress_at_key=None, rel=1.0):
    q, k, v, do = (torch.from_numpy(a).to(DTYPES[dtype]) for a in ref.draw_attention(rng, bst, batch, head_dim))
    got = _attention(bst, q, k, v, do, scale, autoregress_at_key)
    want = ref.attention(bst.layout, *(x.double().numpy() for x in (q, k, v, do)), scale, bst.masks,
                         autoregress_at_key)
    for name, g, w in zip(("o", "dq", "dk", "dv"), got, want):
        assert g.dtype == DTYPES[dtype], name
        # three products and a softmax in a row, each rounding to dtype
        assert rel_error(g, w) < 3 * rel * tolerance(dtype), name
    return got


@pytest.mark.parametrize("kind", ["per-head", "shared", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["blocks", "callback"])
def test_attention_reference(rng, kind, masked):
    layout, heads = _layout(rng, kind, 3, 5)
    bst = BlocksparseTransformer(layout, 16, heads=heads, mask_callback=ref.diagonal_causal if masked else None)
    _check_attention(rng, bst, "float64")


@pytest.mark.parametrize("bs", [8, 16, 32, 64, 128])
def test_attention_block_sizes(rng, bs):
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 3, 2, 0.5), bs,
                                 mask_callback=lambda s, *_: rng.random(s) < 0.8)
    _check_attention(rng, bst, "float32", head_dim=5, batch=1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_attention_dtypes(rng, dtype):
    bst = BlocksparseTransformer(ref.causal_layout(4), 16, heads=2, mask_callback=ref.diagonal_causal)
    _check_attention(rng, bst, dtype)


@pytest.mark.parametrize("autoregress_at_key", [0, 20, 1000])
def test_autoregress_at_key(rng, autoregress_at_key):
    """Key kp stays visible to query qp where kp <= qp or kp < autoregress_at_key."""
    bst = BlocksparseTransformer(np.ones((3, 3)), 16, heads=2, mask_callback=lambda s, *_: rng.random(s) < 0.9)
    _check_attention(rng, bst, "float64", autoregress_at_key=autoregress_at_key)
    plain = BlocksparseTransformer(np.ones((3, 3)), 16, heads=2)  # without a callback too
    _check_attention(rng, plain, "float64", autoregress_at_key=autoregress_at_key)


def test_ctx_q_and_ctx_k_differ_and_values_have_their_own_head_dim(rng):
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 2, 5, 0.6), 16)
    q, k = (torch.randn(2, ctx, 2 * 4, dtype=torch.float64) for ctx in (bst.ctx_q, bst.ctx_k))
    v = torch.randn(2, bst.ctx_k, 2 * 7, dtype=torch.float64)
    y = bst.weight_value_op(bst.softmax(bst.query_key_op(q, k), 0.5), v)
    want = ref.nn(bst.layout, ref.softmax(bst.layout, ref.nt(bst.layout, q.numpy(), k.numpy()), 0.5), v.numpy())
    assert y.shape == (2, bst.ctx_q, 14) and rel_error(y, want) < 1e-12


def test_rows_that_keep_nothing_give_zeros(rng):
    """A query block without key blocks, an in-block mask that drops whole rows: zeros, never NaN,
    and zero gradients."""
    layout = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 1]])
    bst = BlocksparseTransformer(layout, 16, heads=1, mask_callback=lambda s, h, q, k, b: np.triu(np.ones(s), 1))
    x = torch.randn(bst.w_shape(2), dtype=torch.float64, requires_grad=True)
    y = bst.masked_softmax(x, scale=2.0)
    assert torch.isfinite(y).all()
    assert (y[:, :, 0, 15] == 0).all()  # the last row of block (0, 0) keeps nothing
    assert rel_error(y, ref.softmax(bst.layout, x.detach().numpy(), 2.0, bst.masks)) < 1e-12
    y.backward(torch.randn_like(y))
    assert torch.isfinite(x.grad).all() and (x.grad[:, :, 0, 15] == 0).all()
    o = bst.weight_value_op(y, torch.randn(2, 48, 8, dtype=torch.float64))
    assert (o[:, 16:32] == 0).all()  # query block 1 has no key block


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_a_kept_inf_or_nan_score_makes_its_row_nan(rng, monkeypatch, backend, bad):
    """As torch.softmax: a row holding a kept +inf or NaN score is NaN (never silently zeros); the
    other rows, and a row whose bad score is masked out, are untouched."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    bst = BlocksparseTransformer([[1, 0], [1, 1]], 16, heads=1, mask_callback=lambda s, h, q, k, b: np.tril(np.ones(s)))
    x = torch.randn(bst.w_shape(1))
    clean = bst.masked_softmax(x)
    x[0, 0, 0, 5, 2] = bad       # kept (below the diagonal)
    x[0, 0, 0, 7, 9] = bad       # masked out (above it)
    y = bst.masked_softmax(x)
    assert torch.isnan(y[0, 0, 0, 5]).all()
    rest = torch.ones_like(y, dtype=torch.bool)
    rest[0, 0, 0, 5] = False
    torch.testing.assert_close(y[rest], clean[rest], rtol=0, atol=0)


# ---------------------------------------------------------------- every op, every gradient

def _op_grads(fn, inputs, dout):
    leaves = [x.clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return out.detach(), [x.grad for x in leaves]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_products_and_their_gradients(rng, dtype):
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 3, 4, 0.5, empty_rows=1), 16)
    lay = bst.layout
    t = lambda shape: torch.from_numpy(rng.standard_normal(shape)).to(DTYPES[dtype])  # noqa: E731
    a, x = t((2, bst.ctx_q, 12)), t((2, bst.ctx_q, 12))
    b, w = t((2, bst.ctx_k, 12)), t(bst.w_shape(2))
    dc, dy_q, dy_k = t(bst.w_shape(2)), t((2, bst.ctx_q, 12)), t((2, bst.ctx_k, 12))
    n = lambda z: z.double().numpy()  # noqa: E731
    tol = tolerance(dtype)
    cases = {  # op, inputs, output gradient, (output, input gradients) in float64
        "nt": (bst.nt_op, (a, b), dc, (ref.nt(lay, n(a), n(b)), ref.nn(lay, n(dc), n(b)), ref.tn(lay, n(dc), n(a)))),
        "nn": (bst.nn_op, (w, b), dy_q, (ref.nn(lay, n(w), n(b)), ref.nt(lay, n(dy_q), n(b)),
                                         ref.tn(lay, n(w), n(dy_q)))),
        "tn": (bst.tn_op, (w, x), dy_k, (ref.tn(lay, n(w), n(x)), ref.nt(lay, n(x), n(dy_k)),
                                         ref.nn(lay, n(w), n(dy_k)))),
    }
    for name, (fn, inputs, dout, want) in cases.items():
        out, grads = _op_grads(fn, inputs, dout)
        for what, got, exp in zip(("out", "d0", "d1"), (out, *grads), want):
            assert got.dtype == DTYPES[dtype]
            assert rel_error(got, exp) < tol, (name, what)
    y, (dx,) = _op_grads(lambda z: bst.softmax(z, 0.5), (w,), dc)
    assert rel_error(dx, ref.softmax_grad(lay, n(dc), n(y), 0.5)) < tol


def test_second_order_gradients(rng):
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 2, 2, 0.6), 8)
    a = torch.randn(1, 16, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, 16, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(bst.w_shape(1), dtype=torch.float64, requires_grad=True)
    for op, inputs in ((bst.nt_op, (a, b)), (bst.nn_op, (w, b)), (bst.tn_op, (w, a))):
        assert torch.autograd.gradgradcheck(op, inputs, fast_mode=True)
    masked = BlocksparseTransformer(ref.causal_layout(2), 8, heads=2, mask_callback=ref.diagonal_causal)
    x = torch.randn(masked.w_shape(1), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: masked.masked_softmax(z, 0.7, autoregress_at_key=3), (x,),
                                    fast_mode=True)


def test_eager_calls_skip_the_dispatcher(rng):
    """An eager call that needs a gradient is one autograd node of its op's eager twin."""
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 2, 2, 0.6), 8)
    a = torch.randn(1, 16, 4, requires_grad=True)
    b = torch.randn(1, 16, 4)
    s = bst.nt_op(a, b)
    y = bst.masked_softmax(s, 0.5)
    names = [type(t.grad_fn).__name__ for t in (s, y, bst.nn_op(y, b), bst.tn_op(y, b))]
    assert names == ["BstNtFunctionBackward", "BstSoftmaxFunctionBackward", "BstNnFunctionBackward",
                     "BstTnFunctionBackward"]
    with torch.no_grad():
        assert bst.nt_op(a, b).grad_fn is None


def test_softmax_dtype_argument(rng):
    bst = BlocksparseTransformer(ref.causal_layout(2), 16, heads=1)
    x = torch.randn(bst.w_shape(2), dtype=torch.float32, requires_grad=True)
    y = bst.masked_softmax(x, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    assert rel_error(y, ref.softmax(bst.layout, x.detach().numpy())) < tolerance("bfloat16")
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_scores_with_float32_values(rng, dtype):
    """As TensorFlow's class (and the original's NN / TN): 16-bit probabilities times float32 values
    give float32; the probabilities' gradient comes back in their dtype."""
    bst = BlocksparseTransformer(ref.causal_layout(2), 16, heads=1)
    x = torch.randn(bst.w_shape(2), requires_grad=True)
    v = torch.randn(2, 32, 8, requires_grad=True)
    w = bst.masked_softmax(x, dtype=DTYPES[dtype])
    w.retain_grad()
    o = bst.weight_value_op(w, v)
    assert o.dtype == torch.float32 and bst.tn_op(w, torch.randn(2, 32, 8)).dtype == torch.float32
    assert rel_error(o, ref.nn(bst.layout, w.detach().double().numpy(), v.detach().double().numpy())) < 1e-5
    o.sum().backward()
    assert w.grad.dtype == DTYPES[dtype] and v.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    with pytest.raises(TypeError, match="w and v must have the same dtype"):
        bst.weight_value_op(w.detach().float(), v.detach().to(DTYPES[dtype]))


# ---------------------------------------------------------------- Triton, compile, autocast

@pytest.mark.interpreter
@pytest.mark.parametrize("dtype, shared", [("float32", False), ("bfloat16", True)], ids=["fp32", "bf16-shared"])
def test_triton_backend_through_the_class(rng, monkeypatch, dtype, shared):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    layout, heads = _layout(rng, "shared" if shared else "per-head", 2, 3)
    bst = BlocksparseTransformer(layout, 16, heads=heads, mask_callback=lambda s, *_: rng.random(s) < 0.8)
    # the interpreter rounds bfloat16 stores toward zero: twice the error of round-to-nearest
    _check_attention(rng, bst, dtype, autoregress_at_key=7, rel=2.0)


def test_torch_compile_fullgraph(rng):
    bst = BlocksparseTransformer(ref.causal_layout(3), 16, heads=2, mask_callback=ref.diagonal_causal)

    def attend(q, k, v):
        p = bst.masked_softmax(bst.query_key_op(q, k), scale=0.5, autoregress_at_key=4)
        return bst.weight_value_op(p, v)

    q, k, v = (torch.randn(2, 48, 2 * 8, requires_grad=True) for _ in range(3))
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v)
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    expect = attend(q, k, v)
    expect.square().sum().backward()
    torch.testing.assert_close(out, expect)
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, t.grad)


def test_torch_compile_with_a_symbolic_scale(rng):
    """``scale`` of ``masked_softmax`` from a dynamic shape, and as a float argument that changes
    between calls: traced whole, values as the eager calls'."""
    bst = BlocksparseTransformer(ref.causal_layout(3), 16, heads=2)

    def attend(q, k, v, scale):
        return bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), scale=scale), v)

    torch._dynamo.reset()
    by_shape = torch.compile(lambda q, k, v: attend(q, k, v, (q.shape[-1] // 2) ** -0.5), fullgraph=True,
                             backend="aot_eager", dynamic=True)
    by_arg = torch.compile(attend, fullgraph=True, backend="aot_eager")
    for width in (16, 32):
        q, k, v = (torch.randn(2, 48, width) for _ in range(3))
        torch.testing.assert_close(by_shape(q, k, v), attend(q, k, v, (width // 2) ** -0.5))
        for scale in (0.25, 0.5, 0.75):
            torch.testing.assert_close(by_arg(q, k, v, scale), attend(q, k, v, scale))


def test_softmax_of_transposed_scores(rng):
    """Scores and output gradients with transposed blocks: the softmax and its gradient come out
    contiguous, as the custom ops' fake functions say (torch.compile checks the strides)."""
    bst = BlocksparseTransformer(ref.causal_layout(2), 16, heads=2)
    shape = bst.query_key_op(torch.randn(2, 32, 16), torch.randn(2, 32, 16)).shape
    x = torch.randn(shape).transpose(-1, -2)
    p = bst.masked_softmax(x, scale=0.5)
    assert p.is_contiguous()
    g = torch.randn(p.shape).transpose(-1, -2).contiguous().transpose(-1, -2)
    x.requires_grad_()
    loss = torch.compile(lambda x: (bst.masked_softmax(x, scale=0.5) * g).sum(), fullgraph=True)(x)
    (dx,) = torch.autograd.grad(loss, (x,))
    (want,) = torch.autograd.grad((bst.masked_softmax(x, scale=0.5) * g).sum(), (x,))
    torch.testing.assert_close(dx, want)


def test_one_compiled_function_over_several_transformers(rng):
    """The same code compiled again for other layouts (dynamo recompiles it, with "automatic dynamic"
    integers) stays right: a transformer's layout is read where the compiler specialises it."""
    def attend(bst, q, k, v):
        return bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), scale=0.35), v)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    for blocks, bs, kind in ((3, 16, "causal"), (5, 16, "per-head"), (2, 32, "shared"), (3, 16, "causal")):
        layout, heads = _layout(rng, kind, 2, blocks)
        bst = BlocksparseTransformer(layout, bs, heads=heads)
        q, k, v, do = (torch.from_numpy(a).double() for a in ref.draw_attention(rng, bst, 2, 8))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = compiled(bst, *leaves)
        o.backward(do)
        want = ref.attention(bst.layout, *(x.numpy() for x in (q, k, v, do)), 0.35, None, None)
        for got, w in zip((o, *(t.grad for t in leaves)), want):
            assert rel_error(got, w) < 1e-10


def test_copies_register_their_own_state(rng):
    import copy
    import gc
    import pickle

    from blocksparse.torch._live import LIVE

    bst = BlocksparseTransformer(ref.causal_layout(3), 16, heads=2, mask_callback=ref.diagonal_causal)
    copied, unpickled = copy.deepcopy(bst), pickle.loads(pickle.dumps(bst))
    keys = {bst._live_key, copied._live_key, unpickled._live_key}
    assert len(keys) == 3 and copied._handle == unpickled._handle == bst._handle
    q, k, v = (torch.randn(1, 48, 16) for _ in range(3))
    want = bst.weight_value_op(bst.softmax(bst.query_key_op(q, k)), v)
    del bst
    gc.collect()
    assert len(keys & set(LIVE)) == 2
    for other in (copied, unpickled):
        torch.testing.assert_close(other.weight_value_op(other.softmax(other.query_key_op(q, k)), v), want)


def test_autocast_cpu(rng):
    bst = BlocksparseTransformer(ref.causal_layout(2), 16, heads=2)
    q, k, v = (torch.randn(2, 32, 16) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w = bst.query_key_op(q, k)
        y = bst.weight_value_op(bst.softmax(w), v)
    assert w.dtype == y.dtype == torch.bfloat16
    want = ref.nn(bst.layout, ref.softmax(bst.layout, ref.nt(bst.layout, q.numpy(), k.numpy())), v.numpy())
    assert rel_error(y, want) < 3 * tolerance("bfloat16")


def test_equal_layouts_share_a_handle(rng):
    layout = ref.random_layout(rng, 2, 3, 3, 0.5)
    a, b = BlocksparseTransformer(layout, 16), BlocksparseTransformer(layout.copy(), 16)
    c = BlocksparseTransformer(layout, 16, mask_callback=ref.diagonal_causal)
    assert a._handle == b._handle != c._handle
    assert "masked=True" in repr(c)


# ---------------------------------------------------------------- bad input

@pytest.fixture
def bst():
    return BlocksparseTransformer(ref.causal_layout(2), 16, heads=2)


@pytest.mark.parametrize("case", ref.BAD_QUERY_KEY)
def test_bad_query_key(bst, case):
    q_shape, k_shape, words = ref.BAD_QUERY_KEY[case]
    with pytest.raises(ValueError, match=words):
        bst.query_key_op(torch.randn(q_shape), torch.randn(k_shape))


def test_bad_types_and_dtypes(bst):
    q = torch.randn(2, 32, 8)
    with pytest.raises(TypeError, match="q and k must have the same dtype"):
        bst.query_key_op(q, q.double())
    with pytest.raises(TypeError, match="k must be floating point"):
        bst.query_key_op(q, q.int())
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        bst.query_key_op(q.numpy(), q)
    w = torch.randn(bst.w_shape(2))
    with pytest.raises(ValueError, match=r"w must have shape \(batch, heads, blocks, bs, bs\) = \('batch', 2, 3"):
        bst.weight_value_op(w[:, :, :2], q)
    with pytest.raises(ValueError, match="v must have shape"):
        bst.weight_value_op(w, torch.randn(2, 48, 8))
    with pytest.raises(TypeError, match="dtype must be"):
        bst.softmax(w, dtype=torch.int32)


@pytest.mark.parametrize("kwargs, err, words", [
    (dict(scale="2"), TypeError, "scale must be a real number"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(autoregress_at_key=-1), ValueError, "autoregress_at_key must be >= 0"),
    (dict(autoregress_at_key=2.5), TypeError, "autoregress_at_key must be an int"),
], ids=["scale-type", "scale-nan", "ar-negative", "ar-float"])
def test_bad_softmax_arguments(bst, kwargs, err, words):
    with pytest.raises(err, match=words):
        bst.masked_softmax(torch.randn(bst.w_shape(1)), **kwargs)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="heads must be given with a 2-D layout"):
        BlocksparseTransformer(np.ones((2, 2)), 16)
    with pytest.raises(ValueError, match="layout has 2 heads"):
        BlocksparseTransformer(np.ones((2, 2, 2)), 16, heads=3)
    with pytest.raises(ValueError, match="block_size must be one of"):
        BlocksparseTransformer(np.ones((2, 2)), 48, heads=1)
    with pytest.raises(ValueError, match=r"mask_callback must return an array of shape blk_shape = \(16, 16\)"):
        BlocksparseTransformer(np.ones((2, 2)), 16, heads=1, mask_callback=lambda *a: np.ones((16, 15)))


def _lower_diagonal_blocks(blk_shape, head, q_blk, k_blk, blk_id):
    return np.tril(np.ones(blk_shape)) if q_blk == k_blk else np.ones(blk_shape)


@pytest.mark.parametrize("autoregress_at_key", [None, 0])
@pytest.mark.parametrize("mask_callback", [None, _lower_diagonal_blocks], ids=["unmasked", "masked"])
def test_compiled_transform_of_a_fresh_transformer(rng, autoregress_at_key, mask_callback):
    """``torch.compile(torch.func.grad(f))`` traces a transformer's first call (no eager call
    before it to build its tables): the same gradient as the eager transform."""
    from torch.func import grad

    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=1, mask_callback=mask_callback)
    q = torch.from_numpy(rng.standard_normal((1, 32, 16))).float()

    def step(q):
        w = bst.masked_softmax(bst.query_key_op(q, q), scale=0.25, autoregress_at_key=autoregress_at_key)
        return bst.weight_value_op(w, q).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(grad(step), fullgraph=True, backend="aot_eager")(q)
    torch.testing.assert_close(compiled, grad(step)(q), rtol=0, atol=0)
