"""blocksparse.keras.BlocksparseDense on Keras 3: values and gradients against float64 numpy,
serialisation, model.fit, .keras save / reload, mixed precision; the torch backend in a
subprocess."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.keras import BlocksparseDense
from blocksparse.layout import Layout
from blocksparse.testing import rel_error
from blocksparse.testing.matmul import random_layout

ROOT = Path(__file__).resolve().parents[3]


def relu(v):
    return np.maximum(v, 0.0)


def dense_reference(layer, x):
    """``relu(x @ W + b)`` in float64 from the layer's variables."""
    w = layer.layout.dense(np.asarray(layer.kernel.numpy(), np.float64))
    return relu(np.asarray(x, np.float64) @ w + layer.bias.numpy())


@pytest.mark.parametrize("shape", [(7, 48), (2, 5, 48)], ids=["NC", "NTC"])
def test_values_and_gradients(rng, shape):
    layout = random_layout(rng, 3, 4, 0.5)
    layer = BlocksparseDense(layout, block_size=16, activation="relu",
                             bias_initializer=keras.initializers.RandomNormal(seed=1))
    x = tf.constant(rng.standard_normal(shape), tf.float32)
    dy = rng.standard_normal(shape[:-1] + (64,))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    dx, dw, db = tape.gradient(y, [x, layer.kernel, layer.bias], output_gradients=tf.constant(dy, tf.float32))
    want = dense_reference(layer, x.numpy())
    assert y.shape == shape[:-1] + (64,)
    assert rel_error(y, want) < 1e-5
    lay = Layout(layout, 16)
    w = lay.dense(np.asarray(layer.kernel.numpy(), np.float64))
    dz = (dy * (want > 0)).reshape(-1, 64)
    x2 = x.numpy().reshape(-1, 48).astype(np.float64)
    assert rel_error(dx, (dz @ w.T).reshape(shape)) < 1e-5
    assert rel_error(dw, lay.pack(x2.T @ dz)) < 1e-5
    assert rel_error(db, dz.sum(axis=0)) < 1e-5


def test_config_round_trip(rng):
    layout = random_layout(rng, 2, 3, 0.7)
    layer = BlocksparseDense(layout, 8, use_bias=False, activation="tanh", z_order=True,
                             kernel_regularizer=keras.regularizers.L2(0.01), name="bsd")
    config = layer.get_config()
    assert config["layout"] == layout.tolist() and config["block_size"] == 8
    json.dumps(config)  # plain data only
    clone = BlocksparseDense.from_config(config)
    assert clone.layout == layer.layout and clone.use_bias is False and clone.name == "bsd"
    assert keras.activations.serialize(clone.activation) == keras.activations.serialize(layer.activation)
    revived = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(revived, BlocksparseDense) and revived.layout == layer.layout


def _model(layout, rng):
    inp = keras.Input((32,))
    h = BlocksparseDense(layout, 8, activation="relu", name="sparse")(inp)
    out = keras.layers.Dense(3, name="head")(h)
    return keras.Model(inp, out)


def test_fit_save_and_reload(rng, tmp_path):
    keras.utils.set_random_seed(int(rng.integers(1 << 30)))
    layout = random_layout(rng, 4, 4, 0.5, cover=True)
    model = _model(layout, rng)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x = rng.standard_normal((256, 32)).astype(np.float32)
    y = np.tanh(x[:, :3] * 2.0 - x[:, 3:6]).astype(np.float32)
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=8, batch_size=32, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert after < 0.7 * before, (before, after)

    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert isinstance(reloaded.get_layer("sparse"), BlocksparseDense)
    np.testing.assert_array_equal(reloaded.predict(x, verbose=0), model.predict(x, verbose=0))
    for a, b in zip(reloaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_default_initializer_matches_the_layout_fans(rng):
    """Var(W) = 2 / (mean fan-in + mean fan-out), as Glorot for the dense equivalent."""
    layout = random_layout(rng, 16, 8, 0.4, cover=True)
    layer = BlocksparseDense(layout, 32)
    layer.build((None, 16 * 32))
    lay = layer.layout
    fan_in, fan_out = 32 * lay.blocks / lay.KB, 32 * lay.blocks / lay.CB
    var = np.var(layer.kernel.numpy())
    assert abs(var / (2.0 / (fan_in + fan_out)) - 1.0) < 0.05


def test_mixed_precision():
    layer = BlocksparseDense(np.ones((2, 2), int), 16, dtype="mixed_bfloat16")
    y = layer(tf.ones([3, 32]))
    assert y.dtype == tf.bfloat16 and layer.kernel.dtype == "float32"


def test_xla_fit(rng):
    model = _model(random_layout(rng, 4, 4, 0.5, cover=True), rng)
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    loss = model.fit(x, np.zeros((16, 3), np.float32), epochs=1, verbose=0).history["loss"][0]
    assert np.isfinite(loss)


BAD = {
    "block-size": (lambda: BlocksparseDense(np.ones((2, 2)), 7), ValueError, "block_size"),
    "empty-layout": (lambda: BlocksparseDense(np.zeros((2, 2)), 8), ValueError, "layout"),
    "use-bias": (lambda: BlocksparseDense(np.ones((2, 2)), 8, use_bias="yes"), TypeError, "use_bias"),
    "activation": (lambda: BlocksparseDense(np.ones((2, 2)), 8, activation="nope"), ValueError, "nope"),
    "input-features": (lambda: BlocksparseDense(np.ones((2, 2)), 8)(tf.ones([4, 15])), ValueError, "16"),
    "float64-policy": (lambda: BlocksparseDense(np.ones((2, 2)), 8, dtype="float64"), ValueError,
                       "dtype: BlocksparseDense computes in float32, float16 or bfloat16.*'float64'"),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_bad_arguments(case):
    call, error, match = case
    with pytest.raises(error, match=match):
        call()


def test_keras_masks_pass_through(rng):
    """As keras.layers.Dense: a mask over the batch axes (e.g. from Embedding(mask_zero=True))
    reaches the next layer."""
    from blocksparse.keras import PixelflyDense

    tokens = np.array([[3, 5, 0, 0], [1, 0, 0, 0]])
    for layer in (BlocksparseDense(np.ones((2, 2)), 8), PixelflyDense(16, 8)):
        inp = keras.Input((4,), dtype="int32")
        emb = keras.layers.Embedding(10, 16, mask_zero=True)(inp)
        out = layer(emb)
        assert out._keras_mask is not None
        mask = keras.Model(inp, out._keras_mask)(tokens)
        np.testing.assert_array_equal(np.asarray(mask), tokens != 0)


TORCH_SCRIPT = textwrap.dedent("""
    import numpy as np, keras, tempfile, os, torch
    assert keras.backend.backend() == "torch"
    from blocksparse.keras import BlocksparseDense
    from blocksparse.layout import Layout
    rng = np.random.default_rng({seed})
    keras.utils.set_random_seed({seed})
    layout = np.ones((4, 4), int); layout[rng.random((4, 4)) < 0.5] = 0; layout[np.arange(4), np.arange(4)] = 1
    inp = keras.Input((32,))
    out = keras.layers.Dense(3)(BlocksparseDense(layout, 8, activation="relu", name="sparse")(inp))
    model = keras.Model(inp, out)
    layer = model.get_layer("sparse")
    x = rng.standard_normal((256, 32)).astype("float32")
    w = Layout(layout, 8).dense(layer.kernel.numpy().astype(np.float64))
    want = np.maximum(x.astype(np.float64) @ w + layer.bias.numpy(), 0)
    got = keras.ops.convert_to_numpy(layer(x))
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want), "values"
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    y = np.tanh(x[:, :3] * 2.0 - x[:, 3:6]).astype("float32")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=8, batch_size=32, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert after < 0.7 * before, (before, after)
    path = os.path.join(tempfile.mkdtemp(), "m.keras")
    model.save(path)
    again = keras.saving.load_model(path)
    assert np.array_equal(again.predict(x, verbose=0), model.predict(x, verbose=0))
    import sys
    if sys.modules.get("tensorflow", 0) is None:  # TensorFlow not installed: the layer above never needed it
        try:
            from blocksparse.keras import PixelflyDense
            raise AssertionError("PixelflyDense imported without TensorFlow")
        except ImportError as exc:
            assert "TensorFlow" in str(exc), exc
    else:
        from blocksparse.pixelfly import PixelflyDense   # TensorFlow only: refused by name, pointing to torch's
        try:
            PixelflyDense(16, 8)
            raise AssertionError("PixelflyDense built on the torch backend")
        except NotImplementedError as exc:
            assert "tensorflow backend" in str(exc) and "PixelflyLinear" in str(exc), exc
    print("torch backend checked")
""")
#: Where TensorFlow is not installed (``import tensorflow`` raises ImportError).
WITHOUT_TF = "import sys; sys.modules['tensorflow'] = None\n"


@pytest.mark.parametrize("tensorflow", ["installed", "absent"])
def test_torch_backend(rng, tmp_path, tensorflow):
    pytest.importorskip("torch")
    env = dict(os.environ, KERAS_BACKEND="torch", PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    code = (WITHOUT_TF if tensorflow == "absent" else "") + TORCH_SCRIPT.format(seed=int(rng.integers(1 << 30)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "torch backend checked" in res.stdout
