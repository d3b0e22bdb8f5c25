"""float64 numpy references of the norms family: layer norm, the fused LSTM gates, batch norm and
``cwise_linear``, each with its gradients (no framework import).

Every function takes and returns float64 arrays.  Gradient functions take the output gradients
first and return the input gradients in the order of the forward function's inputs.
"""
import numpy as np

from .ew import sigmoid

__all__ = ["batch_norm", "batch_norm_grad", "batch_norm_inference", "batch_norm_inference_grad",
           "cwise_linear", "cwise_linear_grad", "layer_norm", "layer_norm_grad", "lstm_gates",
           "lstm_gates_grad"]


def _f64(*arrays):
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


def _features_last(x, axis, segments):
    """``x`` with its feature axis moved last and split into ``(segments, C / segments)``."""
    x = np.moveaxis(x, axis, -1)
    return x.reshape(x.shape[:-1] + (segments, x.shape[-1] // segments))


def _features_back(t, axis):
    return np.moveaxis(t.reshape(t.shape[:-2] + (-1,)), -1, axis)


def _layer_norm_parts(x, g, b, axis, segments, epsilon):
    x, g, b = _f64(x, g, b)
    xs = _features_last(x, axis, segments)
    mean = xs.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((xs - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon)
    xhat = (xs - mean) * rstd
    gs, bs = g.reshape(segments, -1), b.reshape(segments, -1)
    return xhat, rstd, gs, xhat * gs + bs


def layer_norm(x, g, b, axis=1, segments=1, epsilon=1e-6, relu=False):
    """``relu?(g * (x - mean) / sqrt(var + epsilon) + b)`` over each segment of the features on
    ``axis`` (``g``, ``b``: ``(C,)``)."""
    y = _layer_norm_parts(x, g, b, axis, segments, epsilon)[3]
    return _features_back(np.maximum(y, 0.0) if relu else y, axis)


def layer_norm_grad(dy, x, g, b, axis=1, segments=1, epsilon=1e-6, relu=False):
    """``(dx, dg, db)`` of :func:`layer_norm` for the output gradient ``dy``."""
    xhat, rstd, gs, y = _layer_norm_parts(x, g, b, axis, segments, epsilon)
    dys = _features_last(_f64(dy)[0], axis, segments)
    if relu:
        dys = dys * (y > 0)
    lead = tuple(range(dys.ndim - 2))
    dg, db = (dys * xhat).sum(axis=lead).ravel(), dys.sum(axis=lead).ravel()
    dxhat = dys * gs
    k = xhat.shape[-1]
    dx = rstd / k * (k * dxhat - dxhat.sum(axis=-1, keepdims=True)
                     - xhat * (dxhat * xhat).sum(axis=-1, keepdims=True))
    return _features_back(dx, axis), dg, db


def _gate_values(c, i, j, f, o, bias, forget_bias):
    c, i, j, f, o, bias = _f64(c, i, j, f, o, bias)
    if bias is not None:
        bi, bj, bf, bo = np.split(bias, 4)
        i, j, f, o = i + bi, j + bj, f + bf, o + bo
    return c, sigmoid(i), np.tanh(j), sigmoid(f + forget_bias), sigmoid(o)


def lstm_gates(c, i, j, f, o, bias=None, forget_bias=1.0):
    """``(c_next, h_next)``: ``c_next = sig(f + forget_bias) * c + sig(i) * tanh(j)``,
    ``h_next = sig(o) * tanh(c_next)``; ``bias`` ``(4K,)`` is added to ``i, j, f, o`` first."""
    c, si, tj, sf, so = _gate_values(c, i, j, f, o, bias, forget_bias)
    c_next = sf * c + si * tj
    return c_next, so * np.tanh(c_next)


def lstm_gates_grad(dc_next, dh_next, c, i, j, f, o, bias=None, forget_bias=1.0):
    """``(dc, di, dj, df, do, dbias)`` of :func:`lstm_gates` (``dbias`` None without a bias)."""
    c, si, tj, sf, so = _gate_values(c, i, j, f, o, bias, forget_bias)
    dc_next, dh_next = _f64(dc_next, dh_next)
    tc = np.tanh(sf * c + si * tj)
    dc = dc_next + dh_next * so * (1.0 - tc ** 2)
    dgates = [dc * tj * si * (1 - si), dc * si * (1 - tj ** 2), dc * c * sf * (1 - sf),
              dh_next * tc * so * (1 - so)]
    k = c.shape[-1]
    dbias = None if bias is None else np.concatenate([d.reshape(-1, k).sum(axis=0) for d in dgates])
    return (dc * sf, *dgates, dbias)


def _per_channel(v, ndim):
    return np.asarray(v, dtype=np.float64).reshape((1, -1) + (1,) * (ndim - 2))


def _stat_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def batch_norm(x, g, b, epsilon=1e-6):
    """``(y, mean, var)`` of training-mode batch norm over N and the spatial axes of
    ``(N, C, ...)`` (``var`` biased)."""
    x = _f64(x)[0]
    mean, var = x.mean(axis=_stat_axes(x)), x.var(axis=_stat_axes(x))
    xhat = (x - _per_channel(mean, x.ndim)) / np.sqrt(_per_channel(var, x.ndim) + epsilon)
    return xhat * _per_channel(g, x.ndim) + _per_channel(b, x.ndim), mean, var


def batch_norm_grad(dy, dmean, dvar, x, g, b, epsilon=1e-6):
    """``(dx, dg, db)`` of :func:`batch_norm` for gradients of all three outputs (``dmean`` and
    ``dvar`` may be None)."""
    x, dy = _f64(x, dy)
    axes, n = _stat_axes(x), x.size // x.shape[1]
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    centred = x - _per_channel(mean, x.ndim)
    rstd = 1.0 / np.sqrt(_per_channel(var, x.ndim) + epsilon)
    xhat = centred * rstd
    dg, db = (dy * xhat).sum(axis=axes), dy.sum(axis=axes)
    # y through xhat, then the direct paths of the mean and variance outputs
    dx = _per_channel(g, x.ndim) * rstd * (dy - (_per_channel(db, x.ndim) + xhat * _per_channel(dg, x.ndim)) / n)
    if dmean is not None:
        dx = dx + _per_channel(dmean, x.ndim) / n
    if dvar is not None:
        dx = dx + 2.0 * _per_channel(dvar, x.ndim) * centred / n
    return dx, dg, db


def batch_norm_inference(x, g, b, m, v, epsilon=1e-6):
    """``g * (x - m) / sqrt(v + epsilon) + b`` per channel of ``(N, C, ...)``."""
    x = _f64(x)[0]
    pc = [_per_channel(t, x.ndim) for t in (g, b, m, v)]
    return pc[0] * (x - pc[2]) / np.sqrt(pc[3] + epsilon) + pc[1]


def batch_norm_inference_grad(dy, x, g, b, m, v, epsilon=1e-6):
    """``(dx, dg, db, dm, dv)`` of :func:`batch_norm_inference`."""
    x, dy = _f64(x, dy)
    axes = _stat_axes(x)
    gc, mc, vc = (_per_channel(t, x.ndim) for t in (g, m, v))
    rstd = 1.0 / np.sqrt(vc + epsilon)
    dx = dy * gc * rstd
    dv = (dy * gc * (x - mc) * -0.5 * rstd ** 3).sum(axis=axes)
    return dx, (dy * (x - mc) * rstd).sum(axis=axes), dy.sum(axis=axes), -dx.sum(axis=axes), dv


def cwise_linear(x, a=None, b=None):
    """``a * x + b`` per channel of ``(N, C, ...)`` (a missing ``a`` is 1, a missing ``b`` 0)."""
    x = _f64(x)[0]
    y = x if a is None else x * _per_channel(a, x.ndim)
    return y if b is None else y + _per_channel(b, x.ndim)


def cwise_linear_grad(dy, x, a=None, b=None):
    """``(dx, da, db)`` of :func:`cwise_linear` (None for a missing ``a`` or ``b``)."""
    x, dy = _f64(x, dy)
    axes = _stat_axes(x)
    dx = dy if a is None else dy * _per_channel(a, x.ndim)
    return (dx, None if a is None else (dy * x).sum(axis=axes), None if b is None else dy.sum(axis=axes))
