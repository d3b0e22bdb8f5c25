"""Argument checks of the PyTorch frontend: user mistakes become ``TypeError`` / ``ValueError``
naming the argument, with what was expected and what was given."""
import contextlib
import functools
import numbers

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad
from torch._C._functorch import peek_interpreter_stack as _functorch_transform

from ._backend import autocast_available, autocast_dtype_of

#: Activation dtypes accepted (float64 runs the reference path).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: dtypes autocast lowers (as torch's own autocast does, float64 is left alone).
_AUTOCAST_FROM = (torch.float16, torch.bfloat16, torch.float32)


def _floating(name, t, kind="a torch.Tensor", dtypes="float16, bfloat16, float32 or float64"):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be {kind}; got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be {dtypes}; got {t.dtype}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor; got layout {t.layout}")
    return t


def float_dtype(name, dtype):
    """``dtype`` (a torch or numpy floating dtype, or its name) as one of :data:`FLOAT_DTYPES`."""
    if isinstance(dtype, torch.dtype):
        out = dtype
    elif isinstance(dtype, str):
        out = getattr(torch, dtype, None)
    else:
        try:
            out = None if dtype is None else getattr(torch, np.dtype(dtype).name, None)
        except TypeError:
            out = None
    if out not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64 (a torch or numpy dtype or its "
                        f"name); got {dtype!r}")
    return out


def floating_tensor(name, t):
    """``t`` after checking it is a dense tensor of float16, bfloat16, float32 or float64 (the op
    says which it computes in)."""
    return _floating(name, t, dtypes="floating point (float16, bfloat16, float32, float64)")


def activations(name, t, ndim=2):
    """``t`` after checking it is a floating ``ndim``-D tensor."""
    if _floating(name, t).dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D; got shape {tuple(t.shape)}")
    return t


def param(name, p, features, x):
    """``p`` (None, or a floating tensor of ``features`` elements on ``x``'s device) as a contiguous
    tensor of shape ``(features,)`` (the kernels read it densely: a strided or expanded view is
    copied).  Any float dtype (e.g. float32 parameters with bfloat16 activations): the kernels
    compute in float32 and return its gradient in its own dtype."""
    if p is None:
        return None
    if _floating(name, p, "a torch.Tensor or None").numel() != features:
        raise ValueError(f"{name} must have {features} elements (shape ({features},)); got shape {tuple(p.shape)}")
    same_device(name, p, x)
    return p.reshape(features).contiguous()


def same_device(name, t, x):
    if t.device != x.device:
        raise ValueError(f"{name} must be on the activations' device {x.device}; got {t.device}")


def axis(value):
    """The feature axis of 2-D activations as 0 or 1 (-1 and -2 count from the end)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"axis must be an int in [-2, 1]: 1 or -1 (activations (N, C)), 0 or -2 ((C, N)); got {value!r}")
    if value not in (-2, -1, 0, 1):
        raise ValueError(f"axis must be in [-2, 1] for 2-D x: 1 or -1 (activations (N, C)), 0 or -2 ((C, N)); got {value}")
    return int(value) % 2


def count(name, value):
    """A positive int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int; got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int; got {value}")
    return int(value)


def real(name, value):
    """A finite real number as float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {value!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite; got {value}")
    return value


def autocast(*activations):
    """The activations in the autocast dtype under ``torch.autocast`` (parameters, which may have
    any float dtype, stay as they are); as given outside it.  As torch's own ops, float64 tensors
    stay float64; None entries stay None."""
    dtype = autocast_dtype(activations[0].device)
    if dtype is None:
        return activations
    return tuple(t.to(dtype) if t is not None and t.dtype in _AUTOCAST_FROM else t for t in activations)


def autocast_dtype(device):
    """The autocast dtype of tensors on ``device`` (a ``torch.device``), or None where autocast is
    off or does not exist (the meta device: asking torch about it there raises)."""
    return autocast_dtype_of(device.type)


def autocast_off(device):
    """A context with autocast off on ``device`` (nothing to turn off where it does not exist)."""
    if not autocast_available(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def autocast_free(fn):
    """``fn`` run with autocast off on its first argument's device: a reference computation whose
    dtypes its caller chose (float32 sums of 16-bit operands), which autocast would round to 16 bits
    on the way (its matmuls and einsums) where the kernels keep float32."""
    @functools.wraps(fn)
    def run(t, *args, **kwargs):
        if autocast_dtype_of(t.device.type) is None:
            return fn(t, *args, **kwargs)
        with torch.autocast(t.device.type, enabled=False):
            return fn(t, *args, **kwargs)
    return run


def plain_ops_needed(*tensors):
    """Whether a call must run as plain PyTorch ops (the reference path) instead of the custom ops:
    inside a ``torch.func`` transform (``vmap``, ``grad``, ``jvp``, ``jacfwd``, ``hessian``) or with
    forward-mode tangents attached, which the custom ops (reverse-mode autograd only) would refuse
    or -- forward mode -- silently drop.  While ``torch.compile`` traces: only inside a transform
    (``torch.compile(torch.func.grad(f))``; the traceable query)."""
    if torch.compiler.is_compiling():
        return torch._C._are_functorch_transforms_active()
    if _functorch_transform() is not None:
        return True
    return _forward_ad._current_level >= 0 and any(
        t is not None and _forward_ad.unpack_dual(t).tangent is not None for t in tensors)
