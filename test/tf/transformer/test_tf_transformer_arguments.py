"""Arguments of the TensorFlow ``BlocksparseTransformer`` as users pass them: sizes unknown when the
op is built are refused under XLA too (its compiled assertions are nothing), scalar tensors of
unknown rank are checked when the graph runs, Keras 3 variables are tensors, op names are checked,
and what the softmax drops never reaches the gradient of a tensor ``scale``."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from blocksparse.testing import rel_error  # noqa: E402
from blocksparse.transformer import BlocksparseTransformer  # noqa: E402

S = tf.TensorSpec


@pytest.fixture
def bst():
    return BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=8, heads=2)  # ctx 16, 3 blocks


@pytest.mark.parametrize("jit", [True, False], ids=["xla", "graph"])
def test_wrong_sizes_raise_under_xla_too(bst, rng, jit):
    qk = tf.function(lambda q, k: bst.query_key_op(q, k), jit_compile=jit, input_signature=[S([None] * 3)] * 2)
    sm = tf.function(lambda w: bst.masked_softmax(w), jit_compile=jit, input_signature=[S([None] * 5)])
    wv = tf.function(lambda w, v: bst.weight_value_op(w, v), jit_compile=jit,
                     input_signature=[S([None] * 5), S([None] * 3)])
    t = lambda *shape: tf.constant(rng.standard_normal(shape), tf.float32)  # noqa: E731
    q, k = t(1, 16, 4), t(1, 16, 4)
    w = qk(q, k)
    np.testing.assert_allclose(w, bst.query_key_op(q, k), rtol=1e-5, atol=1e-6)  # the right sizes run
    assert sm(w).shape == w.shape and wv(w, k).shape == (1, 16, 4)
    for call, args in ((qk, (q, t(1, 24, 4))), (qk, (t(2, 16, 4), k)), (qk, (q, t(1, 16, 6))),
                       (qk, (t(1, 16, 3), t(1, 16, 3))), (sm, (t(1, 2, 6, 8, 8),)), (wv, (w, t(1, 24, 4))),
                       (wv, (w, t(2, 16, 4)))):
        with pytest.raises(tf.errors.InvalidArgumentError):
            call(*args)


def test_scalars_of_unknown_rank_are_checked_when_the_graph_runs(bst, rng):
    x = tf.constant(rng.standard_normal((1, 2, 3, 8, 8)), tf.float32)
    by_scale = tf.function(lambda x, s: bst.masked_softmax(x, scale=s), input_signature=[S([None] * 5), S(None)])
    by_key = tf.function(lambda x, a: bst.masked_softmax(x, autoregress_at_key=a),
                         input_signature=[S([None] * 5), S(None, tf.int32)])
    np.testing.assert_allclose(by_scale(x, tf.constant(0.3)), bst.masked_softmax(x, scale=0.3), rtol=1e-6)
    np.testing.assert_allclose(by_key(x, tf.constant(2)), bst.masked_softmax(x, autoregress_at_key=2), rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scale must be a scalar"):
        by_scale(x, tf.linspace(0.1, 2.0, 8))
    with pytest.raises(tf.errors.InvalidArgumentError, match="autoregress_at_key must be a scalar"):
        by_key(x, tf.range(8))


def test_keras_variables_are_scalar_tensors(rng):
    keras = pytest.importorskip("keras")
    from blocksparse import ew

    bst = BlocksparseTransformer(np.ones((1, 1)), block_size=8, heads=1)
    w = tf.constant(rng.standard_normal((1, 1, 1, 8, 8)), tf.float32)
    scale = keras.Variable(0.5)
    with tf.GradientTape() as tape:
        y = bst.masked_softmax(w, scale=scale)
        loss = tf.reduce_sum(y * tf.range(8, dtype=tf.float32))
    np.testing.assert_allclose(y, bst.masked_softmax(w, scale=0.5), rtol=1e-6)
    with tf.GradientTape() as ref_tape:
        s = tf.Variable(0.5)
        ref_loss = tf.reduce_sum(bst.masked_softmax(w, scale=s) * tf.range(8, dtype=tf.float32))
    np.testing.assert_allclose(tape.gradient(loss, scale.value), ref_tape.gradient(ref_loss, s), rtol=1e-5)
    x = tf.ones([64, 64])
    kept = ew.dropout(x, keep_prob=keras.Variable(0.5))[0]
    assert set(np.unique(kept.numpy())) <= {0.0, 2.0}


@pytest.mark.parametrize("name", [3, ""])
def test_op_names_are_checked(bst, name):
    q = tf.ones([1, 16, 4])
    for call in (lambda: bst.query_key_op(q, q, name=name),
                 lambda: bst.weight_value_op(bst.query_key_op(q, q), q, name=name)):
        with pytest.raises(TypeError, match="name must be a non-empty str"):
            call()


@pytest.mark.parametrize("dropped", [np.inf, -np.inf, np.nan])
def test_what_the_softmax_drops_never_reaches_the_scale_gradient(rng, dropped):
    bst = BlocksparseTransformer(np.ones((1, 1)), block_size=8, heads=1)
    x = rng.standard_normal((1, 1, 1, 8, 8)).astype(np.float32)
    grads = []
    for value in (float(rng.standard_normal()), dropped):
        x[0, 0, 0, 0, 7] = value          # query 0, key 7: dropped by autoregress_at_key=0
        xt, s = tf.constant(x), tf.Variable(0.7)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            y = bst.masked_softmax(xt, scale=s, autoregress_at_key=0)
            loss = tf.reduce_sum(y * y)
        grads.append((y, *tape.gradient(loss, [xt, s])))
    (y0, dx0, ds0), (y1, dx1, ds1) = grads
    assert np.isfinite(ds1.numpy()) and np.isfinite(dx1.numpy()).all()
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_allclose(ds1, ds0, rtol=1e-6)
    # and it is the float64 reference's d(scale): sum(ds * x) over the kept elements
    x64 = np.where(np.tril(np.ones((8, 8), bool)), x[0, 0, 0].astype(np.float64), 0.0)
    z = np.where(np.tril(np.ones((8, 8), bool)), 0.7 * x64, -np.inf)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dy = 2 * p
    dz = p * (dy - (dy * p).sum(1, keepdims=True))
    assert rel_error(ds1.numpy(), (dz * x64).sum()) < 1e-5


def test_negative_autoregress_at_key_never_runs_silently(bst, rng):
    """Refused when the graph runs; under XLA (which compiles the assertion to nothing) NaN."""
    x = tf.constant(rng.standard_normal((1, 2, 3, 8, 8)), tf.float32)
    for jit in (False, True):
        f = tf.function(lambda x, a: bst.masked_softmax(x, autoregress_at_key=a), jit_compile=jit,
                        input_signature=[S([None] * 5), S([], tf.int32)])
        np.testing.assert_allclose(f(x, tf.constant(3)), bst.masked_softmax(x, autoregress_at_key=3), rtol=1e-6)
        if jit:
            assert np.isnan(f(x, tf.constant(-1)).numpy()).all()
        else:
            with pytest.raises(tf.errors.InvalidArgumentError, match="autoregress_at_key must be >= 0"):
                f(x, tf.constant(-1))
