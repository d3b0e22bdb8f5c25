"""Elementwise ops with TensorFlow ops, computed in float32 and returned in the input's dtype.

float16 / bfloat16 inputs are widened to float32, computed and rounded once, as the original
package's kernels did (one rounding per op instead of one per intermediate, e.g. in ``gelu``).
Gradients come from TensorFlow's autodiff of these formulas (the casts included), so they too are
computed in float32 and arrive in the input's dtype.

The exception, :data:`NATIVE`: ops that IEEE arithmetic already rounds once in any format
(``a + b``, ``a * b``, max, negation, ...) run in the input's dtype when no operand is broadcast.
Their result is the same as in float32 rounded to the format (float32 holds every exact sum,
product and difference of two float16 / bfloat16 values to within one rounding that cannot
change the final one), their gradients involve no reduction, and they stay one TensorFlow kernel
instead of three (widen, compute, round).
"""
import math

from .. import tf
from .args import to_compute

__all__ = ["BINARY", "NATIVE", "UNARY", "add_n", "binary", "elu", "gelu", "swish", "unary"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def elu(x, alpha):
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere."""
    return tf.where(x > 0, x, alpha * tf.math.expm1(tf.minimum(x, 0.0)))


def gelu(x, alpha):
    """The tanh approximation ``x/2 * (1 + tanh(sqrt(2/pi) * (x + alpha * x^3)))``.

    Written as ``x * sigmoid(2u)`` (the same function): ``1 + tanh(u)`` cancels to nothing in
    float32 for large negative ``x``, the sigmoid keeps full relative precision there.
    """
    # the cube of |x| > 1e12 would overflow float32 and make the gradient inf * 0 = NaN; the
    # sigmoid is saturated long before, so clipping there changes no value
    xc = tf.clip_by_value(x, -1e12, 1e12)
    return x * tf.sigmoid(2.0 * _SQRT_2_OVER_PI * (x + alpha * xc * xc * xc))


def swish(x, alpha):
    """``x * sigmoid(alpha * x)``."""
    return x * tf.sigmoid(alpha * x)


#: The unary ops of ``blocksparse.ew`` without a parameter: public name -> float32 formula.
UNARY = {
    "negative": tf.negative,
    "reciprocal": tf.math.reciprocal,
    "square": tf.square,
    "sqrt": tf.sqrt,
    "exp": tf.exp,
    "log": tf.math.log,
    "sigmoid": tf.sigmoid,
    "tanh": tf.tanh,
    "relu": tf.nn.relu,
}

#: The binary ops (TensorFlow's broadcasting): public name -> float32 formula.
BINARY = {
    "add": tf.add,
    "subtract": tf.subtract,
    "multiply": tf.multiply,
    "divide": tf.divide,
    "maximum": tf.maximum,
    "minimum": tf.minimum,
}


#: Ops computed in the input's dtype (operands of one shape): the same results, one kernel.
NATIVE = frozenset(["add", "subtract", "multiply", "maximum", "minimum", "negative", "relu"])


def _in_dtype(value, dtype):
    return value if value.dtype == dtype else tf.cast(value, dtype)


def unary(op, x, *params):
    """The op named ``op`` (a key of :data:`UNARY`, or ``elu`` / ``gelu`` / ``swish``) of the
    checked tensor ``x``, in its dtype."""
    fn = UNARY.get(op) or {"elu": elu, "gelu": gelu, "swish": swish}[op]
    if op in NATIVE:
        return fn(x, *params)
    return _in_dtype(fn(to_compute(x), *params), x.dtype)


def binary(op, x, y, dtype):
    """The op named ``op`` (a key of :data:`BINARY`) of ``x`` and ``y`` (checked: shapes that
    broadcast; one dtype, or a float32 number beside a 16-bit tensor), in ``dtype``."""
    fn = BINARY[op]
    if op in NATIVE and x.dtype == y.dtype and x.shape.is_fully_defined() and x.shape == y.shape:
        return fn(x, y)
    return _in_dtype(fn(to_compute(x), to_compute(y)), dtype)


def add_n(xs):
    """The sum of the checked tensors ``xs`` (same shape and dtype), accumulated in float32."""
    return _in_dtype(tf.math.add_n([to_compute(x) for x in xs]), xs[0].dtype)
