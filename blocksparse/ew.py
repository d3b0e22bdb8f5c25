"""Elementwise ops for TensorFlow (the original ``blocksparse.ew`` / ``blocksparse.ewops`` API).

>>> import tensorflow as tf
>>> from blocksparse import ew
>>> x = tf.constant([[-1.0, 0.5]], tf.float16)
>>> ew.relu(ew.add(x, 1.0)).numpy().tolist()
[[0.0, 1.5]]

The same as TensorFlow's ops, with the original's "custom precision formats": float16 and
bfloat16 inputs are computed in float32 and rounded once, so results are as accurate as the
format allows; gradients (in the input's dtype) use TensorFlow's float32 formulas, which lose the
far tails (``tanh``'s at ``x = 8``, about ``4.5e-7``, comes out 0: ``1 - tanh(x)**2`` cancels).  Every op takes float32, float16 or
bfloat16 tensors and works in eager mode, inside ``tf.function`` (unknown sizes allowed) and in
``tf.compat.v1`` graphs, on any device and under XLA.  ``name`` is the ops' name scope.

The fused LSTM gates (``fused_lstm_gates``, ``split4``, ``concat4``) live in
:mod:`blocksparse.lstm` and are re-exported here, as the original's README lists them.
"""
import numbers

import numpy as np

from ._tf import tf
from ._tf.checks import float_dtype, float_tensor, same_dtype, tensor_like
from ._tf.ew import args, math
from ._tf.ew.cast import float_cast as _float_cast
from ._tf.ew.dropout import apply_mask, make_mask
from .lstm import concat4, fused_lstm_gates, split4

__all__ = ["add", "multiply", "subtract", "divide", "maximum", "minimum",
           "negative", "reciprocal", "square", "sqrt", "exp", "log", "sigmoid", "tanh", "relu",
           "elu", "gelu", "swish", "fast_gelu",
           "fused_lstm_gates", "split4", "concat4", "float_cast", "dropout", "add_n8"]


def _binary(op, x, y, name, default):
    with tf.name_scope(args.op_name(name, default)):
        return math.binary(op, *args.operand_pair(x, y))


def _unary(op, x, name, default, *params):
    with tf.name_scope(args.op_name(name, default)):
        return math.unary(op, float_tensor(x, "x"), *params)


def add(x, y, name=None):
    """``x + y`` with TensorFlow's broadcasting (a Python number takes the other's dtype)."""
    return _binary("add", x, y, name, "Add")


def multiply(x, y, name=None):
    """``x * y`` with TensorFlow's broadcasting."""
    return _binary("multiply", x, y, name, "Mul")


def subtract(x, y, name=None):
    """``x - y`` with TensorFlow's broadcasting."""
    return _binary("subtract", x, y, name, "Sub")


def divide(x, y, name=None):
    """``x / y`` with TensorFlow's broadcasting."""
    return _binary("divide", x, y, name, "Div")


def maximum(x, y, name=None):
    """Elementwise ``max(x, y)`` with TensorFlow's broadcasting (ties send the gradient to x)."""
    return _binary("maximum", x, y, name, "Maximum")


def minimum(x, y, name=None):
    """Elementwise ``min(x, y)`` with TensorFlow's broadcasting (ties send the gradient to x)."""
    return _binary("minimum", x, y, name, "Minimum")


def negative(x, name=None):
    """``-x``."""
    return _unary("negative", x, name, "Neg")


def reciprocal(x, name=None):
    """``1 / x``."""
    return _unary("reciprocal", x, name, "Rcp")


def square(x, name=None):
    """``x * x``."""
    return _unary("square", x, name, "Sqr")


def sqrt(x, name=None):
    """``sqrt(x)``."""
    return _unary("sqrt", x, name, "Sqrt")


def exp(x, name=None):
    """``exp(x)``."""
    return _unary("exp", x, name, "Exp")


def log(x, name=None):
    """Natural logarithm."""
    return _unary("log", x, name, "Log")


def sigmoid(x, name=None):
    """``1 / (1 + exp(-x))``."""
    return _unary("sigmoid", x, name, "Sig")


def tanh(x, name=None):
    """Hyperbolic tangent."""
    return _unary("tanh", x, name, "Tanh")


def relu(x, name=None):
    """``max(x, 0)`` (gradient 0 at 0)."""
    return _unary("relu", x, name, "Relu")


def elu(x, alpha=1.0, name=None):
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    alpha = args.real(alpha, "alpha")
    return _unary("elu", x, name, "Elu", alpha)


def gelu(x, alpha=0.044715, name=None):
    """GELU, tanh approximation: ``x/2 * (1 + tanh(sqrt(2/pi) * (x + alpha * x**3)))``."""
    alpha = args.real(alpha, "alpha")
    return _unary("gelu", x, name, "Gelu", alpha)


def swish(x, alpha=1.0, name=None):
    """``x * sigmoid(alpha * x)``."""
    alpha = args.real(alpha, "alpha")
    return _unary("swish", x, name, "Swish", alpha)


def fast_gelu(x, name=None):
    """GELU approximated by ``swish(x, alpha=1.702)``."""
    return swish(x, alpha=1.702, name=name if name is not None else "FastGelu")


def float_cast(x, dtype, dx_dtype=None, name=None):
    """Cast ``x`` to ``dtype``, choosing the precision of the gradient that flows back.

    Parameters
    ----------
    x : tensor
        float32, float16 or bfloat16, any shape.
    dtype : dtype
        float32, float16 or bfloat16: the dtype of the result.
    dx_dtype : dtype, optional
        float32, float16 or bfloat16: the gradient ``dx`` is rounded to this precision on its way
        back (default: the dtype of ``x``, i.e. a plain cast).  It is returned in the dtype of
        ``x``, because TensorFlow adds and passes on gradients only in their input's dtype.

    Returns
    -------
    tensor, shape of ``x``, dtype ``dtype``
        ``x`` itself (an identity op) when it already has ``dtype``.
    """
    dtype = float_dtype(dtype, "dtype")
    with tf.name_scope(args.op_name(name, "FloatCast")):
        x = float_tensor(x, "x")
        dx_dtype = x.dtype if dx_dtype is None else float_dtype(dx_dtype, "dx_dtype")
        return _float_cast(x, dtype, dx_dtype)


def _keep_prob(keep_prob):
    if tensor_like(keep_prob) is not None:
        keep_prob = tf.convert_to_tensor(tensor_like(keep_prob))
        if not keep_prob.dtype.base_dtype.is_floating or keep_prob.shape.rank not in (None, 0):
            raise TypeError(f"keep_prob must be a number or a float scalar tensor; got a "
                            f"{keep_prob.dtype.name} tensor of shape {keep_prob.shape}")
        # (a float32 Keras variable reads as the compute dtype under a mixed-precision policy)
        keep_prob = tf.cast(keep_prob, tf.float32)
        if tf.executing_eagerly():
            return args.real(float(keep_prob.numpy()), "keep_prob", low=0.0, high=1.0, low_open=True)
        checks = []
        if keep_prob.shape.rank is None:  # a scalar when the graph runs, and one from here on
            checks.append(tf.debugging.assert_rank(keep_prob, 0, message="keep_prob must be a scalar"))
            with tf.control_dependencies(checks):
                keep_prob = tf.reshape(keep_prob, [])
        valid = tf.logical_and(keep_prob > 0.0, keep_prob <= 1.0)
        checks.append(tf.debugging.assert_equal(valid, True, message="keep_prob must be in (0, 1]"))
        with tf.control_dependencies(checks):
            # NaN where XLA drops the assertion: an invalid keep_prob never scales silently
            return tf.where(valid, keep_prob, float("nan"))
    return args.real(keep_prob, "keep_prob", low=0.0, high=1.0, low_open=True)


def dropout(x, keep_prob=0.8, mask=None, *, seed=None, name=None):
    """Dropout that returns its mask, so that the same elements can be dropped again.

    ``y = x * mask / keep_prob``; the gradient is ``dy * mask / keep_prob``.

    Parameters
    ----------
    x : tensor
        float32, float16 or bfloat16, any shape.
    keep_prob : float or float scalar tensor
        Probability of keeping an element, in ``(0, 1]``; a tensor is read as float32 (a 16-bit one,
        e.g. a Keras variable read under a mixed-precision policy, with its rounding).
    mask : bool tensor, optional
        A mask returned by an earlier call, of the shape of ``x`` (numbers: nonzero keeps).  When
        given, no new mask is drawn and ``y`` is the same as that call's for the same ``x``.
    seed : int, optional
        Op seed of the mask's random draw (with ``tf.random.set_seed``, as TensorFlow's random ops).
    name : str, optional
        Name scope (default ``"Dropout"``).

    Returns
    -------
    y : tensor, shape and dtype of ``x``
    mask : bool tensor, shape of ``x``
    """
    if seed is not None and (isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral)):
        raise TypeError(f"seed must be an int or None; got {seed!r} of type {type(seed).__name__}")
    with tf.name_scope(args.op_name(name, "Dropout")):
        x = float_tensor(x, "x")
        keep_prob = _keep_prob(keep_prob)
        if mask is None:
            mask = make_mask(x, keep_prob, seed)
        else:
            mask = tf.convert_to_tensor(mask)
            if mask.dtype != tf.bool:
                if not (mask.dtype.is_floating or mask.dtype.is_integer):
                    raise TypeError(f"mask must be a bool tensor (as dropout returns it); got "
                                    f"{mask.dtype.name}")
                mask = tf.not_equal(mask, 0)
            mask = args.same_shape(mask, x, "mask", "x")
        return apply_mask(x, mask, keep_prob), mask


def add_n8(xs, name=None):
    """The sum of 1 to 8 tensors of one shape and dtype, accumulated in float32.

    At most 8 inputs, as in the original: an op that waits for every contribution of a gradient
    holds them all in memory until the last one arrives.
    """
    if tensor_like(xs) is not None or not hasattr(xs, "__len__"):
        raise TypeError(f"xs must be a list of 1 to 8 tensors; got {type(xs).__name__}")
    if not 1 <= len(xs) <= 8:
        raise ValueError(f"xs must hold 1 to 8 tensors; got {len(xs)}")
    with tf.name_scope(args.op_name(name, "AddN")):
        xs = [float_tensor(x, f"xs[{i}]") for i, x in enumerate(xs)]
        for i, x in enumerate(xs[1:], 1):
            same_dtype(xs[0], x, "xs[0]", f"xs[{i}]")
            xs[i] = args.same_shape(x, xs[0], f"xs[{i}]", "xs[0]")
        return math.add_n(xs)
