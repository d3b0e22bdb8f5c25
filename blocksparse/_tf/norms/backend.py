"""Which implementation computes ``layer_norm`` and the fused LSTM gates.

An :class:`Implementation` holds the family's differentiable ops: :data:`REFERENCE` (TensorFlow
ops, any device, XLA included) and, on a GPU, the compiled op library's kernels
(:mod:`.gpu`).  :func:`select` asks :func:`blocksparse._tf.dispatch.gpu_library` with the call's
eligibility (the dtypes and layouts the kernels take) like the matmul does, then whether the
library holds kernels for the call; where it does not, the reference path serves (one warning per
GPU architecture; ``BLOCKSPARSE_BACKEND=triton`` raises
:class:`~blocksparse._tf.dispatch.BackendUnavailableError` instead).
"""
from dataclasses import dataclass
from typing import Callable

from .. import tf
from ..dispatch import gpu_implementation
from . import layer_norm, lstm_gates

__all__ = ["Implementation", "REFERENCE", "layer_norm_eligible", "lstm_gates_eligible", "select"]

KERNEL_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


@dataclass(frozen=True)
class Implementation:
    """One implementation of the family's ops.

    ``layer_norm(x, g, b, axis, segments, epsilon, relu) -> y`` (differentiable in x, g, b);
    ``lstm_gates(c, gates, bias, forget_bias, merged=None) -> (c_next, h_next)`` with ``gates`` the
    tuple ``(i, j, f, o)``, ``merged`` the one ``(..., 4K)`` tensor they were split from (if any),
    and ``bias`` None or ``(4K,)`` (differentiable in c, the gates and bias).  An implementation
    built for one op may leave the other None.
    """

    name: str
    layer_norm: Callable
    lstm_gates: Callable


def _reference_lstm_gates(c, gates, bias, forget_bias, merged=None):
    return lstm_gates.lstm_gates(c, gates, bias, forget_bias)


REFERENCE = Implementation("reference", layer_norm.layer_norm, _reference_lstm_gates)


def layer_norm_eligible(dtype, axis, rank, size):
    """Whether GPU kernels could take this ``layer_norm``: a kernel dtype, features first or last
    (``size`` of them; features last: a multiple of 16, as the kernels were compiled)."""
    last = axis == rank - 1
    return dtype in KERNEL_DTYPES and (last or axis == 0) and (not last or size % 16 == 0)


def lstm_gates_eligible(dtype, k):
    """Whether GPU kernels could take these gates: a kernel dtype, ``K`` (None: unknown) a known
    multiple of 16."""
    return dtype in KERNEL_DTYPES and k is not None and k >= 16 and k % 16 == 0


def select(eligible, what, build):
    """The :class:`Implementation` for an op built now (``what`` names it in messages):
    ``build(library, arch)`` makes the GPU one, or None where the library has no kernels for it."""
    return gpu_implementation(eligible, what, build) or REFERENCE
