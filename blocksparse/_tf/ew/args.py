"""Argument checks of the elementwise, normalisation and gate ops (the TensorFlow frontend).

Static facts are checked when an op is built (``TypeError`` / ``ValueError`` naming the argument,
expected vs got); sizes unknown until the graph runs become assertions that raise
``tf.errors.InvalidArgumentError`` then (see :mod:`blocksparse._tf.checks`).
"""
import numbers

import numpy as np

from .. import tf
from ..checks import float_tensor, holds_tensors, op_name, parameter_tensor, same_dtype, shape_guard, tensor_like

__all__ = ["channel_vector", "channels_first", "divisible_by_4", "feature_axis", "feature_size", "known_rank",
           "op_name", "operand_pair", "real", "same_shape", "to_compute"]


def to_compute(t):
    """``t`` in the dtype the ops compute in: float16 / bfloat16 widened to float32."""
    return t if t.dtype == tf.float32 else tf.cast(t, tf.float32)


def real(value, name, *, low=None, high=None, low_open=False):
    """``value`` (a Python or numpy real number) as a float, within ``[low, high]`` (``(low, high]``
    with ``low_open``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {value!r} of type {type(value).__name__}")
    value = float(value)
    bounds = [] if low is None else [f"{'>' if low_open else '>='} {low}"]
    bounds += [] if high is None else [f"<= {high}"]
    inside = (low is None or (value > low if low_open else value >= low)) and (high is None or value <= high)
    if not (np.isfinite(value) and inside):
        raise ValueError(f"{name} must be a finite number{' ' if bounds else ''}{' and '.join(bounds)}; "
                         f"got {value}")
    return value


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def operand_pair(x, y):
    """The operands of a binary op as tensors, and the dtype of its result.

    A constant -- a Python number, a (nested) list or tuple of numbers, a numpy array or scalar --
    beside a tensor takes the tensor's dtype, as TensorFlow's own ops convert it (``ew.add(x, 1.0)``
    and ``ew.add(x, [1.0, 2.0])`` work for a float16 ``x``).  Beside a 16-bit tensor it is held as
    float32: the op computes in float32 and rounds once, so ``ew.divide(x, 1e5)`` does not divide by
    1e5 rounded to 16 bits (or to infinity).  Tensors share their dtype, or one is float32 beside a
    float16 / bfloat16 one (a float32 bias or gain with half-precision activations, as the original
    took them): the op computes in float32 and returns the 16-bit dtype; the float32 operand's
    gradient is float32.  Their static shapes must broadcast.
    """
    if _is_constant(y) and not _is_constant(x):
        x = float_tensor(x, "x")
        dtype, y = x.dtype, _constant(y, _number_dtype(x.dtype), "y")
    elif _is_constant(x) and not _is_constant(y):
        y = float_tensor(y, "y")
        dtype, x = y.dtype, _constant(x, _number_dtype(y.dtype), "x")
    else:
        x, y = float_tensor(x, "x"), float_tensor(y, "y")
        dtype = _mixed_dtype(x.dtype, y.dtype)
        if dtype is None:
            same_dtype(x, y, "x", "y")
            dtype = x.dtype
    try:
        tf.broadcast_static_shape(x.shape, y.shape)
    except ValueError:
        raise ValueError(f"x and y must have shapes that broadcast (TensorFlow's rules); got x "
                         f"{_text(x.shape)} and y {_text(y.shape)}") from None
    return x, y, dtype


def _mixed_dtype(a, b):
    """The 16-bit dtype of a float16 / bfloat16 tensor beside a float32 one (a float32 bias or gain
    with half-precision activations, as the original's ops took them), else None."""
    a, b = a.base_dtype, b.base_dtype
    if a == tf.float32 and b in (tf.float16, tf.bfloat16):
        return b
    if b == tf.float32 and a in (tf.float16, tf.bfloat16):
        return a
    return None


def _is_constant(value):
    """A value TensorFlow's binary ops convert to the other operand's dtype: a number, a list or
    tuple, a numpy array or scalar (not a tensor or variable)."""
    return _is_number(value) or isinstance(value, (np.ndarray, np.generic)) or (
        isinstance(value, (list, tuple)) and not holds_tensors(value))


def _constant(value, dtype, name):
    """The constant ``value`` as a ``dtype`` tensor; its elements must be real numbers."""
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a tensor or real numbers (a number, a list of numbers, a numpy "
                        f"array); got {type(value).__name__} of dtype {array.dtype}")
    return tf.constant(array, dtype=dtype)


def _number_dtype(dtype):
    """The dtype a Python number is held in beside a tensor of ``dtype``: float32 for 16-bit ones."""
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _text(shape):
    if shape.rank is None:
        return "<unknown rank>"
    return "(" + ", ".join("None" if d is None else str(d) for d in shape.as_list()) + ")"


def known_rank(t, name, minimum=1):
    """The static rank of ``t``; it must be known and at least ``minimum``."""
    rank = t.shape.rank
    if rank is None:
        raise ValueError(f"{name} must have a known rank (at least {minimum}); got a tensor of "
                         "unknown rank: give the placeholder or input signature a shape")
    if rank < minimum:
        raise ValueError(f"{name} must have rank >= {minimum}; got rank {rank} with shape {_text(t.shape)}")
    return rank


def feature_axis(axis, rank, name="axis"):
    """``axis`` (an int in ``[-rank, rank)``) as a non-negative axis of a rank-``rank`` tensor."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {axis!r} of type {type(axis).__name__}")
    if not -rank <= axis < rank:
        raise ValueError(f"{name} must be in [{-rank}, {rank}) for a rank-{rank} input; got {axis}")
    return int(axis) % rank


def feature_size(t, axis, name):
    """The static size of ``t`` on ``axis``; it must be known."""
    size = t.shape[axis]
    if size is None:
        raise ValueError(f"{name} must have a known size on the feature axis {axis}; got shape "
                         f"{_text(t.shape)}")
    return size


def divisible_by_4(x, name):
    """``x`` (checked, known rank) after checking its last dimension is divisible by 4 (at run time
    where it is unknown now, so that the error names ``name``), e.g. to split it in four."""
    width = x.shape[-1]
    if width is not None and width % 4:
        raise ValueError(f"{name} must have a last dimension divisible by 4; got shape "
                         f"{_text(x.shape)}")
    if width is None and not tf.executing_eagerly():
        whole = tf.concat([tf.shape(x)[:-1], tf.shape(x)[-1:] // 4 * 4], 0)
        x = shape_guard(x, whole, f"{name} must have a last dimension divisible by 4")
    return x


def channels_first(x):
    """``x`` as a float tensor ``(N, C, *spatial)`` with a known ``C``, and ``C``."""
    x = float_tensor(x, "x")
    known_rank(x, "x", minimum=2)
    return x, feature_size(x, 1, "x (N, C, ...)")


def same_shape(t, ref, name, ref_name):
    """``t``, after checking it has the shape of ``ref`` (at run time for sizes unknown now)."""
    if t.shape.rank is not None and ref.shape.rank is not None:
        if not t.shape.is_compatible_with(ref.shape):
            raise ValueError(f"{name} must have the shape of {ref_name} {_text(ref.shape)}; got "
                             f"{_text(t.shape)}")
        if t.shape.is_fully_defined() and ref.shape.is_fully_defined():
            return t
    if tf.executing_eagerly():
        return t
    return shape_guard(t, tf.shape(ref), f"{name} must have the shape of {ref_name}")


def channel_vector(value, size, name, what):
    """``value`` as a float tensor of shape ``(size,)``.

    ``(size,)`` is the documented shape; any shape holding ``size`` elements along one axis and
    ones elsewhere (``(1, C, 1, 1)``, ``(C, 1)``, as the original package accepted) is flattened.
    ``what`` says which axis of which input ``size`` comes from, for error messages.  Numpy arrays
    and Python lists are parameters computed in float32 anyway: they are converted to float32, as
    are float64 tensors (their gradients come back in float64).
    """
    if tensor_like(value) is not None:
        value = tensor_like(value)
    if isinstance(value, (tf.Tensor, tf.Variable)) and value.dtype.base_dtype == tf.float64:
        value = tf.cast(value, tf.float32)   # "any float dtype": computed in float32 anyway
    v = parameter_tensor(value, name)
    shape = v.shape
    if shape.rank is not None and shape.is_fully_defined():
        dims = shape.as_list()
        if int(np.prod(dims)) != size or sum(d != 1 for d in dims) > 1:
            raise ValueError(f"{name} must have shape ({size},) ({what}); got {_text(shape)}")
        return tf.reshape(v, [size]) if dims != [size] else v
    if shape.rank is not None and sum(d not in (None, 1) for d in shape.as_list()) > 1:
        raise ValueError(f"{name} must have shape ({size},) ({what}); got {_text(shape)}")
    # (only graphs get here: eager tensors have their shapes.)  `size` elements along one axis, ones
    # elsewhere: the flat vector must hold `size`, and is held to length 0 (an error) where its
    # elements span several axes.  Not reshape(v, [size]): Grappler takes that reshape as a fact
    # about v and folds the checks away, so a wrong size would broadcast silently.
    one_axis = tf.equal(tf.reduce_max(tf.concat([tf.shape(v), [1]], 0)), size)  # (not ==: identity in v1 graphs)
    v = shape_guard(tf.reshape(v, [-1]), tf.where(one_axis, [size], [0]), f"{name} must have shape ({size},) ({what})")
    v.set_shape([size])
    return v
