"""Lists that hold tensors or variables are tensors, as TensorFlow's own ops pack them: an ``ew``
operand or a ``layer_norm`` gain given as ``[v0, v1, ...]`` keeps its gradients, eagerly and in
``tf.function``; a ragged list of numbers is refused naming the argument."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from blocksparse import ew  # noqa: E402
from blocksparse.norms import layer_norm  # noqa: E402


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "function"])
def test_operand_list_of_variables(rng, graph):
    x = tf.constant(rng.standard_normal((3, 2)), tf.float32)
    vs = [tf.Variable(float(rng.standard_normal())) for _ in range(2)]

    def run():
        with tf.GradientTape() as tape:
            y = ew.multiply(x, [vs[0], vs[1]])
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, vs)

    y, grads = tf.function(run)() if graph else run()
    v = np.array([float(a.numpy()) for a in vs])
    x64 = x.numpy().astype(np.float64)
    np.testing.assert_allclose(y, x64 * v, rtol=1e-6)
    np.testing.assert_allclose([float(g) for g in grads], (2 * x64 * x64 * v).sum(0), rtol=1e-5)


def test_layer_norm_gain_list_of_variables(rng):
    x = tf.constant(rng.standard_normal((5, 4)), tf.float32)
    gs = [tf.Variable(float(g)) for g in rng.uniform(0.5, 1.5, 4)]
    w = rng.standard_normal(4)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer_norm(x, gs, tf.zeros([4])) * w.astype(np.float32))
    grads = tape.gradient(loss, gs)
    x64 = x.numpy().astype(np.float64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose([float(g) for g in grads], (xhat * w).sum(0), rtol=1e-4, atol=1e-5)


def test_ragged_gain_names_the_argument():
    with pytest.raises(ValueError, match="^g must be"):
        layer_norm(tf.ones([2, 4]), [[1.0, 1.0], [1.0]], tf.zeros([4]))
