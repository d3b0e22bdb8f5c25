"""``dropout`` whose mask is an output, so that a recomputed forward pass can reuse it."""
from .. import tf
from .args import to_compute

__all__ = ["apply_mask", "make_mask"]


def make_mask(x, keep_prob, seed):
    """A boolean mask of the shape of ``x``: each element true with probability ``keep_prob``
    (drawn with TensorFlow's random ops, so ``tf.random.set_seed`` and ``seed`` make it
    reproducible)."""
    return tf.random.uniform(tf.shape(x), dtype=tf.float32, seed=seed) < keep_prob


def apply_mask(x, mask, keep_prob):
    """``x * mask / keep_prob`` in float32, returned in the dtype of ``x``; the gradient is
    ``dy * mask / keep_prob`` (none for the mask or ``keep_prob``)."""
    # dropped elements are 0 * keep_prob: NaN where an invalid keep_prob tensor was made NaN (XLA,
    # which drops its assertion), never a silent zero
    dropped = 0.0 * keep_prob

    def scaled(t, mask):
        return tf.where(mask, to_compute(t) / keep_prob, dropped)

    @tf.custom_gradient
    def blocksparse_dropout(x):
        def grad(dy):
            return tf.cast(scaled(dy, mask), x.dtype)

        return tf.cast(scaled(x, mask), x.dtype), grad

    return blocksparse_dropout(x)
