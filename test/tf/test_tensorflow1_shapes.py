"""Code ported from TensorFlow 1 may run with ``tf.compat.v1.disable_v2_tensorshape()``: an unknown
size is then a ``Dimension(None)``, which is not ``None`` (and is falsy).  The ops that look at a
static size treat it as unknown: checked when the graph runs, never taken for a size or for zero."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.lstm import fused_lstm_gates
from blocksparse.matmul import SparseProj
from blocksparse.testing import norms as ref
from blocksparse.testing import rel_error


@pytest.fixture
def v1_shapes():
    tf.compat.v1.disable_v2_tensorshape()
    try:
        with tf.Graph().as_default():
            yield
    finally:
        tf.compat.v1.enable_v2_tensorshape()


def _run(fetch, feed):
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return sess.run(fetch, feed)


def test_sparse_proj_checks_unknown_rows_when_the_graph_runs(v1_shapes):
    proj = SparseProj(16, gather_lut=[1, 3, 5])
    x = tf.compat.v1.placeholder(tf.float32, [None, 2])
    y = proj.gather(x)
    data = np.arange(32, dtype=np.float32).reshape(16, 2)
    np.testing.assert_array_equal(_run(y, {x: data}), data[[1, 3, 5]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="x must have 16 rows"):
        _run(y, {x: np.zeros((20, 2), np.float32)})


def test_lstm_gates_bias_needs_a_known_k(rng, v1_shapes):
    with pytest.raises(ValueError, match="c must have a known last dimension K"):
        fused_lstm_gates(tf.compat.v1.placeholder(tf.float32, [None, None]),
                         tf.compat.v1.placeholder(tf.float32, [None, None]), bias=tf.zeros([8]))
    c_np, h_np, b_np, _, _ = ref.draw_lstm_gates(rng, 3, 2)
    c = tf.compat.v1.placeholder(tf.float32, [None, 2])
    h = tf.compat.v1.placeholder(tf.float32, [None, 8])
    got = _run(fused_lstm_gates(c, h, bias=tf.constant(b_np, tf.float32)), {c: c_np, h: h_np})
    for g, want in zip(got, ref.lstm_gates(c_np, h_np, bias=b_np)):
        assert rel_error(g, want) < 1e-5


def test_keras_layers_with_unknown_minibatch(rng, v1_shapes):
    """BlocksparseDense and PixelflyDense on a placeholder of unknown minibatch: computed, the
    cost model planning for its default token count."""
    from blocksparse.keras import BlocksparseDense
    from blocksparse.pixelfly import PixelflyDense

    x_np = rng.standard_normal((5, 64)).astype(np.float32)
    x = tf.compat.v1.placeholder(tf.float32, [None, 64])
    dense = BlocksparseDense(np.ones((2, 2)), block_size=32)
    fly = PixelflyDense(64, block_size=16, butterfly_size=4, use_bias=False)
    y_dense, y_fly = dense(x), fly(x)
    weights = [tf.convert_to_tensor(w.value) for w in (dense.kernel, dense.bias, fly.kernel)]
    got_dense, got_fly, kernel, bias, fly_kernel = _run([y_dense, y_fly, *weights],
                                                         {x: x_np})
    assert rel_error(got_dense, x_np @ dense.layout.dense(kernel) + bias) < 1e-5
    assert rel_error(got_fly, x_np @ fly.layout.dense(fly_kernel)) < 1e-5
