"""Which implementation computes the three products of one block-sparse matmul.

Every caller (the forward op, its gradient, :func:`blocksparse.matmul.group_param_grads`) gets one
:class:`~.products.Products` when the op is built and uses it, so the choice holds for the gradient
too.  Four implementations: the GPU kernels (the compiled op library; :mod:`.gpu`), the reference
path (:mod:`.reference`), the portable path and the dense masked product
(:mod:`blocksparse._tf.portable.products`).

:func:`select` answers "the GPU kernels, or the reference path?" under ``BLOCKSPARSE_BACKEND``
(:mod:`blocksparse._tf.dispatch`).  :func:`choose` is what ``BlocksparseMatMul`` calls: with
``BLOCKSPARSE_BACKEND=auto`` it asks the cost model (:mod:`blocksparse.dispatch`) which of the
implementations that can run is fastest for the call, on every device; ``reference`` and ``triton``
keep :func:`select`'s answer.
"""
from __future__ import annotations

from functools import lru_cache

from ... import _env
from ...dispatch import Problem, check_impl, override_plan, shared_model, shipped_table
from ...ops.matmul.configs import KERNEL_BLOCK_SIZES
from ...ops.matmul.grouping import groups_well
from .. import device, tf
from ..dispatch import BackendUnavailableError, gpu_library, no_kernels
from ..portable import products as portable
from .products import REFERENCE, Products

__all__ = ["BackendUnavailableError", "DEFAULT_TOKENS", "DENSE", "PORTABLE", "Products", "REFERENCE",
           "choose", "plan", "select"]

_KERNEL_DTYPES = (tf.float16, tf.bfloat16, tf.float32)
#: Minibatch assumed when planning an op whose minibatch is unknown until the graph runs.
DEFAULT_TOKENS = 4096

PORTABLE = Products("portable", portable.fprop, portable.bprop, portable.updat)
DENSE = Products("dense", portable.dense_fprop, portable.dense_bprop, portable.dense_updat)


def select(layout, axis, dtype):
    """The GPU kernels' products for ``layout`` on ``axis`` with inputs of ``dtype``, or the
    reference path where they cannot serve (see :mod:`blocksparse._tf.dispatch` for how
    ``BLOCKSPARSE_BACKEND`` decides).  Block size 8, and sizes that are not a kernel block size,
    always take the reference path, as in the PyTorch frontend."""
    eligible = layout.block_size in KERNEL_BLOCK_SIZES and tf.as_dtype(dtype) in _KERNEL_DTYPES
    found = gpu_library(eligible)
    if found is None:
        return REFERENCE
    library, arch = found
    from . import gpu

    products = gpu.products(library, arch, layout, axis, dtype)
    if products is None:
        no_kernels(library, arch, f"{tf.as_dtype(dtype).name} blocks of {layout.block_size} on axis {axis}")
        return REFERENCE
    return products


@lru_cache(maxsize=64)
def _structured(layout):
    return groups_well(layout)


def _precision(dtype, on_gpu):
    name = tf.as_dtype(dtype).name
    if name == "float32" and on_gpu and tf.config.experimental.tensor_float_32_execution_enabled():
        return "tf32"
    return name


def _shipped_model(device_type):
    """The shipped model: TensorFlow's table for the device, else PyTorch's (the same kernels and
    cuBLAS; a plan's source names the file).  Models cache their plans: eager calls plan every time."""
    return shared_model("tensorflow" if shipped_table("tensorflow", device_type) else "torch", device_type)


def plan(layout, axis, dtype, tokens=None, impl="auto", cost_model=None):
    """``(Plan, Products)`` of an op built now: what runs, why, and the products that do it.

    ``tokens``: the minibatch if known when the op is built (else :data:`DEFAULT_TOKENS`); the
    plan assumes training (forward and both gradients).  ``impl`` forces an implementation.
    """
    check_impl(impl)
    gpu = select(layout, axis, dtype)
    backend = _env.backend()
    if backend != "auto":
        name = "reference" if gpu is REFERENCE else "kernels"
        return override_plan(name, f"BLOCKSPARSE_BACKEND={backend}"), gpu
    by_name = {"reference": REFERENCE, "portable": PORTABLE, "dense": DENSE}
    if gpu is not REFERENCE:
        by_name["kernels"] = gpu
    if impl != "auto":
        if impl not in by_name:
            raise BackendUnavailableError(f"impl='kernels' asks for the GPU kernels, which cannot serve "
                                          f"this op (no GPU, no op library, or no kernel for "
                                          f"{tf.as_dtype(dtype).name} blocks of {layout.block_size})")
        return override_plan(impl, f"impl={impl!r} was asked for"), by_name[impl]
    on_gpu = gpu is not REFERENCE or (device.device_arch() is not None and not device.cpu_requested())
    device_type = "cuda" if on_gpu else "cpu"
    problem = Problem(tokens or DEFAULT_TOKENS, layout.C, layout.K, layout.block_size, layout.density,
                      _precision(dtype, on_gpu), _structured(layout), True)
    candidates = tuple(by_name)
    chosen = (cost_model if cost_model is not None else _shipped_model(device_type)).choose(problem, candidates)
    return chosen, by_name[chosen.impl]


def choose(layout, axis, dtype, tokens=None, impl="auto", cost_model=None):
    """The :class:`Products` that :func:`plan` picks."""
    return plan(layout, axis, dtype, tokens, impl, cost_model)[1]
