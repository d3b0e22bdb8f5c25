"""Reference ``layer_norm`` with TensorFlow ops: float32 statistics and one fused gradient.

The input is viewed as ``(outer, S, K, inner)``: ``outer`` the dimensions before the feature
axis, ``S`` the segments, ``K = C / S`` the features of a segment and ``inner`` the dimensions
after the feature axis.  Every ``(outer, S, inner)`` slice of ``K`` features is normalised on its
own.  Features last (``(N, C)``) gives ``inner = 1``; features first (``(C, N)``) ``outer = 1``.
"""
from .. import tf
from ..ew.args import to_compute
from .moments import moments

__all__ = ["layer_norm"]


def _segmented(t, shape, axis, segments):
    """``t`` of shape ``shape`` as ``(outer, S, K, inner)`` (see the module docstring)."""
    outer = tf.reduce_prod(shape[:axis])
    inner = tf.reduce_prod(shape[axis + 1:])
    return tf.reshape(t, tf.stack([outer, segments, shape[axis] // segments, inner]))


def layer_norm(x, g, b, axis, segments, epsilon, relu):
    """``y = relu?(g * (x - mean) / sqrt(var + epsilon) + b)`` over ``K`` features per segment.

    ``x``: checked tensor of known rank with ``C`` (a multiple of ``segments``) on ``axis``;
    ``g``, ``b``: ``(C,)`` float tensors of any float dtype.  ``y`` in the dtype of ``x``; the
    gradients in the dtypes of ``x``, ``g`` and ``b``.
    """
    @tf.custom_gradient
    def blocksparse_layer_norm(x, g, b):
        shape = tf.shape(x)
        x4 = _segmented(to_compute(x), shape, axis, segments)
        g4 = tf.reshape(to_compute(g), [1, segments, -1, 1])
        b4 = tf.reshape(to_compute(b), [1, segments, -1, 1])
        mean, var = moments(x4, axes=[2], keepdims=True)
        rstd = tf.math.rsqrt(var + epsilon)
        xhat = (x4 - mean) * rstd
        y4 = xhat * g4 + b4
        if relu:
            y4 = tf.nn.relu(y4)

        def grad(dy):
            # the shape from dy, not the forward's: under XLA inside a loop a value carried over from
            # the forward is a run-time value, which a reshape cannot take as its shape
            shape = tf.shape(dy)
            dy4 = _segmented(to_compute(dy), shape, axis, segments)
            if relu:
                dy4 = tf.where(y4 > 0, dy4, 0.0)
            dg = tf.reduce_sum(dy4 * xhat, axis=[0, 3])
            db = tf.reduce_sum(dy4, axis=[0, 3])
            dxhat = dy4 * g4
            # d/dx of (x - mean) * rstd, applied to dxhat: remove its mean and its xhat component
            dx4 = rstd * (dxhat - tf.reduce_mean(dxhat, axis=2, keepdims=True)
                          - xhat * tf.reduce_mean(dxhat * xhat, axis=2, keepdims=True))
            return (tf.cast(tf.reshape(dx4, shape), x.dtype),
                    tf.cast(tf.reshape(dg, [-1]), g.dtype),
                    tf.cast(tf.reshape(db, [-1]), b.dtype))

        return tf.cast(tf.reshape(y4, shape), x.dtype), grad

    y = blocksparse_layer_norm(x, g, b)
    y.set_shape(x.shape)
    return y
