"""Argument checks of the TensorFlow ``BlocksparseTransformer``.

What is known when the op is built is checked then (``TypeError`` / ``ValueError`` with the
frontend's messages); sizes unknown until the graph runs become assertions
(``tf.errors.InvalidArgumentError``) that the result depends on.
"""
from ...ops.transformer.frontend import check_autoregress_at_key, check_scale
from .. import checks, tf

__all__ = ["autoregress_at_key", "dense", "pair", "scale", "scores"]


def _static(t):
    return tuple(t.shape.as_list()) if t.shape.rank is not None else None


def dense(base, value, name, ctx, ctx_name):
    """Activations ``(batch, ctx, heads * head_dim)`` as a float tensor, checked."""
    t = checks.float_tensor(value, name)
    shape = _static(t)
    error = base.dense_shape_error(name, shape, ctx, ctx_name) if shape is not None else None
    if error:
        raise ValueError(error)
    hint = f" = (batch, {ctx_name}, heads * head_dim)"
    runtime = checks.shape_assertions(t, (None, ctx, None), name, rank_hint=hint)
    if shape is None or shape[2] is None:
        with tf.control_dependencies(runtime):
            runtime.append(tf.debugging.assert_equal(
                tf.shape(t)[2] % base.heads, 0,
                message=f"{name} must have shape (batch, {ctx_name}, heads * head_dim): its features must be "
                        f"a multiple of heads = {base.heads}"))
    return checks.checked(t, runtime)


def scores(base, value, name):
    """Packed scores ``w_shape(batch)`` as a float tensor, checked."""
    t = checks.float_tensor(value, name)
    shape = _static(t)
    error = base.scores_shape_error(name, shape) if shape is not None else None
    if error:
        raise ValueError(error)
    runtime = checks.shape_assertions(t, base.w_shape(None), name, rank_hint=" = (batch, heads, blocks, bs, bs)")
    return checks.checked(t, runtime)


def pair(a, b, name_a, name_b, same_features=False):
    """``(a, b)`` after checking they agree on dtype and batch (and features, if asked)."""
    checks.same_dtype(a, b, name_a, name_b)
    axes = [(0, "batch size")] + ([(2, "features (heads * head_dim)")] if same_features else [])
    runtime = []
    for axis, what in axes:
        da, db = a.shape[axis], b.shape[axis]
        if da is not None and db is not None:
            if da != db:
                raise ValueError(f"{name_a} and {name_b} must have the same {what}; got {da} and {db}")
        else:
            runtime.append(tf.debugging.assert_equal(
                tf.shape(a)[axis], tf.shape(b)[axis], message=f"{name_a} and {name_b} must have the same {what}"))
    return checks.checked(a, runtime), b


def scale(value):
    """``(float32 scalar tensor, is_tensor)``: a real number or a scalar float tensor."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        if value.shape.rank not in (0, None) or not value.dtype.is_floating:
            raise TypeError(f"scale must be a real number or a scalar float tensor; got a {value.dtype.name} "
                            f"tensor of shape {value.shape}")
        return tf.cast(value, tf.float32), True
    return tf.constant(check_scale(value), tf.float32), False


def autoregress_at_key(value):
    """None, or an int32 scalar: an int >= 0 or a scalar integer tensor."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        if value.shape.rank not in (0, None) or not value.dtype.is_integer:
            raise TypeError(f"autoregress_at_key must be an int or a scalar integer tensor; got a "
                            f"{value.dtype.name} tensor of shape {value.shape}")
        check = tf.debugging.assert_non_negative(value, message="autoregress_at_key must be >= 0")
        if value.dtype.max > _INT32_MAX:  # past every key alike: clamped before the cast could wrap it
            value = tf.minimum(value, tf.constant(_INT32_MAX, value.dtype))
        value = tf.cast(value, tf.int32)
        with tf.control_dependencies([check]):
            return tf.identity(value)
    value = check_autoregress_at_key(value)
    return None if value is None else tf.constant(min(value, _INT32_MAX), tf.int32)


_INT32_MAX = 2 ** 31 - 1
