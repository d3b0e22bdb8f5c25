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


def _checkpoint(layer, path):
    import tensorflow as tf

    return tf.train.Checkpoint(layer=layer).save(str(path))


@pytest.mark.parametrize("kind", ["dense", "pixelfly"])
def test_tensorflow_checkpoint_checks_the_layout(rng, tmp_path, kind):
    """``tf.train.Checkpoint`` holds the record too: same blocks restore (values equal), another
    layout with as many blocks is refused."""
    import tensorflow as tf

    if kind == "dense":
        a, b = _moved(rng)
        make, feats = (lambda m: BlocksparseDense(m, 8)), 24
    else:
        a, b = 1, 2  # n_factors: 24 and 16 blocks, then one factor of another butterfly size
        make, feats = (lambda n: PixelflyDense(64, block_size=8, butterfly_size=4, n_factors=n)), 32
    x = rng.standard_normal((3, feats)).astype("float32")
    src = make(a)
    want = np.asarray(src(x))
    path = _checkpoint(src, tmp_path / "ckpt")
    twin = make(a)
    twin.build((None, feats))
    tf.train.Checkpoint(layer=twin).restore(path).assert_consumed()
    np.testing.assert_array_equal(np.asarray(twin(x)), want)
    other = make(b)
    other.build((None, feats))
    with pytest.raises(ValueError, match=r"block structure mismatch for layer '.*'"):
        tf.train.Checkpoint(layer=other).restore(path)


def test_tensorflow_checkpoint_without_record_restores(rng, tmp_path, monkeypatch):
    """A checkpoint written without the record (an earlier version) restores, every object matched."""
    import tensorflow as tf

    from blocksparse._blockstate import KerasBlockState

    a, _ = _moved(rng)
    src = BlocksparseDense(a, 8)
    src.build((None, 24))
    with monkeypatch.context() as m:
        m.delattr(KerasBlockState, "_serialize_to_tensors")
        m.delattr(KerasBlockState, "_restore_from_tensors")
        path = _checkpoint(src, tmp_path / "old")
    assert not any("blocksparse_blocks" in name for name, _ in tf.train.list_variables(path))
    dst = BlocksparseDense(a, 8)
    dst.build((None, 24))
    tf.train.Checkpoint(layer=dst).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(dst.kernel.numpy(), src.kernel.numpy())
