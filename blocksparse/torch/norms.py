"""Public PyTorch API of layer normalisation: :func:`layer_norm`."""
from __future__ import annotations

import math
import numbers

import torch

from .._checks import check_bool, check_epsilon
from . import _checks
from ._norms import ops as _ops
from ._norms import reference as _reference

__all__ = ["layer_norm"]


def layer_norm(x, g, b, axis=1, epsilon=1e-6, relu=False, *, segments=1):
    """Layer normalisation over the feature axis of activations, with an optional fused relu.

    ``y = relu?((x - mean) / sqrt(var + epsilon) * g + b)``, with ``mean`` and ``var`` (biased)
    taken over the features of each token -- over each of ``segments`` equal slices of the
    features separately.

    Parameters
    ----------
    x : Tensor, shape (N, C) for ``axis=1`` or (C, N) for ``axis=0``
        Activations in either block-sparse matmul layout (``feature_axis``); float16, bfloat16,
        float32 (Triton kernels on CUDA) or float64.  Any strides.  Other ranks (as TensorFlow's
        ``blocksparse.norms.layer_norm`` takes): features on ``axis``, every other axis a token
        axis, and 1-D ``x`` one token (features first or last cost no copy; on a middle axis they
        are moved last and back).
    g, b : Tensor of C elements, or None
        Gain and bias per feature (None: no gain / no bias), any float dtype (float32
        parameters with bfloat16 activations is the usual mix); gradients in their dtypes.
    axis : int
        The feature axis of ``x``: 1 or 0 for 2-D ``x`` (-1 and -2 are accepted), any axis of
        another rank.
    epsilon : float
        Added to the variance (> 0).
    relu : bool
        Apply ``max(y, 0)`` after the gain and bias.
    segments : int
        Normalise ``segments`` equal slices of the features separately (``C % segments == 0``),
        as the LSTM gates of the original package do.

    Returns
    -------
    Tensor
        ``y``, shape and layout of ``x`` (contiguous), dtype of ``x``.  Differentiable in ``x``,
        ``g`` and ``b``; traceable by ``torch.compile(fullgraph=True)``.  Under ``torch.autocast``
        ``x`` is cast to the autocast dtype (statistics are float32 either way).  Twice
        differentiable (a ``create_graph=True`` backward runs the reference formulas); inside
        ``torch.func`` transforms and with forward-mode tangents the reference path runs.

    Examples
    --------
    >>> x = torch.randn(8, 96)
    >>> g, b = torch.ones(96), torch.zeros(96)
    >>> layer_norm(x, g, b, segments=4, relu=True).shape
    torch.Size([8, 96])
    >>> layer_norm(x.t(), g, b, axis=0).shape      # (C, N) activations
    torch.Size([96, 8])
    """
    if isinstance(x, torch.Tensor) and x.dim() == 0:
        raise ValueError("x must have a feature axis (1-D or more); got a 0-D tensor")
    if isinstance(x, torch.Tensor) and x.dim() != 2:  # tokens on every other axis: one token axis
        if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
            raise TypeError(f"axis must be an int in [{-x.dim()}, {x.dim() - 1}] for x of rank {x.dim()}; got {axis!r}")
        axis = int(axis)
        if -x.dim() <= axis < x.dim() and x.shape[axis] and _segments_divide(x.shape[axis], segments) is False:
            raise ValueError(f"segments must divide the {x.shape[axis]} features of x (axis {axis}); got {segments}")
        if axis in (-1, x.dim() - 1):
            tokens = math.prod(x.shape[:-1])  # not -1: a tensor of no features has no such reshape
            return layer_norm(x.reshape(tokens, x.shape[-1]), g, b, 1, epsilon, relu, segments=segments).view(x.shape)
        if axis in (0, -x.dim()):
            tokens = math.prod(x.shape[1:])
            return layer_norm(x.reshape(x.shape[0], tokens), g, b, 0, epsilon, relu, segments=segments).view(x.shape)
        if not -x.dim() <= axis < x.dim():
            raise ValueError(f"axis must be in [{-x.dim()}, {x.dim() - 1}] for x of rank {x.dim()}; got {axis}")
        # features on a middle axis: normalised features last, then moved back (two copies)
        y = layer_norm(x.movedim(axis, -1), g, b, -1, epsilon, relu, segments=segments)
        return y.movedim(-1, axis).contiguous()
    y = _ops.native_layer_norm(x, g, b, axis, epsilon, relu, segments)
    if y is not None:
        return y
    x = _checks.activations("x", x)
    axis = _checks.axis(axis)
    features = x.shape[axis]
    if features == 0:
        raise ValueError(f"x must have at least one feature on axis {axis}; got shape {tuple(x.shape)}")
    segments = _checks.count("segments", segments)
    if features % segments:
        raise ValueError(f"segments must divide the {features} features of x (axis {axis}); got {segments}")
    epsilon = _checks.real("epsilon", epsilon)
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0; got {epsilon}")
    epsilon = check_epsilon(epsilon)
    relu = check_bool(relu, "relu")
    (x,) = _checks.autocast(x)
    g, b = _checks.param("g", g, features, x), _checks.param("b", b, features, x)
    if _checks.plain_ops_needed(x, g, b):
        y, _, _ = _reference.layer_norm_fwd(x, g, b, axis=axis, epsilon=epsilon, relu=relu, segments=segments)
        return y
    return _ops.apply_layer_norm(x, g, b, axis, epsilon, relu, segments)


def _segments_divide(features, segments):
    """Whether ``segments`` (an int, else None: the 2-D call's checks say what is wrong) divides ``features``."""
    if isinstance(segments, bool) or not isinstance(segments, numbers.Integral) or segments < 1:
        return None
    return features % int(segments) == 0
