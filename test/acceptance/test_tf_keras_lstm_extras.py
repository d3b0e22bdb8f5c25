"""Acceptance: the README's extras of the original examples on the TensorFlow side:
``blocksparse.keras.BlocksparseDense`` (documented signature, values and gradients against float64
numpy, unknown batch, dtypes, bad arguments) and ``blocksparse.lstm`` (the gates' module)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from blocksparse import lstm
from blocksparse.keras import BlocksparseDense
from blocksparse.testing import norms as nref
from blocksparse.testing import rel_error, tolerance
from blocksparse.testing.matmul import random_layout

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_dense_positional_signature_values_and_gradients(rng, dtype):
    layout = random_layout(rng, 3, 2, 0.6)
    # layout, block_size, use_bias, activation, kernel_initializer, bias_initializer (documented order)
    layer = BlocksparseDense(layout, 8, True, "tanh", "glorot_uniform", keras.initializers.RandomNormal(seed=3),
                             dtype=dtype)
    x = tf.constant(rng.standard_normal((5, 24)), dtype)
    dy = tf.constant(rng.standard_normal((5, 16)), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    dx, dw, db = tape.gradient(y, [x, layer.kernel, layer.bias], output_gradients=dy)
    assert y.dtype == dtype and y.shape == (5, 16) and layer.kernel.shape == layer.w_shape
    w = layer.layout.dense(layer.kernel.numpy().astype(np.float64))
    x64, dy64 = x.numpy().astype(np.float64), dy.numpy().astype(np.float64)
    want = np.tanh(x64 @ w + layer.bias.numpy())
    dz = dy64 * (1 - want ** 2)
    tol = 2 * tolerance(dtype)
    assert rel_error(y.numpy(), want) < tol
    assert rel_error(dx.numpy(), dz @ w.T) < tol
    assert rel_error(dw.numpy(), layer.layout.pack(x64.T @ dz)) < tol
    assert rel_error(db.numpy(), dz.sum(axis=0)) < tol


def test_dense_unknown_batch_and_time(rng):
    layer = BlocksparseDense(np.eye(2, dtype=int), block_size=16, use_bias=False)
    inputs = keras.Input(shape=(None, 32))           # batch and time unknown
    model = keras.Model(inputs, layer(inputs))
    x = rng.standard_normal((3, 4, 32)).astype(np.float32)
    y = model(x)
    w = layer.layout.dense(layer.kernel.numpy().astype(np.float64))
    assert y.shape == (3, 4, 32)
    assert rel_error(y.numpy(), x.astype(np.float64) @ w) < tolerance(np.float32)


@pytest.mark.parametrize("case", ["block_size", "layout", "use_bias", "features"])
def test_dense_bad_arguments(case):
    if case == "block_size":
        with pytest.raises(ValueError, match="block_size"):
            BlocksparseDense(np.eye(2, dtype=int), block_size=12)
    elif case == "layout":
        with pytest.raises(ValueError, match="layout"):
            BlocksparseDense(np.zeros((2, 2), int), block_size=8)
    elif case == "use_bias":
        with pytest.raises(TypeError, match="use_bias"):
            BlocksparseDense(np.eye(2, dtype=int), block_size=8, use_bias="no")
    else:
        layer = BlocksparseDense(np.eye(2, dtype=int), block_size=8)
        with pytest.raises(ValueError, match="16"):
            layer(tf.ones([2, 17]))


def test_lstm_module_four_tensor_form_feature_axis0(rng):
    """The four-tensor form is elementwise: (K, N) activations of a feature_axis=0 model work."""
    c = rng.standard_normal((6, 3)).astype(np.float32)
    gates = [rng.standard_normal((6, 3)).astype(np.float32) for _ in range(4)]
    c_next, h_next = lstm.fused_lstm_gates(c, *gates, forget_bias=0.0)
    want = nref.lstm_gates(c, *gates, forget_bias=0.0)
    assert rel_error(c_next.numpy(), want[0]) < 1e-5 and rel_error(h_next.numpy(), want[1]) < 1e-5
    parts = lstm.split4(tf.constant(np.concatenate(gates, axis=1)))
    assert all(np.array_equal(p.numpy(), g) for p, g in zip(parts, gates))
    assert lstm.concat4(*parts).shape == (6, 12)
