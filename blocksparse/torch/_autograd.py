"""Eager calls of ``torch.autograd.Function`` subclasses without ``Function.apply``'s Python wrapper.

The wrapper (default-argument binding, functorch's pytree unwrapping) costs as much host time as
the C++ apply behind it and does nothing for functions without ``setup_context`` or default
arguments while no functorch transform is active; :func:`direct_apply` skips it then.
"""
import torch

__all__ = ["direct_apply", "functorch_active"]

#: Whether a functorch transform (``vmap``, ``grad``, ...) is active (a C function: cheap).
functorch_active = _functorch_active = torch._C._are_functorch_transforms_active


def direct_apply(function):
    """A callable equivalent to ``function.apply`` (positional arguments, no defaults): the C++
    apply directly, ``function.apply`` while a functorch transform (``vmap``, ``grad``) is active."""
    raw = super(torch.autograd.Function, function).apply

    def apply(*args):
        return function.apply(*args) if _functorch_active() else raw(*args)

    return apply
