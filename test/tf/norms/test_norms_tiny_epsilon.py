"""A subnormal epsilon (accepted: it is a positive float32 number) where the variance or norm is 0:
TensorFlow's CPU kernels flush it to zero, so the ops take float32's smallest normal number instead
of dividing by zero -- y = b (0 for l2_normalize), finite gradients."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.matmul import BlocksparseMatMul
from blocksparse.norms import batch_norm, batch_norm_inference, layer_norm


@pytest.mark.parametrize("epsilon", [1e-40, 1e-45])
def test_subnormal_epsilon_on_constant_inputs(epsilon):
    g, b = tf.Variable(tf.fill([8], 2.0)), tf.Variable(tf.fill([8], 0.5))
    x = tf.fill([3, 8], 3.3)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = layer_norm(x, g, b, epsilon=epsilon)
    np.testing.assert_array_equal(y.numpy(), np.full((3, 8), 0.5, np.float32))
    assert all(np.isfinite(t.numpy()).all() for t in tape.gradient(y, [x, g, b]))
    xc = tf.fill([2, 8, 3], 3.3)
    yb = batch_norm(xc, g, b, epsilon=epsilon)[0]
    yi = batch_norm_inference(xc, g, b, tf.fill([8], 3.3), tf.zeros([8]), epsilon=epsilon)
    np.testing.assert_array_equal(yb.numpy(), np.full((2, 8, 3), 0.5, np.float32))
    np.testing.assert_array_equal(yi.numpy(), np.full((2, 8, 3), 0.5, np.float32))


def test_subnormal_epsilon_l2_normalize_of_zero_block():
    bsmm = BlocksparseMatMul(np.eye(2, dtype=int), 8)
    w = np.random.default_rng(0).standard_normal(bsmm.w_shape).astype(np.float32)
    w[1] = 0.0
    out = bsmm.l2_normalize(w, epsilon=1e-40).numpy()
    assert np.isfinite(out).all() and not out[1].any()
    np.testing.assert_allclose(np.linalg.norm(out[0], axis=0), np.ones(8), rtol=1e-6)


def test_constant_rows_whose_sum_rounds_give_the_bias():
    """3.3 x 100 in float32: the plain mean is an ulp off, so ``x - mean`` would be an ulp and, with
    epsilon 1e-12, ``y`` about ``b +- g``; the corrected mean gives ``b`` exactly."""
    g, b = tf.fill([100], 2.0), tf.fill([100], 0.25)
    y = layer_norm(tf.fill([3, 100], 3.3), g, b, epsilon=1e-12)
    np.testing.assert_array_equal(y.numpy(), np.full((3, 100), 0.25, np.float32))
    y, mean, var = batch_norm(tf.fill([4, 100, 5], 3.3), g, b, epsilon=1e-12)
    np.testing.assert_array_equal(y.numpy(), np.full((4, 100, 5), 0.25, np.float32))
    assert not var.numpy().any() and (mean.numpy() == np.float32(3.3)).all()


@pytest.mark.parametrize("scalar", [np.float16, np.float32, np.float64])
def test_numpy_scalar_epsilon_gives_no_warning(scalar):
    """A numpy scalar epsilon is taken as its value: no overflow warning from the range check
    (its bounds compared in float16 would overflow), the same result as the Python float."""
    import warnings

    bsmm = BlocksparseMatMul(np.eye(2, dtype=int), 8)
    w = np.random.default_rng(1).standard_normal(bsmm.w_shape).astype(np.float32)
    x = tf.constant(np.random.default_rng(2).standard_normal((3, 8)), tf.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = bsmm.l2_normalize(w, epsilon=scalar(1e-3)).numpy()
        y = layer_norm(x, tf.ones([8]), tf.zeros([8]), epsilon=scalar(1e-3)).numpy()
    np.testing.assert_array_equal(got, bsmm.l2_normalize(w, epsilon=float(scalar(1e-3))).numpy())
    np.testing.assert_array_equal(y, layer_norm(x, tf.ones([8]), tf.zeros([8]), epsilon=float(scalar(1e-3))).numpy())
