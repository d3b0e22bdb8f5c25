"""Acceptance, second round: ``blocksparse.keras.BlocksparseDense`` as a demanding user uses it --
layouts with empty block rows / columns, one block, fully dense; mixed precision policies through
``model.fit`` and a ``.keras`` file; config round trips that rebuild the same function;
``copy.deepcopy`` and pickling; unknown sizes in ``tf.function`` and ``tf.compat.v1`` graphs; an
empty batch; bad inputs.  Values and gradients against float64 numpy."""
import copy
import json
import pickle

import keras
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.keras import BlocksparseDense
from blocksparse.testing import rel_error, tolerance

LAYOUTS = {
    "empty_row_and_column": np.array([[1, 0, 1], [0, 0, 0], [1, 0, 1]]),
    "one_block": np.array([[0, 0], [0, 1]]),
    "fully_dense": np.ones((2, 3), int),
    "single_block_layout": np.ones((1, 1), int),
}


def _dense_w(layer):
    return layer.layout.dense(np.asarray(layer.kernel.numpy(), np.float64))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layouts_values_and_gradients(rng, name):
    layout = LAYOUTS[name]
    bs = 8
    layer = BlocksparseDense(layout, bs, activation="sigmoid",
                             bias_initializer=keras.initializers.RandomNormal(seed=int(rng.integers(1 << 30))))
    C, K = layout.shape[0] * bs, layout.shape[1] * bs
    x = tf.constant(rng.standard_normal((3, C)), tf.float32)
    dy = tf.constant(rng.standard_normal((3, K)), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    dx, dw, db = tape.gradient(y, [x, layer.kernel, layer.bias], output_gradients=dy)
    w, bias = _dense_w(layer), layer.bias.numpy().astype(np.float64)
    want = 1.0 / (1.0 + np.exp(-(x.numpy().astype(np.float64) @ w + bias)))
    dz = dy.numpy() * want * (1 - want)
    tol = tolerance(tf.float32)
    assert y.shape == (3, K) and rel_error(y.numpy(), want) < tol
    assert rel_error(dx.numpy(), dz @ w.T) < tol
    assert rel_error(dw.numpy(), layer.layout.pack(x.numpy().astype(np.float64).T @ dz)) < tol
    assert rel_error(db.numpy(), dz.sum(0)) < tol
    if name == "empty_row_and_column":
        assert np.all(dx.numpy()[:, 8:16] == 0)                         # features no block reads
        assert np.allclose(y.numpy()[:, 8:16], 1 / (1 + np.exp(-bias[8:16])), rtol=1e-6)   # bias only


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_values_gradients(rng, policy):
    compute = policy.split("_")[1]
    layer = BlocksparseDense(np.array([[1, 1], [0, 1]]), 16, dtype=policy,
                             bias_initializer=keras.initializers.RandomNormal(seed=1))
    x = tf.constant(rng.standard_normal((5, 32)), tf.float32)
    dy = rng.standard_normal((5, 32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * dy)
    dx, dw, db = tape.gradient(loss, [x, layer.kernel, layer.bias])
    assert y.dtype == compute and layer.kernel.dtype == "float32" and dw.dtype == tf.float32
    w = _dense_w(layer)
    x16 = tf.cast(x, compute).numpy().astype(np.float64)                  # the values the layer saw
    tol = 2 * tolerance(compute)
    assert rel_error(y.numpy(), x16 @ w + layer.bias.numpy()) < tol
    assert rel_error(dx.numpy(), dy @ w.T) < tol
    assert rel_error(dw.numpy(), layer.layout.pack(x16.T @ dy)) < tol
    assert rel_error(db.numpy(), dy.sum(0)) < tol


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_fit_save_and_reload(rng, tmp_path, policy):
    keras.utils.set_random_seed(int(rng.integers(1 << 30)))
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        inp = keras.Input((32,))
        hidden = BlocksparseDense(np.array([[1, 0], [1, 1]]), 16, activation="tanh", name="sparse")(inp)
        model = keras.Model(inp, keras.layers.Dense(2, dtype="float32", name="head")(hidden))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    x = rng.standard_normal((128, 32)).astype(np.float32)
    y = np.stack([np.tanh(x[:, 0] - x[:, 17]), x[:, 3] * 0.5], axis=1).astype(np.float32)
    before = model.evaluate(x, y, verbose=0)
    history = model.fit(x, y, epochs=6, batch_size=32, verbose=0).history["loss"]
    assert np.all(np.isfinite(history)) and model.evaluate(x, y, verbose=0) < 0.8 * before
    path = tmp_path / "mixed.keras"
    model.save(path)
    again = keras.saving.load_model(path)
    layer = again.get_layer("sparse")
    assert isinstance(layer, BlocksparseDense) and layer.dtype_policy.name == policy
    assert layer.kernel.dtype == "float32" and layer.compute_dtype == policy.split("_")[1]
    np.testing.assert_array_equal(again.predict(x, verbose=0), model.predict(x, verbose=0))


def test_config_round_trip_rebuilds_the_same_function(rng):
    layer = BlocksparseDense(LAYOUTS["empty_row_and_column"], 8, False, keras.activations.relu,
                             keras.initializers.RandomUniform(-1, 1, seed=3), "ones",
                             kernel_regularizer=keras.regularizers.L1(0.01), bias_regularizer="l2",
                             kernel_constraint="max_norm", bias_constraint=None, z_order=True, name="bsd",
                             trainable=False)
    config = layer.get_config()
    json.dumps(config)
    for key, value in {"block_size": 8, "use_bias": False, "z_order": True, "trainable": False,
                       "layout": LAYOUTS["empty_row_and_column"].tolist()}.items():
        assert config[key] == value
    clone = BlocksparseDense.from_config(config)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    layer(x)
    clone(x)
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == config
    assert clone.trainable is False and clone.bias is None and len(clone.losses) == len(layer.losses)
    assert type(clone.kernel_regularizer) is keras.regularizers.L1
    assert abs(float(clone.kernel_regularizer.l1) - 0.01) < 1e-9
    np.testing.assert_array_equal(clone(x).numpy(), layer(x).numpy())
    want = np.maximum(x.astype(np.float64) @ _dense_w(layer), 0)
    assert rel_error(layer(x).numpy(), want) < tolerance(tf.float32)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_compute_the_same(rng, how):
    layer = BlocksparseDense(np.array([[1, 0], [1, 1]]), 8, activation="relu")
    x = rng.standard_normal((3, 16)).astype(np.float32)
    y = layer(x).numpy()
    other = copy.deepcopy(layer) if how == "deepcopy" else pickle.loads(pickle.dumps(layer))
    np.testing.assert_array_equal(other(x).numpy(), y)
    other.kernel.assign(other.kernel * 0.0)                               # a copy, not an alias
    np.testing.assert_array_equal(layer(x).numpy(), y)


def test_unknown_sizes_in_function_and_v1_graph(rng):
    layer = BlocksparseDense(np.array([[1, 1], [1, 0]]), 8, activation="tanh")
    fn = tf.function(layer, input_signature=[tf.TensorSpec([None, None, None])])
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    y = fn(x)
    want = np.tanh(x.astype(np.float64) @ _dense_w(layer) + layer.bias.numpy())
    assert y.shape == (2, 3, 16) and rel_error(y.numpy(), want) < tolerance(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="C = 16 features"):
        fn(np.ones((2, 2, 32), np.float32))                             # 32 features, unknown when traced

    with tf.Graph().as_default():
        graph_layer = BlocksparseDense(np.array([[1, 1], [1, 0]]), 8, use_bias=False)
        xp = tf.compat.v1.placeholder(tf.float32, [None, 16])
        yp = graph_layer(xp)
        (dx,) = tf.gradients(yp, [xp])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            xv = rng.standard_normal((5, 16))
            got, dxv, kernel = sess.run([yp, dx, graph_layer.kernel.value], {xp: xv})
    w = graph_layer.layout.dense(kernel.astype(np.float64))
    assert rel_error(got, xv @ w) < tolerance(tf.float32)
    assert rel_error(dxv, np.ones((5, 16)) @ w.T) < tolerance(tf.float32)


def test_empty_batch_and_other_input_forms(rng):
    layer = BlocksparseDense(np.eye(2, dtype=int), 8, dtype="bfloat16")
    assert layer(np.zeros((0, 16), np.float32)).shape == (0, 16)
    x = rng.standard_normal((2, 16))                                     # float64 numpy: cast to the layer's dtype
    y = layer(x)
    assert y.dtype == tf.bfloat16
    x_seen = tf.cast(tf.cast(x, tf.float32), tf.bfloat16).numpy().astype(np.float64)
    want = x_seen @ _dense_w(layer) + layer.bias.numpy().astype(np.float64)
    assert rel_error(y.numpy(), want) < 2 * tolerance(tf.bfloat16)


BAD = {
    "rank1_input": (lambda: BlocksparseDense(np.eye(2), 8)(tf.ones([16])), ValueError, "ndim"),
    "layout_none": (lambda: BlocksparseDense(None, 8), TypeError, "layout"),
    "layout_3d": (lambda: BlocksparseDense(np.ones((2, 2, 2)), 8), ValueError, "layout"),
    "layout_values": (lambda: BlocksparseDense(np.array([[2, 0], [0, 1]]), 8), ValueError, "layout"),
    "block_size_float": (lambda: BlocksparseDense(np.eye(2), 8.0), TypeError, "block_size"),
    "block_size_str": (lambda: BlocksparseDense(np.eye(2), "8"), TypeError, "block_size"),
    "z_order": (lambda: BlocksparseDense(np.eye(2), 8, z_order=1), TypeError, "z_order"),
    "initializer": (lambda: BlocksparseDense(np.eye(2), 8, kernel_initializer="nope"), ValueError, "nope"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments(case):
    call, error, pattern = BAD[case]
    with pytest.raises(error, match=pattern):
        call()
