"""Argument shapes left to run time are checked under XLA too: ``jit_compile=True`` compiles
assertions to nothing, so each check also leaves an op XLA cannot compile unless the shapes match
(a wrong size must not broadcast silently), and an invalid ``keep_prob`` tensor gives NaN, never a
silent scaling."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from blocksparse import ew  # noqa: E402
from blocksparse.conv import cwise_linear  # noqa: E402
from blocksparse.norms import layer_norm  # noqa: E402

ANY = tf.TensorSpec([None, None])


def _raises(fn, *args):
    with pytest.raises(tf.errors.InvalidArgumentError):
        fn(*args)


@pytest.mark.parametrize("jit", [True, False], ids=["xla", "graph"])
def test_wrong_sizes_raise(jit):
    def compiled(fn, *specs):
        return tf.function(fn, input_signature=list(specs), jit_compile=jit)

    x = tf.constant(np.arange(16, dtype=np.float32).reshape(2, 8))
    ln = compiled(lambda x, g: layer_norm(x, g, tf.zeros([8])), tf.TensorSpec([None, 8]), tf.TensorSpec(None))
    want = layer_norm(x, tf.ones([8]), tf.zeros([8]))
    np.testing.assert_allclose(ln(x, tf.ones([8])), want, rtol=1e-6)
    np.testing.assert_allclose(ln(x, tf.ones([1, 8, 1])), want, rtol=1e-6)  # ones elsewhere: accepted
    for g in (tf.ones([1]), tf.ones([6]), tf.ones([2, 4])):
        _raises(ln, x, g)
    gates = compiled(lambda c, i: ew.fused_lstm_gates(c, i, i, i, i)[0], ANY, ANY)
    assert gates(tf.ones([2, 4]), tf.zeros([2, 4])).shape == (2, 4)
    _raises(gates, tf.ones([1, 4]), tf.zeros([2, 4]))
    merged = compiled(lambda c, h: ew.fused_lstm_gates(c, h)[0], ANY, ANY)
    assert merged(tf.ones([2, 2]), tf.zeros([2, 8])).shape == (2, 2)
    for c, h in ((tf.ones([1, 2]), tf.zeros([2, 8])), (tf.ones([2, 2]), tf.zeros([2, 12])),
                 (tf.ones([2, 2]), tf.zeros([2, 6]))):
        _raises(merged, c, h)
    drop = compiled(lambda x, m: ew.dropout(x, 0.5, mask=m)[0], ANY, tf.TensorSpec([None, None], tf.bool))
    _raises(drop, tf.ones([2, 4]), tf.constant([[True, False, True, False]]))
    cw = compiled(lambda x, a: cwise_linear(x, a), tf.TensorSpec([None, 3, None, None]), tf.TensorSpec([None]))
    _raises(cw, tf.ones([1, 3, 2, 2]), tf.ones([1]))


def test_invalid_keep_prob_tensor_under_xla_gives_nan():
    drop = tf.function(lambda x, k: ew.dropout(x, k)[0], jit_compile=True,
                       input_signature=[ANY, tf.TensorSpec([])])
    assert np.isnan(drop(tf.ones([2, 4]), tf.constant(2.0))).all()
    assert np.isnan(drop(tf.ones([2, 4]), tf.constant(0.0))).all()
    y = drop(tf.ones([64, 64]), tf.constant(0.5)).numpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.3 < (y == 2.0).mean() < 0.7


@pytest.mark.parametrize("epsilon", [1e40, 1e-50])
def test_epsilon_must_be_a_positive_float32(epsilon):
    with pytest.raises(ValueError, match="epsilon must be a positive float32 number"):
        layer_norm(tf.ones([1, 4]), tf.ones([4]), tf.ones([4]), epsilon=epsilon)
