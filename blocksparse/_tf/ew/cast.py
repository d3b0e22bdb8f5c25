"""``float_cast``: a cast whose gradient is rounded to a chosen precision on its way back."""
from .. import tf

__all__ = ["float_cast"]


def float_cast(x, dtype, dx_dtype):
    """``x`` cast to ``dtype``; the gradient ``dx`` is rounded to ``dx_dtype`` and returned in the
    dtype of ``x`` (TensorFlow's autodiff needs a gradient in its input's dtype)."""
    if dx_dtype == x.dtype:
        return tf.identity(x) if dtype == x.dtype else tf.cast(x, dtype)

    @tf.custom_gradient
    def blocksparse_float_cast(x):
        def grad(dy):
            return tf.cast(tf.cast(dy, dx_dtype), x.dtype)

        return (tf.identity(x) if dtype == x.dtype else tf.cast(x, dtype)), grad

    return blocksparse_float_cast(x)
