"""Acceptance: ``blocksparse.transformer.BlocksparseTransformer`` (TensorFlow) as the README documents
it, against float64 numpy (eager, ``tf.function`` with an unknown batch, ``tf.compat.v1`` graphs)."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from attention_cases import (CASES, DROP_ROWS, IDS, PRODUCTS, product_reference, product_shapes,  # noqa: E402
                             assert_all_raise, bad_calls, tril_callback)
from tf_modes import MODES, run  # noqa: E402

import blocksparse  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.transformer import BlocksparseTransformer  # noqa: E402

DTYPES = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}


def _tol(dtype):
    return 2 * tolerance(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", PRODUCTS)
@pytest.mark.parametrize("case", CASES[:2], ids=IDS[:2])
def test_products(case, op, mode, rng):
    bst, R = case.make(BlocksparseTransformer), case.ref()
    a_shape, b_shape, out_shape = product_shapes(bst, op, N=2, D=4)
    xs = [rng.standard_normal(a_shape), rng.standard_normal(b_shape)]
    got = run(mode, getattr(bst, op), xs, [tf.float32] * 2, [rng.standard_normal(out_shape)],
              unknown={0: (0,), 1: (0,)})
    assert got.outputs[0].shape == tuple(out_shape)
    for out, want in zip([got.outputs[0], *got.grads], product_reference(R, op, *got.inputs, got.grad_ys[0])):
        assert rel_error(out, want) < _tol("float32")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("autoregress_at_key", [None, 0, 5], ids=["no-autoregress", "causal", "prefix-5"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masked_softmax(case, autoregress_at_key, mode, rng):
    bst, R = case.make(BlocksparseTransformer), case.ref()
    x = 3 * rng.standard_normal(bst.w_shape(2))
    gy = rng.standard_normal(bst.w_shape(2))
    scale = 0.7
    got = run(mode, lambda x: bst.masked_softmax(x, scale=scale, autoregress_at_key=autoregress_at_key),
              [x], [tf.float32], [gy], unknown={0: (0,)})
    y = R.softmax(got.inputs[0], scale, autoregress_at_key)
    assert rel_error(got.outputs[0], y) < _tol("float32")
    assert rel_error(got.grads[0], R.softmax_grad(got.grad_ys[0], y, scale)) < _tol("float32")


def test_softmax_over_whole_blocks(rng):
    case = CASES[0]
    bst, R = case.make(BlocksparseTransformer), case.ref()
    x = rng.standard_normal(bst.w_shape(1)).astype(np.float32)
    y = bst.softmax(tf.constant(x), scale=2.0)
    assert rel_error(y.numpy(), R.softmax(x, 2.0, masked=False)) < _tol("float32")


def test_fully_masked_rows_are_zero(rng):
    """Callback masks that drop whole query rows give zero rows and zero gradients, never NaN."""
    bst, R = DROP_ROWS.make(BlocksparseTransformer), DROP_ROWS.ref()
    x = rng.standard_normal(bst.w_shape(2)).astype(np.float32)
    gy = rng.standard_normal(bst.w_shape(2)).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = bst.masked_softmax(xt, autoregress_at_key=0)
    dx = tape.gradient(y, xt, output_gradients=tf.constant(gy)).numpy()
    y = y.numpy()
    assert np.all(y[:, :, :, ::2] == 0) and np.all(dx[:, :, :, ::2] == 0)
    want = R.softmax(x, 1.0, 0)
    assert rel_error(y, want) < _tol("float32")
    assert rel_error(dx, R.softmax_grad(gy, want)) < _tol("float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_end_to_end(dtype, rng):
    case = CASES[0]
    bst, R = case.make(BlocksparseTransformer), case.ref()
    dt = DTYPES[dtype]
    q, k, v = (tf.cast(tf.constant(rng.standard_normal(bst.q_shape(2, 8))), dt) for _ in range(3))
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        w = bst.query_key_op(q, k)
        p = bst.masked_softmax(w, scale=0.5)
        y = bst.weight_value_op(p, v)
    assert w.dtype == dt and p.dtype == dt and y.dtype == dt
    assert bst.masked_softmax(w, scale=0.5, dtype=tf.float32).dtype == tf.float32
    q64, k64, v64 = (tf.cast(t, tf.float64).numpy() for t in (q, k, v))
    want = R.nn(R.softmax(R.nt(q64, k64), 0.5), v64)
    assert rel_error(tf.cast(y, tf.float64).numpy(), want) < 4 * tolerance(dtype)
    dq, dk, dv = tape.gradient(y, [q, k, v])
    assert dq.dtype == dt and dk.dtype == dt and dv.dtype == dt


def test_scale_and_autoregress_as_tensors(rng):
    case = CASES[0]
    bst, R = case.make(BlocksparseTransformer), case.ref()
    x = rng.standard_normal(bst.w_shape(1)).astype(np.float32)
    gy = rng.standard_normal(bst.w_shape(1))
    scale = tf.Variable(0.8)
    with tf.GradientTape() as tape:
        y = bst.masked_softmax(tf.constant(x), scale=scale, autoregress_at_key=tf.constant(3))
        loss = tf.reduce_sum(y * gy)
    want = R.softmax(x, 0.8, 3)
    assert rel_error(y.numpy(), want) < _tol("float32")
    # d loss / d scale = sum(dx * x) / scale, with dx the gradient of the scaled scores times scale;
    # the terms' signs are random, so the sum may cancel: its error is bounded by the terms' size
    terms = R.softmax_grad(gy, want, 0.8) * x / 0.8
    assert abs(tape.gradient(loss, scale).numpy() - terms.sum()) < 1e-4 * np.abs(terms).sum()


def test_shape_helpers_and_attributes():
    bst = BlocksparseTransformer(np.array([[1, 0, 1], [0, 1, 1]]), block_size=16, heads=4)
    assert bst.w_shape(3) == (3, 4, 4, 16, 16)
    assert bst.q_shape(3, 32) == (3, 32, 32) and bst.k_shape(3, 32) == (3, 48, 32)
    assert (bst.blocks, bst.heads, bst.ctx_blks_q, bst.ctx_blks_k) == (4, 4, 2, 3)
    assert [tuple(bst.block_coord(b)) for b in range(4)] == [(0, 0), (0, 2), (1, 1), (1, 2)]
    assert bst.blk_size == 16 and tuple(bst.blk_shape) == (16, 16)
    assert blocksparse.BlocksparseTransformer is BlocksparseTransformer
    assert BlocksparseTransformer(np.ones((1, 2, 2)), 8, heads=2).heads == 2
    assert BlocksparseTransformer(np.ones((2, 2, 2)), 8).heads == 2


def test_numpy_test_helpers_agree(rng):
    case = CASES[2]
    bst, R = case.make(BlocksparseTransformer), case.ref()
    q, k = rng.standard_normal(bst.q_shape(1, 6)), rng.standard_normal(bst.k_shape(1, 6))
    assert rel_error(bst.nt_test(q, k), R.nt(q, k)) < 1e-6
    x = rng.standard_normal(bst.w_shape(1))
    assert rel_error(bst.masked_softmax_test(x, 0.5, 0), R.softmax(x, 0.5, 0)) < 1e-6


def test_mask_callback_arguments():
    calls = []

    def callback(blk_shape, head, q_blk, k_blk, blk_id):
        calls.append((tuple(blk_shape), head, q_blk, k_blk, blk_id))
        return np.ones(blk_shape)

    layout = np.array([[[1, 1], [0, 1]], [[1, 0], [1, 1]]])
    BlocksparseTransformer(layout, block_size=8, mask_callback=callback)
    assert sorted(calls) == sorted([((8, 8), 0, 0, 0, 0), ((8, 8), 0, 0, 1, 1), ((8, 8), 0, 1, 1, 2),
                                    ((8, 8), 1, 0, 0, 0), ((8, 8), 1, 1, 0, 1), ((8, 8), 1, 1, 1, 2)])


BAD_LAYOUTS = {
    "2d-without-heads": (dict(layout=np.ones((2, 2))), (TypeError, ValueError), "heads"),
    "not-0-1": (dict(layout=np.full((2, 2), 2), heads=1), ValueError, "layout"),
    "unequal-blocks-per-head": (dict(layout=np.array([[[1, 0], [0, 1]], [[1, 1], [0, 1]]])), ValueError, "layout"),
    "heads-mismatch": (dict(layout=np.ones((2, 2, 2)), heads=3), ValueError, "heads"),
    "block-size-12": (dict(layout=np.ones((2, 2)), heads=1, block_size=12), ValueError, "block_size"),
    "empty-layout": (dict(layout=np.zeros((2, 2)), heads=1), ValueError, "layout"),
    "4d-layout": (dict(layout=np.ones((1, 1, 2, 2)), heads=1), ValueError, "layout"),
    "heads-zero": (dict(layout=np.ones((2, 2)), heads=0), ValueError, "heads"),
    "callback-bad-shape": (dict(layout=np.ones((2, 2)), heads=1,
                                mask_callback=lambda s, h, q, k, b: np.ones((3, 3))), ValueError, "mask_callback"),
    "callback-not-callable": (dict(layout=np.ones((2, 2)), heads=1, mask_callback=3), TypeError, "mask_callback"),
}


@pytest.mark.parametrize("name", BAD_LAYOUTS)
def test_bad_constructor_args(name):
    kwargs, error, pattern = BAD_LAYOUTS[name]
    kwargs.setdefault("block_size", 8)
    with pytest.raises(error, match=pattern):
        BlocksparseTransformer(**kwargs)


def test_bad_call_args(rng):
    bst = BlocksparseTransformer(CASES[0].layout, block_size=8, heads=2, mask_callback=tril_callback)
    q = tf.constant(rng.standard_normal(bst.q_shape(2, 8)).astype(np.float32))
    w = tf.constant(rng.standard_normal(bst.w_shape(2)).astype(np.float32))
    assert_all_raise(bad_calls(bst, q, w) + [
        (lambda: bst.query_key_op(q, tf.cast(q, tf.float16)), TypeError, "dtype"),
        (lambda: bst.query_key_op(tf.cast(q, tf.int32), q), TypeError, "q"),
        (lambda: bst.masked_softmax(w, dtype=tf.int32), (TypeError, ValueError), "dtype"),
    ])


def test_unknown_sizes_checked_when_graph_runs(rng):
    bst = BlocksparseTransformer(CASES[0].layout, block_size=8, heads=2)
    with tf.Graph().as_default():
        q = tf.compat.v1.placeholder(tf.float32, [None, None, 8])
        w = bst.query_key_op(q, q)
        with tf.compat.v1.Session() as sess:
            assert sess.run(w, {q: np.ones((1, 24, 8), np.float32)}).shape == bst.w_shape(1)
            with pytest.raises(tf.errors.InvalidArgumentError, match="q"):
                sess.run(w, {q: np.ones((1, 16, 8), np.float32)})


def test_empty_batch():
    bst = CASES[0].make(BlocksparseTransformer)
    q = tf.zeros(bst.q_shape(0, 8))
    with tf.GradientTape() as tape:
        tape.watch(q)
        w = bst.query_key_op(q, q)
        y = bst.weight_value_op(bst.masked_softmax(w, autoregress_at_key=0), q)
    assert tuple(w.shape) == bst.w_shape(0) and tuple(y.shape) == bst.q_shape(0, 8)
    assert tape.gradient(y, q).shape == q.shape


def test_documented_positional_and_keyword_forms(rng):
    layout = np.tril(np.ones((2, 2)))
    a = BlocksparseTransformer(layout, 8, 2, tril_callback, "attn")
    b = BlocksparseTransformer(layout=layout, block_size=8, heads=2, mask_callback=tril_callback, name="attn")
    q = tf.constant(rng.standard_normal(a.q_shape(1, 8)).astype(np.float32))
    w1 = a.masked_softmax(a.query_key_op(q, q), 0.5, 0)
    w2 = b.masked_softmax(x=b.query_key_op(q=q, k=q, name="qk", bench=0), scale=0.5, autoregress_at_key=0, dtype=None)
    assert np.array_equal(w1.numpy(), w2.numpy())
    assert np.array_equal(a.weight_value_op(w1, q).numpy(), b.weight_value_op(w=w2, v=q).numpy())
