"""Reference path of ``SparseProj``: feature-axis-0 gathers and scatters with TensorFlow ops.

``index`` is the gather table (``nproj`` distinct rows of the ``nhidden`` axis).  All tensors
have the feature axis first, any trailing shape.  Gradients are dense tensors, as in the
original package (TensorFlow's own gather would hand back ``IndexedSlices``).
"""
import numpy as np

from .. import tf

__all__ = ["gather", "scatter", "scatter_add", "scatter_mul"]


def _spread(x, index, nhidden, fill):
    """``(nproj, ...) -> (nhidden, ...)``: row ``index[i]`` is ``x[i]``, the other rows ``fill``.  A
    gather through the inverse table (TensorFlow's scatters refuse empty trailing axes); its
    gradient is the dense gather of the rows."""
    inverse = np.full(nhidden, len(index), dtype=np.int32)
    inverse[np.asarray(index)] = np.arange(len(index), dtype=np.int32)

    @tf.custom_gradient
    def sparse_proj_spread(x):
        padded = tf.concat([x, tf.fill(tf.concat([[1], tf.shape(x)[1:]], axis=0), tf.cast(fill, x.dtype))], axis=0)
        return tf.gather(padded, inverse), lambda dz: tf.gather(dz, index)

    return sparse_proj_spread(x)


def scatter(x, index, nhidden):
    """``z[index[i]] = x[i]``, zeros in the rows no ``index`` entry names; ``(nproj, ...) -> (nhidden, ...)``."""
    return _spread(x, index, nhidden, 0)


def gather(x, index, nhidden):
    """``z[i] = x[index[i]]``; ``(nhidden, ...) -> (nproj, ...)``."""
    @tf.custom_gradient
    def sparse_proj_gather(x):
        def grad(dz):
            return scatter(dz, index, nhidden)
        return tf.gather(x, index), grad

    return sparse_proj_gather(x)


def scatter_add(x, y, index, nhidden):
    """``z = x`` with ``z[index[i]] += y[i]``."""
    return x + _spread(y, index, nhidden, 0)


def scatter_mul(x, y, index, nhidden):
    """``z = x`` with ``z[index[i]] *= y[i]``; rows no ``index`` entry names pass through."""
    return x * _spread(y, index, nhidden, 1)
