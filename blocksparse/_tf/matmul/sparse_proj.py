"""Reference path of ``SparseProj``: feature-axis-0 gathers and scatters with TensorFlow ops.

``index`` is the gather table (``nproj`` distinct rows of the ``nhidden`` axis).  All tensors
have the feature axis first, any trailing shape.  Gradients are dense tensors, as in the
original package (TensorFlow's own gather would hand back ``IndexedSlices``).
"""
from .. import tf

__all__ = ["gather", "scatter", "scatter_add", "scatter_mul"]


def _rows(index):
    return tf.constant(index.reshape(-1, 1), dtype=tf.int32)


def scatter(x, index, nhidden):
    """``z[index[i]] = x[i]``, zeros in the rows no ``index`` entry names; ``(nproj, ...) -> (nhidden, ...)``."""
    shape = tf.concat([[nhidden], tf.shape(x)[1:]], axis=0)
    return tf.scatter_nd(_rows(index), x, shape)


def gather(x, index, nhidden):
    """``z[i] = x[index[i]]``; ``(nhidden, ...) -> (nproj, ...)``."""
    @tf.custom_gradient
    def sparse_proj_gather(x):
        def grad(dz):
            return scatter(dz, index, nhidden)
        return tf.gather(x, index), grad

    return sparse_proj_gather(x)


def scatter_add(x, y, index):
    """``z = x`` with ``z[index[i]] += y[i]``."""
    return tf.tensor_scatter_nd_add(x, _rows(index), y)


def scatter_mul(x, y, index):
    """``z = x`` with ``z[index[i]] *= y[i]``; rows no ``index`` entry names pass through."""
    factor = tf.tensor_scatter_nd_update(tf.ones_like(x), _rows(index), y)
    return x * factor
