"""float64 references of the norms family: layer norm, the fused LSTM gates, batch norm and
``cwise_linear``, each with its gradients, written from the formulas (no framework import).

Every function takes and returns float64 arrays.  Gradient functions take the output gradients
first and return the input gradients in the order of the forward function's inputs.

Layer norm and the LSTM gates also take ``xp``: ``numpy`` (the default) or ``torch``, whose
float64 tensors they then compute on (the GPU benchmarks check CUDA results on the device).
Batch norm and ``cwise_linear`` are numpy only.  :func:`draw_layer_norm` and
:func:`draw_lstm_gates` draw float64 numpy test inputs.
"""
import numpy as np

from .ew import sigmoid

__all__ = ["batch_norm", "batch_norm_grad", "batch_norm_inference", "batch_norm_inference_grad",
           "cwise_linear", "cwise_linear_grad", "draw_layer_norm", "draw_lstm_gates", "layer_norm",
           "layer_norm_grad", "lstm_gates", "lstm_gates_grad", "relu_safe"]


def _f64(*arrays, xp=np):
    return [None if a is None else xp.asarray(a, dtype=xp.float64) for a in arrays]


def _features_last(x, axis, segments, xp):
    """``x`` with its feature axis moved last and split into ``(segments, C / segments)``."""
    x = xp.moveaxis(x, axis, -1)
    return x.reshape(*x.shape[:-1], segments, x.shape[-1] // segments)


def _features_back(t, axis, xp):
    return xp.moveaxis(t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1]), -1, axis)  # (not -1: size 0)


def _per_feature(t):
    """``(..., segments, C / segments)`` summed over its leading axes, as ``(C,)``."""
    lead = tuple(range(t.ndim - 2))
    return (t.sum(axis=lead) if lead else t).reshape(-1)


def _layer_norm_parts(x, g, b, axis, segments, epsilon, xp):
    """``(xhat, rstd, gs, y)`` per segment, features last: ``gs`` the gain split like the features
    (None without one), ``y`` the output before the relu."""
    x, g, b = _f64(x, g, b, xp=xp)
    xs = _features_last(x, axis, segments, xp)
    centred = xs - xs.mean(axis=-1, keepdims=True)
    rstd = ((centred * centred).mean(axis=-1, keepdims=True) + epsilon) ** -0.5
    xhat = centred * rstd
    gs = None if g is None else g.reshape(segments, -1)
    y = xhat if gs is None else xhat * gs
    return xhat, rstd, gs, y if b is None else y + b.reshape(segments, -1)


def layer_norm(x, g, b, axis=1, segments=1, epsilon=1e-6, relu=False, *, xp=np):
    """``relu?(g * (x - mean) / sqrt(var + epsilon) + b)`` over each segment of the features on
    ``axis`` (any rank; ``g``, ``b``: ``(C,)`` or None)."""
    y = _layer_norm_parts(x, g, b, axis, segments, epsilon, xp)[3]
    return _features_back(y * (y > 0) if relu else y, axis, xp)


def layer_norm_grad(dy, x, g, b, axis=1, segments=1, epsilon=1e-6, relu=False, *, xp=np):
    """``(dx, dg, db)`` of :func:`layer_norm` for the output gradient ``dy`` (``dg`` / ``db`` None
    where ``g`` / ``b`` are)."""
    xhat, rstd, gs, y = _layer_norm_parts(x, g, b, axis, segments, epsilon, xp)
    dys = _features_last(_f64(dy, xp=xp)[0], axis, segments, xp)
    if relu:
        dys = dys * (y > 0)
    dg = None if g is None else _per_feature(dys * xhat)
    db = None if b is None else _per_feature(dys)
    dxhat = dys if gs is None else dys * gs
    k = xhat.shape[-1]
    dx = rstd / k * (k * dxhat - dxhat.sum(axis=-1, keepdims=True)
                     - xhat * (dxhat * xhat).sum(axis=-1, keepdims=True))
    return _features_back(dx, axis, xp), dg, db


def _gate_values(c, gates, bias, forget_bias, xp):
    """``(c, sig(i), tanh(j), sig(f + forget_bias), sig(o))`` from one merged ``(..., 4K)`` tensor
    of the gates or four ``(..., K)`` ones."""
    if len(gates) not in (1, 4):
        raise TypeError(f"gates must be one merged (..., 4K) array or four (..., K) ones; got {len(gates)}")
    c, *gates = _f64(c, *gates, xp=xp)
    k = c.shape[-1]
    if len(gates) == 1:
        gates = [gates[0][..., n * k:(n + 1) * k] for n in range(4)]
    if bias is not None:
        bias = _f64(bias, xp=xp)[0]
        gates = [t + bias[n * k:(n + 1) * k] for n, t in enumerate(gates)]
    i, j, f, o = gates
    return c, sigmoid(i, xp=xp), xp.tanh(j), sigmoid(f + forget_bias, xp=xp), sigmoid(o, xp=xp)


def lstm_gates(c, *gates, bias=None, forget_bias=1.0, xp=np):
    """``(c_next, h_next)``: ``c_next = sig(f + forget_bias) * c + sig(i) * tanh(j)``,
    ``h_next = sig(o) * tanh(c_next)``.

    ``gates``: one merged ``(..., 4K)`` array holding ``i, j, f, o`` one after the other on its last
    axis, or the four ``(..., K)`` arrays ``i, j, f, o``; ``bias`` ``(4K,)`` is added to them first.
    """
    c, si, tj, sf, so = _gate_values(c, gates, bias, forget_bias, xp)
    c_next = sf * c + si * tj
    return c_next, so * xp.tanh(c_next)


def lstm_gates_grad(dc_next, dh_next, c, *gates, bias=None, forget_bias=1.0, xp=np):
    """``(dc, *dgates, dbias)`` of :func:`lstm_gates`: ``dgates`` as the gates were given (one
    merged gradient or four), ``dbias`` None without a bias."""
    c, si, tj, sf, so = _gate_values(c, gates, bias, forget_bias, xp)
    dc_next, dh_next = _f64(dc_next, dh_next, xp=xp)
    tc = xp.tanh(sf * c + si * tj)
    dc = dc_next + dh_next * so * (1.0 - tc * tc)
    dgates = [dc * tj * si * (1 - si), dc * si * (1 - tj * tj), dc * c * sf * (1 - sf),
              dh_next * tc * so * (1 - so)]
    k = c.shape[-1]
    dbias = None if bias is None else xp.concatenate([d.reshape(-1, k).sum(axis=0) for d in dgates], -1)
    if len(gates) == 1:
        dgates = [xp.concatenate(dgates, -1)]
    return (dc * sf, *dgates, dbias)


def draw_layer_norm(rng, n, c, axis=1, offset=0.0):
    """float64 numpy ``(x, g, b, dy)`` for ``n`` tokens of ``c`` features in the ``axis`` layout
    (``(n, c)`` or ``(c, n)``); ``offset`` shifts ``x`` (a large mean tests the variance's
    cancellation)."""
    shape = (n, c) if axis == 1 else (c, n)
    x = offset + 2.0 * rng.standard_normal(shape)
    g = 1.0 + 0.5 * rng.standard_normal(c)
    b = 0.5 * rng.standard_normal(c)
    return x, g, b, rng.standard_normal(shape)


def draw_lstm_gates(rng, n, k):
    """float64 numpy ``(c, h, bias, dc_next, dh_next)`` for ``n`` tokens of a ``k``-feature cell
    (``h``: the merged gates ``(n, 4k)``)."""
    c = rng.standard_normal((n, k))
    h = 1.5 * rng.standard_normal((n, 4 * k))
    bias = 0.5 * rng.standard_normal(4 * k)
    return c, h, bias, rng.standard_normal((n, k)), rng.standard_normal((n, k))


def relu_safe(dy, y, margin=1e-3):
    """``dy`` zeroed where ``|y| < margin``: there the relu mask of a float32 computation and of the
    float64 reference may disagree, and with ``dy = 0`` it does not matter which one holds."""
    return dy * (abs(y) >= margin)


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
