"""Acceptance, second round: ``blocksparse.transformer.BlocksparseTransformer`` (TensorFlow) as a
demanding user calls it -- the whole chain at the kernels' block sizes on layouts with empty rows /
columns, one block or every block (eager, ``tf.function`` with an unknown batch, ``tf.compat.v1``
graphs), transposed inputs, copies, second derivatives, tensor arguments checked when they are
known and bad shape-helper arguments -- against float64 numpy."""
import copy
import pickle

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from attention_cases import (BAD_MINIBATCH, CHAIN_CASES, EMPTY_ROW_AND_COLUMN, chain_reference,  # noqa: E402
                             check_bad_minibatch, tril_callback)
from attention_reference import Ref  # noqa: E402
from tf_modes import MODES, run  # noqa: E402

from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.transformer import BlocksparseTransformer  # noqa: E402


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CHAIN_CASES))
def test_attention_chain_values_and_gradients(name, mode, rng):
    case, autoregress_at_key = CHAIN_CASES[name]
    bst, R, D = case.make(BlocksparseTransformer), case.ref(), 2
    shape = bst.q_shape(2, case.heads * D)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]

    def chain(q, k, v):
        return bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), 0.7, autoregress_at_key), v)

    got = run(mode, chain, xs, [tf.float32] * 3, [rng.standard_normal(shape).astype(np.float32)],
              unknown={0: (0,), 1: (0,), 2: (0,)})
    want = chain_reference(R, *got.inputs, got.grad_ys[0], 0.7, autoregress_at_key)
    for out, ref in zip([got.outputs[0], *got.grads], want):
        assert not np.isnan(out).any()
        assert rel_error(out, ref) < 2 * tolerance("float32")


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
def test_documented_block_sizes(block_size, rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=block_size, heads=1)
    R = Ref(np.tril(np.ones((1, 2, 2), bool)), block_size)
    q, k = (rng.standard_normal(bst.q_shape(1, 2)).astype(np.float32) for _ in range(2))
    w = bst.query_key_op(q, k)
    assert tuple(w.shape) == bst.w_shape(1) == (1, 1, 3, block_size, block_size)
    assert rel_error(w, R.nt(q, k)) < 2 * tolerance("float32")
    p = bst.masked_softmax(w, autoregress_at_key=0)
    assert rel_error(p, R.softmax(w.numpy(), 1.0, 0)) < 2 * tolerance("float32")


def test_transposed_and_sliced_inputs(rng):
    bst = BlocksparseTransformer(EMPTY_ROW_AND_COLUMN, block_size=16, heads=2)
    R = Ref(np.broadcast_to(EMPTY_ROW_AND_COLUMN.astype(bool), (2, 3, 3)), 16)
    q = tf.transpose(tf.constant(rng.standard_normal((1, 8, 48)), tf.float32), [0, 2, 1])
    k = tf.constant(rng.standard_normal((1, 48, 16)), tf.float32)[..., ::2]
    w = bst.query_key_op(q, k)
    assert rel_error(w, R.nt(q.numpy(), k.numpy())) < 2 * tolerance("float32")
    w_t = tf.transpose(tf.constant(rng.standard_normal(bst.w_shape(1)), tf.float32), [0, 1, 2, 4, 3])
    assert rel_error(bst.weight_value_op(w_t, k), R.nn(w_t.numpy(), k.numpy())) < 2 * tolerance("float32")
    assert rel_error(bst.tn_op(w_t, q), R.tn(w_t.numpy(), q.numpy())) < 2 * tolerance("float32")


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_compute_the_same(how, rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=2, mask_callback=tril_callback)
    other = copy.deepcopy(bst) if how == "deepcopy" else pickle.loads(pickle.dumps(bst))
    x = tf.constant(rng.standard_normal(bst.w_shape(2)), tf.float32)
    np.testing.assert_array_equal(other.masked_softmax(x, scale=0.3), bst.masked_softmax(x, scale=0.3))
    assert (other.blocks, other.heads, other.nt_list) == (bst.blocks, bst.heads, bst.nt_list)


def test_products_second_derivatives(rng):
    """As the PyTorch test: ``<nt(a, b), c>`` gives ``da = nn(c, b)``; ``<da, e>`` gives
    ``db = tn(c, e)`` and ``dc = nt(e, b)``."""
    bst = BlocksparseTransformer(EMPTY_ROW_AND_COLUMN, block_size=16, heads=2)
    R = Ref(np.broadcast_to(EMPTY_ROW_AND_COLUMN.astype(bool), (2, 3, 3)), 16)
    a, b, e = (tf.constant(rng.standard_normal(bst.q_shape(1, 4)), tf.float32) for _ in range(3))
    c = tf.constant(rng.standard_normal(bst.w_shape(1)), tf.float32)
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([b, c])
        with tf.GradientTape() as inner:
            inner.watch(a)
            loss = tf.reduce_sum(bst.nt_op(a, b) * c)
        da = inner.gradient(loss, a)
        second = tf.reduce_sum(da * e)
    db, dc = outer.gradient(second, [b, c])
    tol = 2 * tolerance("float32")
    assert rel_error(da, R.nn(c.numpy(), b.numpy())) < tol
    assert rel_error(db, R.tn(c.numpy(), e.numpy())) < tol and rel_error(dc, R.nt(e.numpy(), b.numpy())) < tol


def test_negative_autoregress_tensor_is_an_error(rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=1)
    x = rng.standard_normal(bst.w_shape(1)).astype(np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="autoregress_at_key"):
        bst.masked_softmax(tf.constant(x), autoregress_at_key=tf.constant(-2))
    with tf.Graph().as_default():
        key = tf.compat.v1.placeholder(tf.int32, [])
        p = bst.masked_softmax(tf.constant(x), autoregress_at_key=key)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_allclose(sess.run(p, {key: 0}), bst.masked_softmax_test(x, 1.0, 0), atol=1e-6)
            with pytest.raises(tf.errors.InvalidArgumentError, match="autoregress_at_key"):
                sess.run(p, {key: -1})


@pytest.mark.parametrize("scale", [tf.constant([0.5, 0.5]), tf.constant(2), None, "0.5"],
                         ids=["vector", "int-tensor", "none", "str"])
def test_bad_scale(scale, rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=1)
    with pytest.raises((TypeError, ValueError), match="scale"):
        bst.masked_softmax(tf.constant(rng.standard_normal(bst.w_shape(1)), tf.float32), scale=scale)


@BAD_MINIBATCH
def test_shape_helpers_reject_bad_minibatch(N, error):
    check_bad_minibatch(BlocksparseTransformer, N, error)


def test_shape_helpers_take_a_runtime_batch(rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=2)

    @tf.function(input_signature=[tf.TensorSpec([None, 32, 8], tf.float32)])
    def zeros_like_scores(q):
        return tf.zeros(bst.w_shape(tf.shape(q)[0])) + bst.query_key_op(q, q)

    q = rng.standard_normal(bst.q_shape(3, 8)).astype(np.float32)
    assert rel_error(zeros_like_scores(q), bst.nt_test(q, q)) < 2 * tolerance("float32")
