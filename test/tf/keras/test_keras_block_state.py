"""Saved Keras weights hold the block structure: they load into a layer with the same blocks and are
refused (ValueError naming the layer and the difference) by one of another layout with as many
blocks; a store without the record loads as before."""
import keras
import numpy as np
import pytest

from blocksparse.keras import BlocksparseDense, PixelflyDense


def _model(layer, features):
    return keras.Sequential([keras.Input((features,)), layer])


def _moved(rng):
    """Two different 3 x 4 masks with as many blocks."""
    a = rng.random((3, 4)) < 0.5
    a[0, 0], a[0, 1] = True, False
    b = a.copy()
    b[0, 0], b[0, 1] = False, True
    return a.astype(int), b.astype(int)


def test_weights_file_checks_the_layout(rng, tmp_path):
    a, b = _moved(rng)
    src = _model(BlocksparseDense(a, 8), 24)
    path = str(tmp_path / "w.weights.h5")
    src.save_weights(path)
    twin = _model(BlocksparseDense(a, 8), 24)
    twin.load_weights(path)
    x = rng.standard_normal((3, 24)).astype("float32")
    np.testing.assert_array_equal(np.asarray(twin(x)), np.asarray(src(x)))
    with pytest.raises(ValueError, match=r"block structure mismatch for layer '.*': weight block \d+ sits at"):
        _model(BlocksparseDense(b, 8), 24).load_weights(path)


def test_block_order_counts(tmp_path):
    mask = np.ones((4, 4), int)
    path = str(tmp_path / "w.weights.h5")
    _model(BlocksparseDense(mask, 8), 32).save_weights(path)
    with pytest.raises(ValueError, match="block structure mismatch"):
        _model(BlocksparseDense(mask, 8, z_order=True), 32).load_weights(path)


def test_keras_file_round_trip(rng, tmp_path):
    a, _ = _moved(rng)
    src = _model(BlocksparseDense(a, 8), 24)
    path = str(tmp_path / "m.keras")
    src.save(path)
    back = keras.models.load_model(path)
    x = rng.standard_normal((2, 24)).astype("float32")
    np.testing.assert_array_equal(np.asarray(back(x)), np.asarray(src(x)))


def test_pixelfly_factors_differ(tmp_path):
    src = _model(PixelflyDense(64, block_size=8, butterfly_size=4), 32)
    path = str(tmp_path / "p.weights.h5")
    src.save_weights(path)
    _model(PixelflyDense(64, block_size=8, butterfly_size=4), 32).load_weights(path)
    with pytest.raises(ValueError, match="block structure mismatch.*24 set.*16 set"):
        _model(PixelflyDense(64, block_size=8, butterfly_size=4, n_factors=1), 32).load_weights(path)


def test_store_without_record_loads(rng):
    a, b = _moved(rng)
    src, dst = BlocksparseDense(a, 8), BlocksparseDense(b, 8)
    src.build((None, 24))
    dst.build((None, 24))
    store = {}
    src.save_own_variables(store)
    assert "blocksparse_blocks" in store
    del store["blocksparse_blocks"]
    dst.load_own_variables(store)
    np.testing.assert_array_equal(dst.kernel.numpy(), src.kernel.numpy())
