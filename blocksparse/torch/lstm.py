"""Public PyTorch API of the fused LSTM gates: :func:`fused_lstm_gates`."""
from __future__ import annotations

import math

import torch

from . import _checks
from ._lstm import ops as _ops
from ._lstm import reference as _reference

__all__ = ["fused_lstm_gates"]


def fused_lstm_gates(c, *gates, bias=None, forget_bias=1.0):
    """One LSTM step's gate nonlinearities and cell update, fused.

    ::

        i, j, f, o = gates (+ bias)            # pre-activations, split along the features
        c_next = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(j)
        h_next = sigmoid(o) * tanh(c_next)

    Parameters
    ----------
    c : Tensor, shape (N, K)
        The cell state; float16, bfloat16, float32 (Triton kernels on CUDA) or float64.  Other
        ranks ``(..., K)`` (as TensorFlow's takes) with gates ``(..., 4K)`` / ``(..., K)`` of the
        same leading shape: every leading axis a token axis (1-D: one token).
    *gates : Tensor
        Either one merged ``(N, 4K)`` tensor holding ``i, j, f, o`` in that order along the
        features, or the four ``(N, K)`` tensors ``i, j, f, o``; ``c``'s dtype and device.
    bias : Tensor of 4K elements, optional
        Added to the gates first (``i, j, f, o`` order); any float dtype.
    forget_bias : float
        Added to the forget gate before its sigmoid.

    Returns
    -------
    (c_next, h_next) : tuple of Tensor, each (N, K)
        In ``c``'s dtype.  Differentiable (twice too) in ``c``, the gates and ``bias``; inside
        ``torch.func`` transforms and with forward-mode tangents the reference path runs; traceable by
        ``torch.compile(fullgraph=True)``.  Under ``torch.autocast`` the state and the gates are
        cast to the autocast dtype.

    Examples
    --------
    >>> import torch
    >>> c, h = torch.zeros(8, 32), torch.randn(8, 128)
    >>> c_next, h_next = fused_lstm_gates(c, h, forget_bias=1.0)
    >>> c_next, h_next = fused_lstm_gates(c, *h.split(32, dim=1))     # four gate tensors
    """
    if len(gates) not in (1, 4):
        raise TypeError(f"gates must be one merged (N, 4K) tensor or four (N, K) tensors; got {len(gates)}")
    names = ("h",) if len(gates) == 1 else ("i", "j", "f", "o")
    if isinstance(c, torch.Tensor) and c.dim() == 0:
        raise ValueError("c must have a feature axis (1-D or more); got a 0-D tensor")
    if isinstance(c, torch.Tensor) and c.dim() != 2:  # (..., K): every leading axis a token axis
        return _tokens_flattened(c, gates, names, bias, forget_bias)
    out = _ops.native_gates(c, gates, bias, forget_bias)
    if out is not None:
        return out
    c = _checks.activations("c", c)
    n, k = c.shape
    width = 4 * k if len(gates) == 1 else k
    for name, t in zip(names, gates):  # (a gate of another rank: named by the shape c asks of it)
        if isinstance(t, torch.Tensor) and t.dim() != 2:
            raise ValueError(f"{name} must have shape ({n}, {width}) for c of shape {(n, k)}; got {tuple(t.shape)}")
    gates = [_checks.activations(name, t) for name, t in zip(names, gates)]
    if k == 0:
        raise ValueError(f"c must have at least one feature (K > 0); got shape {tuple(c.shape)}")
    for name, t in zip(names, gates):
        if tuple(t.shape) != (n, width):
            raise ValueError(f"{name} must have shape ({n}, {width}) for c of shape {(n, k)}; got {tuple(t.shape)}")
        _checks.same_device(name, t, c)
    forget_bias = _checks.real("forget_bias", forget_bias)
    # autocast first: under it a float32 state with bfloat16 gates (e.g. from layer_norm) is fine
    c, *gates = _checks.autocast(c, *gates)
    for name, t in zip(names, gates):
        if t.dtype != c.dtype:
            raise TypeError(f"{name} must have c's dtype {c.dtype}; got {t.dtype}")
    bias = _checks.param("bias", bias, 4 * k, c)
    if _checks.plain_ops_needed(c, *gates, bias):
        parts = gates[0].split(k, dim=1) if len(gates) == 1 else gates
        return _reference.lstm_gates_fwd(c, parts, bias, forget_bias=forget_bias)
    return _ops.apply_gates(c, gates, bias, forget_bias)


def _tokens_flattened(c, gates, names, bias, forget_bias):
    """:func:`fused_lstm_gates` of ``(..., K)`` tensors, through their ``(tokens, K)`` views."""
    lead = c.shape[:-1]
    for name, t in zip(names, gates):
        _checks.floating_tensor(name, t)
        if t.shape[:-1] != lead:
            raise ValueError(f"{name} must have c's leading shape {tuple(lead)} (..., features); got shape "
                             f"{tuple(t.shape)}")
    tokens = math.prod(lead)
    c_next, h_next = fused_lstm_gates(c.reshape(tokens, c.shape[-1]), *(t.reshape(tokens, t.shape[-1]) for t in gates),
                                      bias=bias, forget_bias=forget_bias)
    return c_next.view(c.shape), h_next.view(c.shape)
