"""Weight helpers of ``BlocksparseMatMul``: initializers and weight normalisation."""
import numpy as np

from .. import tf
from ..checks import float_dtype

__all__ = ["InitialValue", "NumpyInitializer", "l2_normalize"]


class InitialValue(np.ndarray):
    """A numpy array (what the original's initializers returned) that also answers ``.numpy()``,
    as an eager tensor would."""

    def numpy(self):
        return np.asarray(self)


class NumpyInitializer:
    """An initializer for packed block-sparse weights whose values numpy computes.

    Usable as ``tf.compat.v1.get_variable(..., initializer=init)`` and as ``init(shape, dtype)``
    in TF2 (e.g. ``tf.Variable(init(bsmm.w_shape, tf.float32))``); returns a numpy array, as the
    original's initializers did (so ``tf.constant(init())`` works in ``tf.compat.v1`` graphs too),
    an :class:`InitialValue`.

    Parameters
    ----------
    make : callable
        ``make() -> np.ndarray`` of shape ``w_shape``, called once per initialisation.
    w_shape : tuple of int
        The only shape this initializer produces.
    name : str
        Used in error messages.
    """

    def __init__(self, make, w_shape, name):
        self._make = make
        self.w_shape = tuple(w_shape)
        self.name = name

    def __call__(self, shape=None, dtype=None, partition_info=None, **kwargs):
        del partition_info, kwargs  # accepted for tf.compat.v1 / Keras callers; unused
        if shape is not None:
            got = tuple(tf.TensorShape(shape).as_list())
            if got != self.w_shape:
                raise ValueError(f"{self.name}: shape must be the layout's w_shape {self.w_shape}; "
                                 f"got {got}")
        dtype = tf.float32 if dtype is None else float_dtype(dtype, f"{self.name}: dtype")
        return self._make().astype(dtype.as_numpy_dtype).view(InitialValue)

    def get_config(self):
        return {"w_shape": self.w_shape, "name": self.name}


def l2_normalize(w, layout, gain, epsilon, dtype):
    """Normalise each output feature of ``w`` over all blocks of its layout column.

    ``out[b, :, j] = w[b, :, j] / sqrt(max(sum_{b' in column k} sum_i w[b', i, j]^2, epsilon))``
    for block ``b`` in layout column ``k``, times ``gain[k*bs + j]`` when a gain is given.
    Computed in float32 and returned in ``dtype``; differentiable with respect to ``w`` and
    ``gain``.
    """
    bs = layout.block_size
    k = layout.updat[:, 1]
    w32 = tf.cast(w, tf.float32)
    sum_sq = tf.math.unsorted_segment_sum(tf.reduce_sum(tf.square(w32), axis=1), k, layout.KB)
    scale = tf.math.rsqrt(tf.maximum(sum_sq, epsilon))                 # (KB, bs)
    if gain is not None:
        scale = scale * tf.reshape(tf.cast(gain, tf.float32), [layout.KB, bs])
    out = w32 * tf.gather(scale, k)[:, None, :]                        # (blocks, bs, bs)
    return tf.cast(out, dtype)
