"""Eager calls of ``torch.autograd.Function`` subclasses without ``Function.apply``'s Python wrapper.

The wrapper (default-argument binding, functorch's pytree unwrapping) costs as much host time as
the C++ apply behind it and does nothing for functions without ``setup_context`` or default
arguments while no functorch transform is active; :func:`direct_apply` skips it then.
"""
import torch

__all__ = ["direct_apply", "functorch_active", "eager_twin", "call_op", "owned"]

#: Whether a functorch transform (``vmap``, ``grad``, ...) is active (a C function: cheap).
functorch_active = _functorch_active = torch._C._are_functorch_transforms_active


def direct_apply(function):
    """A callable equivalent to ``function.apply`` (positional arguments, no defaults): the C++
    apply directly, ``function.apply`` while a functorch transform (``vmap``, ``grad``) is active."""
    raw = super(torch.autograd.Function, function).apply

    def apply(*args):
        return function.apply(*args) if _functorch_active() else raw(*args)

    return apply


def owned(out):
    """``out`` (a tensor or a tuple of them) with every view of a tensor made inside a forward
    replaced by a plain tensor on the same memory (no copy).  An ``autograd.Function`` output that
    is a view refuses in-place ops (``relu_``, ``+=``) where PyTorch's own ops allow them."""
    if isinstance(out, tuple):
        return tuple(map(owned, out))
    if not isinstance(out, torch.Tensor) or not out._is_view():
        return out
    if type(out) is not torch.Tensor or _dispatch_modes():  # traced (make_fx), fake, a subclass: a copy
        return out.clone()
    return out.new_empty(0).set_(out.untyped_storage(), out.storage_offset(), out.shape, out.stride())


def _dispatch_modes():
    """How many ``TorchDispatchMode`` s are active (``make_fx``'s tracer, ``FakeTensorMode``)."""
    return torch._C._len_torch_dispatch_stack()


def eager_twin(name, forward, setup_context, backward, *, materialize_grads=True):
    """The eager twin of a custom op with registered autograd: an ``autograd.Function`` (for
    :func:`direct_apply`) whose forward runs the op's implementation ``forward`` directly and hands
    its context to the op's own ``setup_context``; ``backward`` takes ``(ctx, *grads)`` as the op's
    does, calling the implementations of the backward ops rather than the dispatched ops.  No
    dispatcher between an eager call and its launches: a dispatched custom-op call cost about
    250 µs of host time on the H200's host, twenty times a norms kernel's launch.
    ``materialize_grads=False``: outputs nobody differentiated reach ``backward`` as None, not as
    zero-filled tensors (for outputs it ignores, such as statistics)."""

    def forward_(ctx, *args):
        ctx.set_materialize_grads(materialize_grads)
        out = owned(forward(*args))
        setup_context(ctx, args, out)
        return out

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward_),
                                                   "backward": staticmethod(backward)})


def call_op(op, apply, impl, args, tensors):
    """``op(*args)`` while ``torch.compile`` or ``torch.jit.trace`` traces (the custom op, which
    they record); else, eagerly, ``apply(*args)`` (the op's :func:`eager_twin`) where one of
    ``tensors`` needs a gradient, or ``impl(*args)`` (the implementation alone) where none does."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return op(*args)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return apply(*args)
    return impl(*args)
