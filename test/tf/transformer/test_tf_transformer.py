"""BlocksparseTransformer on TensorFlow: attention values and gradients against float64 dense
attention with the same masks in eager mode, ``tf.function`` with an unknown batch and
``tf.compat.v1`` graphs; every op and its gradients; the original test's flow; bad input."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.testing import attention as ref
from blocksparse.testing import rel_error, tolerance
from blocksparse.transformer import BlocksparseTransformer, clear_bst_constants

DTYPES = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}



def _chain(bst, q, k, v, scale, autoregress_at_key):
    return bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), scale, autoregress_at_key), v)


def _eager(bst, inputs, dtype, scale, ar):
    q, k, v, do = (tf.cast(t, dtype) for t in inputs)
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        o = _chain(bst, q, k, v, scale, ar)
    return (o, *tape.gradient(o, [q, k, v], output_gradients=do))


def _function(bst, inputs, dtype, scale, ar):
    spec = [tf.TensorSpec([None, *t.shape[1:]], tf.float32) for t in inputs]

    @tf.function(input_signature=spec)
    def step(q, k, v, do):
        assert q.shape[0] is None  # the batch really is unknown here
        return _eager(bst, (q, k, v, do), dtype, scale, ar)

    out = step(*inputs)
    step(*(t[:1] for t in inputs))  # another batch size through the same trace
    assert step.experimental_get_tracing_count() == 1
    return out


def _graph(bst, inputs, dtype, scale, ar):
    with tf.Graph().as_default():
        holders = [tf.compat.v1.placeholder(tf.float32, [None, *t.shape[1:]]) for t in inputs]
        q, k, v, do = (tf.cast(t, dtype) for t in holders)
        o = _chain(bst, q, k, v, scale, ar)
        grads = tf.gradients(o, [q, k, v], grad_ys=do)
        with tf.compat.v1.Session() as sess:
            return sess.run([o, *grads], dict(zip(holders, inputs)))


MODES = {"eager": _eager, "function": _function, "graph": _graph}


def check_attention(rng, bst, mode="eager", dtype="float32", head_dim=8, batch=2, scale=0.35,
                    autoregress_at_key=None):
    inputs = [a.astype(np.float32) for a in ref.draw_attention(rng, bst, batch, head_dim)]
    got = MODES[mode](bst, inputs, DTYPES[dtype], scale, autoregress_at_key)
    if mode != "graph":
        assert all(t.dtype == DTYPES[dtype] for t in got)
        got = [tf.cast(t, tf.float64).numpy() for t in got]
    # the reference sees the inputs rounded to dtype, as the op did
    seen = [tf.cast(tf.cast(t, DTYPES[dtype]), tf.float64).numpy() for t in inputs]
    want = ref.attention(bst.layout, *seen, scale, bst.masks, autoregress_at_key)
    for name, g, w in zip(("o", "dq", "dk", "dv"), got, want):
        # three products and a softmax in a row, each rounding to dtype
        assert rel_error(g, w) < 3 * tolerance(dtype), name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["per-head", "shared-causal"])
def test_attention_modes(rng, mode, kind):
    if kind == "per-head":
        bst = BlocksparseTransformer(ref.random_layout(rng, 3, 4, 4, 0.5, empty_rows=1), 16,
                                     mask_callback=lambda s, *_: rng.random(s) < 0.8)
    else:
        bst = BlocksparseTransformer(ref.causal_layout(4), 16, heads=2, mask_callback=ref.diagonal_causal)
    check_attention(rng, bst, mode, autoregress_at_key=9 if kind == "per-head" else None)


@pytest.mark.parametrize("bs", [8, 16, 32, 64, 128])
def test_block_sizes(rng, bs):
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 3, 2, 0.5), bs, mask_callback=ref.diagonal_causal)
    check_attention(rng, bst, head_dim=5, batch=1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtypes(rng, dtype):
    bst = BlocksparseTransformer(ref.causal_layout(3), 16, heads=2, mask_callback=ref.diagonal_causal)
    check_attention(rng, bst, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_products_and_their_gradients(rng, dtype):
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 3, 4, 0.5, empty_rows=1), 16)
    lay = bst.layout
    t = lambda shape: tf.cast(rng.standard_normal(shape), DTYPES[dtype])  # noqa: E731
    n = lambda z: tf.cast(z, tf.float64).numpy()  # noqa: E731
    a, x, b = t((2, bst.ctx_q, 12)), t((2, bst.ctx_q, 12)), t((2, bst.ctx_k, 12))
    w, dc, dy_q, dy_k = t(bst.w_shape(2)), t(bst.w_shape(2)), t((2, bst.ctx_q, 12)), t((2, bst.ctx_k, 12))
    cases = {
        "nt": (bst.nt_op, (a, b), dc, (ref.nt(lay, n(a), n(b)), ref.nn(lay, n(dc), n(b)), ref.tn(lay, n(dc), n(a)))),
        "nn": (bst.nn_op, (w, b), dy_q, (ref.nn(lay, n(w), n(b)), ref.nt(lay, n(dy_q), n(b)),
                                         ref.tn(lay, n(w), n(dy_q)))),
        "tn": (bst.tn_op, (w, x), dy_k, (ref.tn(lay, n(w), n(x)), ref.nt(lay, n(x), n(dy_k)),
                                         ref.nn(lay, n(w), n(dy_k)))),
    }
    for name, (fn, inputs, dout, want) in cases.items():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = fn(*inputs)
        grads = tape.gradient(out, inputs, output_gradients=dout)
        for what, got, exp in zip(("out", "d0", "d1"), (out, *grads), want):
            assert got.dtype == DTYPES[dtype]
            assert rel_error(n(got), exp) < tolerance(dtype), (name, what)
    with tf.GradientTape() as tape:
        tape.watch(w)
        y = bst.softmax(w, 0.5)
    dx = tape.gradient(y, w, output_gradients=dc)
    assert rel_error(n(dx), ref.softmax_grad(lay, n(dc), n(y), 0.5)) < tolerance(dtype)


def test_rows_that_keep_nothing_give_zeros(rng):
    layout = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 1]])
    bst = BlocksparseTransformer(layout, 16, heads=1, mask_callback=lambda s, h, q, k, b: np.triu(np.ones(s), 1))
    x = tf.constant(rng.standard_normal(bst.w_shape(2)), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = bst.masked_softmax(x, scale=2.0)
    dx = tape.gradient(y, x, output_gradients=tf.ones_like(y))
    assert np.isfinite(y.numpy()).all() and np.isfinite(dx.numpy()).all()
    assert (y.numpy()[:, :, 0, 15] == 0).all() and (dx.numpy()[:, :, 0, 15] == 0).all()
    assert rel_error(y, ref.softmax(bst.layout, x.numpy(), 2.0, bst.masks)) < tolerance("float32")
    o = bst.weight_value_op(y, tf.ones([2, 48, 8]))
    assert (o.numpy()[:, 16:32] == 0).all()  # query block 1 has no key block


def test_tensor_scale_and_autoregress_at_key(rng):
    """A scale variable gets its gradient; autoregress_at_key may be a tensor inside tf.function."""
    bst = BlocksparseTransformer(np.ones((3, 3)), 16, heads=2, mask_callback=lambda s, *_: rng.random(s) < 0.9)
    x = rng.standard_normal(bst.w_shape(2))
    dy = rng.standard_normal(bst.w_shape(2))
    scale = tf.Variable(0.6, dtype=tf.float32)

    @tf.function
    def step(key):
        with tf.GradientTape() as tape:
            y = bst.masked_softmax(tf.constant(x, tf.float32), scale, autoregress_at_key=key)
        return y, tape.gradient(y, scale, output_gradients=tf.constant(dy, tf.float32))

    y, ds = step(tf.constant(20))
    assert rel_error(y, ref.softmax(bst.layout, x, 0.6, bst.masks, 20)) < tolerance("float32")
    loss = lambda s: (ref.softmax(bst.layout, x, s, bst.masks, 20) * dy).sum()  # noqa: E731
    numeric = (loss(0.6 + 1e-6) - loss(0.6 - 1e-6)) / 2e-6
    assert abs(float(ds) - numeric) < 1e-4 * max(1.0, abs(numeric))


@pytest.mark.parametrize("key", [2**31, 2**32 + 5, 10**12])
def test_autoregress_at_key_past_int32_sees_every_key(rng, key):
    """A key of 2**31 or more (an int, or an int64 tensor) lies past every key, as any key past the
    last does: no key is masked (it must not wrap in the int32 the op takes)."""
    bst = BlocksparseTransformer(np.ones((3, 3)), 16, heads=2)
    x = rng.standard_normal(bst.w_shape(2))
    want = ref.softmax(bst.layout, x, 0.5, bst.masks, None)
    for value in (key, tf.constant(key, tf.int64)):
        y = bst.masked_softmax(tf.constant(x, tf.float32), 0.5, autoregress_at_key=value)
        assert rel_error(y, want) < tolerance("float32")


def test_second_order_gradient(rng):
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 2, 2, 0.6), 8)
    a, b = (tf.constant(rng.standard_normal((1, 16, 4)), tf.float32) for _ in range(2))
    with tf.GradientTape() as outer:
        outer.watch(b)
        with tf.GradientTape() as inner:
            inner.watch(a)
            s = tf.reduce_sum(tf.square(bst.nt_op(a, b)))
        total = tf.reduce_sum(inner.gradient(s, a))
    dab = outer.gradient(total, b)
    # s = sum (A Bᵀ)² on the blocks: dA = 2 W B with W the dense scores, d(sum dA)/dB by float64 formula
    an, bn = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    lay = bst.layout

    def total_da(bv):
        return (2 * ref.nn(lay, ref.nt(lay, an, bv), bv)).sum()
    assert rel_error(dab, _numeric_gradient(total_da, bn, 1e-5)) < 1e-4


def _numeric_gradient(f, x, eps):
    """Central differences of the scalar ``f`` at every element of ``x`` (float64)."""
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[idx] = eps
        num[idx] = (f(x + step) - f(x - step)) / (2 * eps)
    return num


def test_second_order_gradient_of_the_softmax(rng):
    bst = BlocksparseTransformer(ref.causal_layout(2), 8, heads=2, mask_callback=ref.diagonal_causal)
    x, gy, e = (rng.standard_normal(bst.w_shape(1)) for _ in range(3))
    xt = tf.constant(x, tf.float32)
    with tf.GradientTape() as outer:
        outer.watch(xt)
        with tf.GradientTape() as inner:
            inner.watch(xt)
            loss = tf.reduce_sum(bst.masked_softmax(xt, scale=0.7) * gy)
        total = tf.reduce_sum(inner.gradient(loss, xt) * e)
    got = outer.gradient(total, xt)

    def first(xv):   # d loss / dx . e in float64
        return (ref.softmax_grad(bst.layout, gy, ref.softmax(bst.layout, xv, 0.7, bst.masks), 0.7) * e).sum()
    assert rel_error(got, _numeric_gradient(first, x, 1e-6)) < 1e-4


def test_xla_jit_compile(rng):
    bst = BlocksparseTransformer(ref.causal_layout(3), 16, heads=2, mask_callback=ref.diagonal_causal)
    q, k, v = (tf.constant(rng.standard_normal((2, 48, 16)), tf.float32) for _ in range(3))
    attend = tf.function(lambda q, k, v: _chain(bst, q, k, v, 0.5, None), jit_compile=True)
    want = ref.attention(bst.layout, q.numpy(), k.numpy(), v.numpy(), np.zeros((2, 48, 16)), 0.5, bst.masks)[0]
    assert rel_error(attend(q, k, v), want) < tolerance("float32")


def test_same_numbers_as_torch(rng):
    torch = pytest.importorskip("torch")
    from blocksparse.torch import BlocksparseTransformer as TorchTransformer

    layout = ref.random_layout(rng, 2, 3, 3, 0.5, empty_rows=1)
    callback = lambda s, h, q, k, b: np.tril(np.ones(s)) if (q + k + h) % 2 else np.ones(s)  # noqa: E731
    tf_bst = BlocksparseTransformer(layout, 16, mask_callback=callback)
    pt_bst = TorchTransformer(layout, 16, mask_callback=callback)
    q, k, v = (rng.standard_normal((2, 48, 2 * 8)).astype(np.float32) for _ in range(3))
    tf_out = _chain(tf_bst, *(tf.constant(t) for t in (q, k, v)), 0.4, 11).numpy()
    pt_out = _chain(pt_bst, *(torch.from_numpy(t) for t in (q, k, v)), 0.4, 11).numpy()
    np.testing.assert_allclose(tf_out, pt_out, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the original test's flow

def test_original_sparse_flow_in_a_v1_graph(rng):
    """The original package's sparse transformer test, as its users wrote it (placeholders,
    tf.gradients with grad_ys, the object's numpy *_test helpers as the oracle)."""
    batch, heads, ctx, state, bsize = 2, 2, 6, 16, 16
    scale = 1.0 / np.sqrt(state / heads)
    layout = np.ones([heads, ctx, ctx], dtype=bool)
    for q, k in np.ndindex(ctx, ctx):
        if k > q:
            layout[:, q, k] = 0
    bst = BlocksparseTransformer(layout, block_size=bsize, mask_callback=ref.diagonal_causal)
    shape = (batch, ctx * bsize, heads * state)
    cpuQ, cpuK, cpuV, cpuE = (rng.uniform(-1.0, 1.0, shape).astype(np.float16).astype(np.float32)
                              for _ in range(4))
    with tf.Graph().as_default():
        q, k, v, e = (tf.compat.v1.placeholder(tf.float32, shape) for _ in range(4))
        w = bst.query_key_op(q, k)
        a = bst.masked_softmax(w, scale=scale)
        y = bst.weight_value_op(a, v)
        dq, dk, dv = tf.gradients(y, [q, k, v], e)
        with tf.compat.v1.Session() as sess:
            w, a, y, dq, dk, dv = sess.run([w, a, y, dq, dk, dv], {q: cpuQ, k: cpuK, v: cpuV, e: cpuE})
    W = bst.nt_test(cpuQ, cpuK)
    A = bst.masked_softmax_test(W, scale=scale)
    Y = bst.nn_test(A, cpuV)
    DV = bst.tn_test(A, cpuE)
    DW = bst.masked_softmax_grad_test(bst.nt_test(cpuE, cpuV), A, scale=scale)
    DQ = bst.nn_test(DW, cpuK)
    DK = bst.tn_test(DW, cpuQ)
    for name, got, want in [("W", w, W), ("A", a, A), ("Y", y, Y), ("DV", dv, DV), ("DK", dk, DK), ("DQ", dq, DQ)]:
        assert rel_error(got, want) < 1e-5, name
    clear_bst_constants()  # the original's cache reset, kept as a no-op


def test_original_dense_flow_matches_dense_attention(rng):
    """A full layout with the unmasked softmax is dense attention."""
    batch, heads, state, bsize, ctx = 2, 2, 8, 8, 4
    bst = BlocksparseTransformer(np.ones([heads, ctx, ctx], dtype=bool), block_size=bsize)
    q, k, v = (tf.constant(rng.standard_normal((batch, ctx * bsize, heads * state)), tf.float32) for _ in range(3))
    y = bst.weight_value_op(bst.softmax(bst.query_key_op(q, k), scale=0.3), v)
    split = lambda t: tf.transpose(tf.reshape(t, [batch, ctx * bsize, heads, state]), [0, 2, 1, 3])  # noqa: E731
    dense = tf.matmul(tf.nn.softmax(0.3 * tf.matmul(split(q), split(k), transpose_b=True)), split(v))
    dense = tf.reshape(tf.transpose(dense, [0, 2, 1, 3]), [batch, ctx * bsize, heads * state])
    assert rel_error(y, dense) < tolerance("float32")


def test_attributes_and_helpers():
    bst = BlocksparseTransformer(np.array([[1, 0], [1, 1]]), block_size=32, heads=4, name="attn")
    assert (bst.blk_size, bst.heads, bst.lut_heads, bst.blocks, bst.ctx_blks_q, bst.ctx_blks_k) == (32, 4, 1, 3, 2, 2)
    assert bst.block_coord(2) == (1, 1) and bst.nt_list == [[(0, 0), (1, 0), (1, 1)]]
    assert bst.w_shape(None) == (None, 4, 3, 32, 32) and bst.q_shape(2, 8) == (2, 64, 8)
    assert "name='attn'" in repr(bst)
    import blocksparse  # the original's `import blocksparse as bs; bs.BlocksparseTransformer(...)`
    assert blocksparse.BlocksparseTransformer is BlocksparseTransformer


# ---------------------------------------------------------------- bad input and backends

@pytest.fixture
def bst():
    return BlocksparseTransformer(ref.causal_layout(2), 16, heads=2)


@pytest.mark.parametrize("case", ref.BAD_QUERY_KEY)
def test_bad_query_key(bst, case):
    q_shape, k_shape, words = ref.BAD_QUERY_KEY[case]
    with pytest.raises(ValueError, match=words):
        bst.query_key_op(tf.zeros(q_shape), tf.zeros(k_shape))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_scores_with_float32_activations(rng, dtype):
    """As the original's NN / TN ops took them: 16-bit probabilities times float32 values (the
    softmax's ``dtype=`` then ``weight_value_op``), float32 out, the scores' gradient in their dtype."""
    bst = BlocksparseTransformer(ref.random_layout(rng, 2, 3, 4, 0.5), 16)
    lay, dt = bst.layout, DTYPES[dtype]
    n = lambda z: tf.cast(z, tf.float64).numpy()  # noqa: E731
    x = tf.constant(rng.standard_normal(bst.w_shape(2)), tf.float32)
    v, q = (tf.constant(rng.standard_normal((2, c, 12)), tf.float32) for c in (bst.ctx_k, bst.ctx_q))
    do = tf.constant(rng.standard_normal((2, bst.ctx_q, 12)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, v])
        w = bst.masked_softmax(x, 0.5, dtype=dt)
        o = bst.weight_value_op(w, v)
        k = bst.tn_op(w, q)
    assert w.dtype == dt and o.dtype == tf.float32 and k.dtype == tf.float32
    assert rel_error(n(o), ref.nn(lay, n(w), n(v))) < 1e-5 and rel_error(n(k), ref.tn(lay, n(w), n(q))) < 1e-5
    dw = tape.gradient(o, w, output_gradients=do)
    assert dw.dtype == dt and rel_error(n(dw), ref.nt(lay, n(do), n(v))) < tolerance(dt)
    assert tape.gradient(o, v, output_gradients=do).dtype == tf.float32
    with pytest.raises(TypeError, match="w and v must have the same dtype"):
        bst.weight_value_op(tf.cast(w, tf.float32), tf.cast(v, dt))   # float32 scores, 16-bit values: no


def test_bad_types(bst):
    q = tf.zeros([2, 32, 8])
    with pytest.raises(TypeError, match="q and k must have the same dtype"):
        bst.query_key_op(q, tf.zeros([2, 32, 8], tf.float16))
    with pytest.raises(TypeError, match="k must have dtype float32, float16 or bfloat16"):
        bst.query_key_op(q, tf.zeros([2, 32, 8], tf.int32))
    with pytest.raises(ValueError, match=r"w must have shape \(batch, heads, blocks, bs, bs\)"):
        bst.weight_value_op(tf.zeros([2, 2, 2, 16, 16]), q)
    with pytest.raises(TypeError, match="dtype must be one of float32, float16 or bfloat16"):
        bst.softmax(tf.zeros(bst.w_shape(1)), dtype=tf.int32)
    with pytest.raises(TypeError, match="scale must be a real number"):
        bst.softmax(tf.zeros(bst.w_shape(1)), scale="1")
    with pytest.raises(TypeError, match="autoregress_at_key must be an int or a scalar integer tensor"):
        bst.masked_softmax(tf.zeros(bst.w_shape(1)), autoregress_at_key=tf.constant(1.0))
    with pytest.raises(TypeError, match="bench must be an int"):
        bst.query_key_op(q, q, bench="yes")
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        BlocksparseTransformer(np.ones((1, 1, 1)), 16, name=3)


def test_unknown_sizes_are_checked_when_the_graph_runs(bst):
    spec = tf.TensorSpec([None, None, None], tf.float32)
    attend = tf.function(lambda q, k: bst.query_key_op(q, k), input_signature=[spec, spec])
    assert attend(tf.ones([1, 32, 4]), tf.ones([1, 32, 4])).shape == bst.w_shape(1)
    for q_shape, k_shape, words in [((1, 30, 4), (1, 32, 4), "q must have shape .*dimension 1 must be 32"),
                                    ((1, 32, 3), (1, 32, 3), "multiple of heads = 2"),
                                    ((1, 32, 4), (2, 32, 4), "same batch size"),
                                    ((1, 32, 4), (1, 32, 6), "same features")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=words):
            attend(tf.ones(q_shape), tf.ones(k_shape))


def test_backend_choice(bst, monkeypatch):
    from blocksparse._tf.dispatch import BackendUnavailableError
    from blocksparse._tf.transformer import backend

    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    assert backend.select(16, tf.float32) is backend.REFERENCE
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the error below is for machines without a GPU")
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(BackendUnavailableError, match="TensorFlow sees no GPU"):
        bst.query_key_op(tf.zeros([1, 32, 32]), tf.zeros([1, 32, 32]))   # head_dim 16
    with pytest.raises(BackendUnavailableError, match="TensorFlow sees no GPU"):
        bst.softmax(tf.zeros(bst.w_shape(1)))
    # no kernels for block size 8, nor for head dimensions that are no multiple of 16: silent
    assert backend.select(8, tf.float32) is backend.REFERENCE
    assert bst.query_key_op(tf.zeros([1, 32, 4]), tf.zeros([1, 32, 4])).shape == bst.w_shape(1)
