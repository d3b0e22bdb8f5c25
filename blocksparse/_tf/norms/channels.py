"""Ops over the channel axis (axis 1) of ``(N, C, *spatial)`` tensors: batch norm and
``cwise_linear``, computed in float32 with TensorFlow ops.

Tensors are viewed as ``(N, C, P)`` with ``P`` the product of the spatial sizes (1 for ``(N, C)``);
channel vectors broadcast as ``(1, C, 1)``.
"""
from .. import tf
from ..ew.args import to_compute
from .moments import moments

__all__ = ["batch_norm", "batch_norm_inference", "cwise_linear"]


def _ncp(t, shape):
    """``t`` of shape ``shape`` (float32) as ``(N, C, P)``."""
    return tf.reshape(to_compute(t), tf.stack([shape[0], shape[1], -1]))


def _per_channel(v):
    return tf.reshape(to_compute(v), [1, -1, 1])


def batch_norm(x, g, b, epsilon):
    """Training-mode batch norm: ``(y, mean, var)`` with statistics over N and the spatial axes.

    ``mean`` and ``var`` (the biased variance) are float32 ``(C,)``; ``y`` is in the dtype of
    ``x``.  Differentiable in ``x``, ``g`` and ``b`` through all three outputs.
    """
    @tf.custom_gradient
    def blocksparse_batch_norm(x, g, b):
        shape = tf.shape(x)
        x3 = _ncp(x, shape)
        mean, var = moments(x3, axes=[0, 2])
        rstd = tf.math.rsqrt(var + epsilon)
        centred = x3 - mean[:, None]
        xhat = centred * rstd[:, None]
        y = tf.reshape(xhat * _per_channel(g) + _per_channel(b), shape)

        def grad(dy, dmean, dvar):
            shape = tf.shape(dy)  # not the forward's (XLA in a loop: see layer_norm's gradient)
            dy3 = _ncp(dy, shape)
            count = tf.cast(tf.shape(dy3)[0] * tf.shape(dy3)[2], tf.float32)   # N * P per channel
            dg = tf.reduce_sum(dy3 * xhat, axis=[0, 2])
            db = tf.reduce_sum(dy3, axis=[0, 2])
            scale = to_compute(g) * rstd
            dx = scale[:, None] * (dy3 - (db[:, None] + xhat * dg[:, None]) / count)
            if dmean is not None:  # the statistics are outputs too: their gradients flow to x
                dx += dmean[:, None] / count
            if dvar is not None:
                dx += 2.0 * dvar[:, None] * centred / count
            return (tf.cast(tf.reshape(dx, shape), x.dtype), tf.cast(dg, g.dtype),
                    tf.cast(db, b.dtype))

        return (tf.cast(y, x.dtype), mean, var), grad

    y, mean, var = blocksparse_batch_norm(x, g, b)
    y.set_shape(x.shape)
    return y, mean, var


def batch_norm_inference(x, g, b, m, v, epsilon):
    """``y = g * (x - m) / sqrt(v + epsilon) + b`` with given statistics, in the dtype of ``x``
    (TensorFlow's autodiff: differentiable in every input)."""
    shape = tf.shape(x)
    scale = _per_channel(g) * tf.math.rsqrt(_per_channel(v) + epsilon)
    y = (_ncp(x, shape) - _per_channel(m)) * scale + _per_channel(b)
    y = tf.cast(tf.reshape(y, shape), x.dtype)
    y.set_shape(x.shape)
    return y


def cwise_linear(x, a, b):
    """``a * x + b`` with ``a`` and ``b`` (either may be None) per channel, in the dtype of ``x``."""
    shape = tf.shape(x)
    y = _ncp(x, shape)
    if a is not None:
        y = y * _per_channel(a)
    if b is not None:
        y = y + _per_channel(b)
    y = tf.cast(tf.reshape(y, shape), x.dtype)
    y.set_shape(x.shape)
    return y
