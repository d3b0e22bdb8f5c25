"""float64 numpy references of the elementwise ops: values and derivatives (no framework import).

:data:`UNARY` maps each op of ``blocksparse.ew`` to ``(f, df)`` with ``df(x) = f'(x)``; ops with a
parameter take it as a second argument.  :data:`BINARY` maps each binary op to ``(f, dfdx, dfdy)``
elementwise; :func:`unbroadcast` sums a broadcast gradient back to an operand's shape, and
:func:`unbroadcast_error` measures a gradient against that sum.
"""
import math

import numpy as np

from .numerics import rel_error

__all__ = ["BINARY", "UNARY", "dropout", "sigmoid", "unbroadcast", "unbroadcast_error"]

_K = math.sqrt(2.0 / math.pi)


def sigmoid(x, *, xp=np):
    """``1 / (1 + exp(-x))`` without overflow, at full relative precision on both sides (``xp``:
    ``numpy`` or ``torch``, the namespace of ``x``)."""
    e = xp.exp(-abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x, a):
    """``x/2 * (1 + tanh(u))``, ``u = sqrt(2/pi) (x + a x^3)``, as ``x * sigmoid(2u)`` (equal, and
    free of the cancellation in ``1 + tanh(u)`` for large negative ``x``)."""
    return x * sigmoid(2.0 * _K * (x + a * x ** 3))


def _gelu_grad(x, a):
    s = sigmoid(2.0 * _K * (x + a * x ** 3))
    return s + x * 2.0 * s * (1.0 - s) * _K * (1.0 + 3.0 * a * x * x)


def _swish_grad(x, a):
    s = sigmoid(a * x)
    return s + a * x * s * (1.0 - s)


UNARY = {
    "negative": (np.negative, lambda x: -np.ones_like(x)),
    "reciprocal": (np.reciprocal, lambda x: -1.0 / (x * x)),
    "square": (np.square, lambda x: 2.0 * x),
    "sqrt": (np.sqrt, lambda x: 0.5 / np.sqrt(x)),
    "exp": (np.exp, np.exp),
    "log": (np.log, np.reciprocal),
    "sigmoid": (sigmoid, lambda x: sigmoid(x) * (1.0 - sigmoid(x))),
    "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
    "relu": (lambda x: np.maximum(x, 0.0), lambda x: (x > 0).astype(np.float64)),
    "elu": (lambda x, a: np.where(x > 0, x, a * np.expm1(np.minimum(x, 0.0))),
            lambda x, a: np.where(x > 0, 1.0, a * np.exp(np.minimum(x, 0.0)))),
    "gelu": (_gelu, _gelu_grad),
    "swish": (lambda x, a: x * sigmoid(a * x), _swish_grad),
}

# maximum / minimum send the gradient of a tie to x, as TensorFlow does
BINARY = {
    "add": (np.add, lambda x, y: np.ones_like(x + y), lambda x, y: np.ones_like(x + y)),
    "subtract": (np.subtract, lambda x, y: np.ones_like(x + y), lambda x, y: -np.ones_like(x + y)),
    "multiply": (np.multiply, lambda x, y: y + 0 * x, lambda x, y: x + 0 * y),
    "divide": (np.divide, lambda x, y: 1.0 / y + 0 * x, lambda x, y: -x / (y * y)),
    "maximum": (np.maximum, lambda x, y: (x >= y) * 1.0, lambda x, y: (x < y) * 1.0),
    "minimum": (np.minimum, lambda x, y: (x <= y) * 1.0, lambda x, y: (x > y) * 1.0),
}


def unbroadcast(grad, shape):
    """``grad`` (of the broadcast shape) summed over the axes an operand of ``shape`` was
    broadcast along."""
    grad = np.asarray(grad, dtype=np.float64)
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def unbroadcast_error(got, terms, shape):
    """The error of ``got`` against ``unbroadcast(terms, shape)`` relative to the summed magnitudes
    ``unbroadcast(|terms|, shape)``: a sum's rounding error grows with its terms, not with the sum,
    which cancellation can make arbitrarily small.  Equal to ``rel_error`` where nothing is summed."""
    ref = unbroadcast(terms, shape)
    absolute = rel_error(got, ref) * (np.linalg.norm(ref) or 1.0)
    scale = np.linalg.norm(unbroadcast(np.abs(terms), shape))
    return float(absolute / (scale if scale > 0 else 1.0))


def dropout(x, mask, keep_prob):
    """``x * mask / keep_prob`` (the gradient of ``dy`` has the same formula)."""
    return np.where(mask, np.asarray(x, dtype=np.float64) / keep_prob, 0.0)
