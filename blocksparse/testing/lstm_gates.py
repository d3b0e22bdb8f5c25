"""float64 references of the fused LSTM gates (forward and gradients), written from the formulas.

``xp`` is ``numpy`` (the tests) or ``torch`` (the GPU benchmark, float64 CUDA tensors).  The
gates are one merged ``(N, 4K)`` array (``i, j, f, o`` along the features).
"""
import numpy as np

__all__ = ["lstm_gates", "lstm_gates_grads", "draw"]


def _sigmoid(x, xp):
    return 1.0 / (1.0 + xp.exp(-x))


def _activations(c, h, bias, forget_bias, xp):
    if bias is not None:
        h = h + bias.reshape(1, -1)
    k = c.shape[1]
    i, j, f, o = (h[:, n * k:(n + 1) * k] for n in range(4))
    i, j, f, o = _sigmoid(i, xp), xp.tanh(j), _sigmoid(f + forget_bias, xp), _sigmoid(o, xp)
    return i, j, f, o, f * c + i * j


def lstm_gates(c, h, bias=None, forget_bias=1.0, xp=np):
    """``(c_next, h_next)``."""
    _, _, _, o, c_next = _activations(c, h, bias, forget_bias, xp)
    return c_next, o * xp.tanh(c_next)


def lstm_gates_grads(dc_next, dh_next, c, h, bias=None, forget_bias=1.0, xp=np):
    """``(dc, dh, dbias)``: gradients of the cell state, the merged gates and the bias (None
    without one) for the output gradients ``dc_next`` and ``dh_next``."""
    i, j, f, o, c_next = _activations(c, h, bias, forget_bias, xp)
    t = xp.tanh(c_next)
    dcn = dc_next + dh_next * o * (1 - t * t)
    dh = xp.concatenate([dcn * j * i * (1 - i), dcn * i * (1 - j * j), dcn * c * f * (1 - f),
                         dh_next * t * o * (1 - o)], 1)
    return dcn * f, dh, None if bias is None else dh.sum(axis=0)


def draw(rng, n, k):
    """float64 numpy ``(c, h, bias, dc_next, dh_next)`` for ``n`` tokens of a ``k``-feature cell."""
    c = rng.standard_normal((n, k))
    h = 1.5 * rng.standard_normal((n, 4 * k))
    bias = 0.5 * rng.standard_normal(4 * k)
    return c, h, bias, rng.standard_normal((n, k)), rng.standard_normal((n, k))
