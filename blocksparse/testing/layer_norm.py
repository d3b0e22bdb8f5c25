"""float64 references of layer norm (forward and gradients), written from the formulas.

Each function takes ``xp``: ``numpy`` (the tests) or ``torch`` (the GPU benchmark, on float64
CUDA tensors); the arrays must already be float64 in that namespace.  ``g`` / ``b`` may be None.
"""
import numpy as np

__all__ = ["layer_norm", "layer_norm_grads", "draw", "relu_safe"]


def _tokens_first(x, axis, segments):
    """``(N, segments, C // segments)`` view of 2-D activations with features on ``axis``."""
    x = x if axis == 1 else x.T
    return x.reshape(x.shape[0], segments, -1)


def _back(t, axis):
    t = t.reshape(t.shape[0], -1)
    return t if axis == 1 else t.T


def _normalised(x, axis, epsilon, segments):
    xs = _tokens_first(x, axis, segments)
    xc = xs - xs.mean(axis=-1, keepdims=True)
    rstd = 1.0 / ((xc * xc).mean(axis=-1, keepdims=True) + epsilon) ** 0.5
    return xc * rstd, rstd


def _affine(xhat, g, b, segments):
    y = xhat if g is None else xhat * g.reshape(segments, -1)
    return y if b is None else y + b.reshape(segments, -1)


def layer_norm(x, g, b, axis=1, epsilon=1e-6, relu=False, segments=1, xp=np):
    """``relu?((x - mean) / sqrt(var + epsilon) * g + b)`` per segment of the features."""
    xhat, _ = _normalised(x, axis, epsilon, segments)
    y = _affine(xhat, g, b, segments)
    if relu:
        y = xp.where(y > 0, y, 0 * y)
    return _back(y, axis)


def layer_norm_grads(dy, x, g, b, axis=1, epsilon=1e-6, relu=False, segments=1, xp=np):
    """``(dx, dg, db)`` for the output gradient ``dy`` (``dg`` / ``db`` None where ``g`` / ``b`` are)."""
    xhat, rstd = _normalised(x, axis, epsilon, segments)
    dy = _tokens_first(dy, axis, segments)
    if relu:
        dy = xp.where(_affine(xhat, g, b, segments) > 0, dy, 0 * dy)
    dg = None if g is None else (dy * xhat).sum(axis=0).reshape(-1)
    db = None if b is None else dy.sum(axis=0).reshape(-1)
    dxhat = dy if g is None else dy * g.reshape(segments, -1)
    k = xhat.shape[-1]
    dx = (dxhat - (xhat * (xhat * dxhat).sum(axis=-1, keepdims=True) + dxhat.sum(axis=-1, keepdims=True)) / k) * rstd
    return _back(dx, axis), dg, db


def draw(rng, n, c, axis=1, offset=0.0):
    """float64 numpy ``(x, g, b, dy)`` for ``n`` tokens of ``c`` features in the ``axis`` layout;
    ``offset`` shifts ``x`` (a large mean tests the variance's cancellation)."""
    shape = (n, c) if axis == 1 else (c, n)
    x = offset + 2.0 * rng.standard_normal(shape)
    g = 1.0 + 0.5 * rng.standard_normal(c)
    b = 0.5 * rng.standard_normal(c)
    return x, g, b, rng.standard_normal(shape)


def relu_safe(dy, y, margin=1e-3):
    """``dy`` zeroed where ``|y| < margin``: there the relu mask of a float32 computation and of the
    float64 reference may disagree, and with ``dy = 0`` it does not matter which one holds."""
    return dy * (abs(y) >= margin)
