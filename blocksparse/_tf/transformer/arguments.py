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
            got = tf.pad(tf.shape(t), [[0, 3]])[:3]
            whole = tf.concat([got[:2], got[2:] // base.heads * base.heads], 0)
            t = checks.shape_guard(t, whole, f"{name} must have shape (batch, {ctx_name}, heads * head_dim): "
                                             f"its features must be a multiple of heads = {base.heads}")
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
        else:  # a's shape with b's size on the axis (an op that XLA cannot compile unless they agree)
            want = tf.tensor_scatter_nd_update(tf.shape(a), [[axis]], tf.shape(b)[axis:axis + 1])
            a = checks.shape_guard(a, want, f"{name_a} and {name_b} must have the same {what}")
    return checks.checked(a, runtime), b


def _scalar(t, name, what):
    """``t``, a tensor of ``what``, checked to be a scalar: at build time where its rank is known,
    else when the graph runs."""
    if t.shape.rank not in (0, None) or not (t.dtype.is_floating if what == "float" else t.dtype.is_integer):
        kind = "a real number or a scalar float tensor" if what == "float" else "an int or a scalar integer tensor"
        raise TypeError(f"{name} must be {kind}; got a {t.dtype.name} tensor of shape {t.shape}")
    if t.shape.rank is None:  # (under XLA, which drops the assertion, the reshape fails to compile)
        with tf.control_dependencies([tf.debugging.assert_rank(t, 0, message=f"{name} must be a scalar")]):
            t = tf.reshape(t, [])
    return t


def scale(value):
    """``(float32 scalar tensor, is_tensor)``: a real number or a scalar float tensor."""
    t = checks.tensor_like(value)
    if t is not None:
        return tf.cast(_scalar(t, "scale", "float"), tf.float32), True
    return tf.constant(check_scale(value), tf.float32), False


def autoregress_at_key(value):
    """None, or an int32 scalar: an int >= 0 or a scalar integer tensor."""
    t = checks.tensor_like(value)
    if t is not None:
        value = _scalar(t, "autoregress_at_key", "int")
        check = tf.debugging.assert_non_negative(value, message="autoregress_at_key must be >= 0")
        if value.dtype.max > _INT32_MAX:  # past every key alike: clamped before the cast could wrap it
            value = tf.minimum(value, tf.constant(_INT32_MAX, value.dtype))
        value = tf.cast(value, tf.int32)
        with tf.control_dependencies([check]):
            return tf.identity(value)
    value = check_autoregress_at_key(value)
    return None if value is None else tf.constant(min(value, _INT32_MAX), tf.int32)


_INT32_MAX = 2 ** 31 - 1
