"""The original's numpy helpers in blocksparse.norms (its tests imported them): against the ops and
against a direct formula."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.norms import (batch_norm, batch_norm_grad_test, batch_norm_inf_test, batch_norm_inference,
                               batch_norm_test, layer_norm, layer_norm_grad_test, layer_norm_test)


@pytest.mark.parametrize("axis", [0, 1])
def test_layer_norm_helpers(rng, axis):
    shape = (6, 8) if axis == 1 else (8, 6)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    g, b = rng.standard_normal((1, 8) if axis == 1 else (8, 1)), rng.standard_normal(8)
    mean, var = x.mean(axis, keepdims=True), x.var(axis, keepdims=True)
    direct = np.maximum((x - mean) / np.sqrt(var + 1e-6) * g + b.reshape(g.shape), 0)
    np.testing.assert_allclose(layer_norm_test(x, g, b, axis=axis, relu=True), direct, rtol=1e-12, atol=1e-12)
    xt, gt, bt = tf.constant(x, tf.float32), tf.constant(g.reshape(-1), tf.float32), tf.constant(b, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([xt, gt, bt])
        y = layer_norm(xt, gt, bt, axis=axis, segments=2)
    got = tape.gradient(y, [xt, gt, bt], output_gradients=tf.constant(dy, tf.float32))
    np.testing.assert_allclose(y.numpy(), layer_norm_test(x, g, b, axis=axis, segments=2), rtol=1e-4, atol=1e-4)
    for a, want in zip(got, layer_norm_grad_test(dy, x, g, b, axis=axis, segments=2)):
        np.testing.assert_allclose(a.numpy().reshape(want.shape), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, axis", [((0, 8), 1), ((8, 0), 0), ((2, 0, 8), -1)])
def test_layer_norm_helpers_of_an_empty_batch(rng, shape, axis):
    """No tokens: empty results of the input's shape and zero parameter gradients, as the op gives."""
    g, b = rng.standard_normal(8), rng.standard_normal(8)
    x = np.zeros(shape)
    assert layer_norm_test(x, g, b, axis=axis, segments=2).shape == shape
    dx, dg, db = layer_norm_grad_test(x, x, g, b, axis=axis, segments=2)
    assert dx.shape == shape and dg.shape == db.shape == (8,) and not dg.any() and not db.any()


def test_batch_norm_helpers(rng):
    x, dy = (rng.standard_normal((3, 4, 5, 5)).astype(np.float32) for _ in range(2))
    g, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y, m, v = batch_norm(xt, g, b)
    dx = tape.gradient(y, xt, output_gradients=tf.constant(dy))
    want_y, want_m, want_v = batch_norm_test(x, g, b)
    np.testing.assert_allclose(want_m, x.astype(np.float64).mean((0, 2, 3)), rtol=1e-9)
    for got, want in ((y, want_y), (m, want_m), (v, want_v), (dx, batch_norm_grad_test(dy, x, g, want_m, want_v)[0])):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    inf = batch_norm_inference(xt, g, b, want_m.astype(np.float32), want_v.astype(np.float32))
    np.testing.assert_allclose(inf.numpy(), batch_norm_inf_test(x, g, b, want_m, want_v), rtol=1e-4, atol=1e-4)
