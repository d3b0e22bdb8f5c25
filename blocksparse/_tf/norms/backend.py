"""Which implementation computes ``layer_norm`` and the fused LSTM gates.

An :class:`Implementation` holds the family's differentiable ops; :data:`REFERENCE` (TensorFlow
ops, any device, XLA included) is the only one today.  :func:`select` is the seam for the GPU
kernels: it asks :func:`blocksparse._tf.dispatch.gpu_library` with the call's eligibility (the
dtypes and layouts the kernels take), and where a GPU op library is loaded it is the one place
that will look up the family's kernels in it.  The op libraries built today hold no kernels of
this family, so the reference path serves them (``BLOCKSPARSE_BACKEND=triton`` says so with
:class:`~blocksparse._tf.dispatch.BackendUnavailableError`).  Wiring the kernels in means: build
an ``Implementation`` from the library's ops (same signatures as below) and return it here.
"""
from dataclasses import dataclass
from typing import Callable

from ... import _env
from .. import tf
from ..dispatch import BackendUnavailableError, gpu_library
from . import layer_norm, lstm_gates

__all__ = ["Implementation", "REFERENCE", "layer_norm_eligible", "lstm_gates_eligible", "select"]

KERNEL_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


@dataclass(frozen=True)
class Implementation:
    """One implementation of the family's ops.

    ``layer_norm(x, g, b, axis, segments, epsilon, relu) -> y`` (differentiable in x, g, b);
    ``lstm_gates(c, gates, bias, forget_bias) -> (c_next, h_next)`` with ``gates`` the tuple
    ``(i, j, f, o)`` and ``bias`` None or ``(4K,)`` (differentiable in c, the gates and bias).
    """

    name: str
    layer_norm: Callable
    lstm_gates: Callable


REFERENCE = Implementation("reference", layer_norm.layer_norm, lstm_gates.lstm_gates)


def layer_norm_eligible(dtype, axis, rank):
    """Whether GPU kernels could take this ``layer_norm``: a kernel dtype, features first or last."""
    return dtype in KERNEL_DTYPES and axis in (0, rank - 1)


def lstm_gates_eligible(dtype):
    """Whether GPU kernels could take these gates: a kernel dtype."""
    return dtype in KERNEL_DTYPES


def select(eligible, what):
    """The :class:`Implementation` for an op built now (``what`` names it in errors)."""
    if gpu_library(eligible) is None:
        return REFERENCE
    if _env.backend() == "triton":
        raise BackendUnavailableError(
            f"BLOCKSPARSE_BACKEND=triton asks for the GPU kernels, and the TensorFlow op library "
            f"holds no {what} kernels. Unset BLOCKSPARSE_BACKEND, or set it to 'auto' or "
            "'reference', to use the reference path (TensorFlow ops only).")
    return REFERENCE
