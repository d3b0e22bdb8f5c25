"""Which implementation serves a PyTorch call: the Triton kernels or the reference path.

Every family asks :func:`kernels_serve` (plus its own limits, e.g. the matmul's block sizes), so
``BLOCKSPARSE_BACKEND`` (see :mod:`blocksparse._env`) means the same thing for all of them.
"""
import functools

import torch

from .. import _env

#: dtypes the Triton kernels take (float64 always runs the reference path).
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def kernels_serve(t: torch.Tensor) -> bool:
    """Whether the Triton kernels serve a call on ``t`` (else the reference path does).

    ``auto``: CUDA tensors of a kernel dtype, where Triton imports.  ``triton``: always for a
    kernel dtype, and a ``RuntimeError`` where they cannot run (a CPU tensor without
    ``TRITON_INTERPRET=1``; meta tensors take the reference path).  ``reference``: never.
    """
    backend = _env.backend()
    if backend == "reference" or t.dtype not in KERNEL_DTYPES:
        return False
    if backend == "triton":
        if t.is_meta:  # shapes only: the reference path's ops give them
            return False
        if not (t.is_cuda or _env.triton_interpret()):
            raise RuntimeError("BLOCKSPARSE_BACKEND=triton needs CUDA tensors, or TRITON_INTERPRET=1 "
                               f"to run the kernels on the CPU; got a tensor on {t.device}")
        return True
    return t.is_cuda and _triton_importable()


@functools.cache
def _triton_importable():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _sm_count(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


#: Programs per SM assumed for CPU tensors (Triton's interpreter): a few, so persistent loops run.
INTERPRETER_SMS = 2


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a small stand-in for the interpreter)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def autocast_available(device_type):
    """Whether autocast exists on ``device_type`` (not on the meta device).  CUDA and the CPU are
    answered without asking torch, whose query some releases' ``torch.compile`` cannot trace."""
    return device_type in ("cuda", "cpu") or torch.amp.is_autocast_available(device_type)


def autocast_dtype_of(device_type):
    """The dtype autocast gives float activations on ``device_type`` (``"cuda"``, ``"cpu"``, ...),
    or None where it is off or does not exist (the meta device: asking torch about it raises)."""
    if autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None
