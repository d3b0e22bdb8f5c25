"""Mean and biased variance over some axes, exact for constant slices."""
from .. import tf


def moments(x, axes, keepdims=False):
    """``(mean, var)`` of float32 ``x`` over ``axes``.

    The float32 mean of a constant slice can be an ulp off the constant (its sum rounds), which
    makes ``x - mean`` an ulp instead of 0 and, with a small epsilon, ``(x - mean) / sqrt(var +
    epsilon)`` of order one; one correction by the mean of the deviations makes it exact (as
    PyTorch's Welford statistics are).
    """
    mean = tf.reduce_mean(x, axis=axes, keepdims=True)
    mean += tf.reduce_mean(x - mean, axis=axes, keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=axes, keepdims=True)
    if not keepdims:
        mean, var = tf.squeeze(mean, axes), tf.squeeze(var, axes)
    return mean, var
