"""The GPU path of the TensorFlow frontend: the three products through the compiled op library.

Each op gets the layout core's lookup tables as ``int32`` host tensors, built with the ``G`` of the
kernels that will run (read from the library's manifest for the GPU's architecture), and the
layout's sizes as attrs.  The op library launches the kernels on TensorFlow's CUDA stream.

The tables stay in host memory (the GPU kernels take them so): graphs hold them as constants, and
eager calls pass the same host tensors every step (:func:`host_tables`, one set per layout).  Each
op kernel uploads a table to its GPU the first time it sees it and keeps the copy
(``src/tf/device_tables.h``): no step copies a table to the device.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...ops.matmul import configs
from .. import tf
from .products import Products

__all__ = ["host_tables", "matmul_dx", "products", "register_gradients"]

_DTYPES = {tf.float16: "fp16", tf.bfloat16: "bf16", tf.float32: "fp32"}
_ATTRS = ("block_size", "axis", "blocks", "c_blocks", "k_blocks")


def _attrs(layout, axis):
    return dict(block_size=layout.block_size, axis=axis, blocks=layout.blocks,
                c_blocks=layout.CB, k_blocks=layout.KB)


def _numpy_tables(layout, kind, group):
    if kind == "updat":
        return (np.ascontiguousarray(layout.updat_groups(group), dtype=np.int32),)
    lut = getattr(layout, kind)(None, group=group)
    return lut.headers, lut.entries


@lru_cache(maxsize=256)
def _eager_tables(layout, kind, group):
    with tf.device("/device:CPU:0"):
        return tuple(tf.constant(t) for t in _numpy_tables(layout, kind, group))


def host_tables(layout, kind, group):
    """The tables of ``kind`` (``"fprop"``, ``"bprop"``: ``(headers, entries)``; ``"updat"``:
    ``(groups,)``) built with ``G = group``, as the ops take them: numpy arrays (graph constants)
    while a graph is built, else host tensors made once per layout, so that the op kernels find
    the device copies they made at the previous step by the buffer."""
    if tf.executing_eagerly():
        return _eager_tables(layout, kind, group)
    return _numpy_tables(layout, kind, group)


def matmul_dx(module, dy, w, headers, entries, attrs):
    """``BlocksparseMatmulDX``; its float32 kernels read the weight's blocks transposed (as the
    JIT launcher passes them), so those are transposed first."""
    if configs.bprop_pretransposes_weight(w.dtype == tf.float32):
        w = tf.transpose(w, [0, 2, 1])
    return module.blocksparse_matmul_dx(dy, w, headers, entries, **attrs)


def products(library, arch, layout, axis, dtype):
    """The :class:`Products` of ``library`` for this layout, axis and dtype on ``sm_{arch}``, or
    None where it has no kernels for them."""
    name = _DTYPES.get(tf.as_dtype(dtype))
    if name is None:
        return None
    groups = {p: library.group(arch, p, name, layout.block_size, axis)
              for p in ("fprop", "bprop", "updat")}
    if None in groups.values():
        return None
    ops = library.module
    register_gradients(ops)

    def fprop(x, w, layout, axis):
        return ops.blocksparse_matmul(x, w, *host_tables(layout, "fprop", groups["fprop"]),
                                      *host_tables(layout, "bprop", groups["bprop"]),
                                      *host_tables(layout, "updat", groups["updat"]), **_attrs(layout, axis))

    def bprop(dy, w, layout, axis):
        return matmul_dx(ops, dy, w, *host_tables(layout, "bprop", groups["bprop"]),
                         _attrs(layout, axis))

    def updat(x, dy, layout, axis, dw_dtype):
        dw = ops.blocksparse_matmul_dw(x, dy, *host_tables(layout, "updat", groups["updat"]),
                                       **_attrs(layout, axis))
        return dw if dw_dtype == tf.float32 else tf.cast(dw, dw_dtype)

    return Products(f"tf-gpu-sm{arch}", fprop, bprop, updat)


_registered = []


def register_gradients(module):
    """Register the gradient of ``BlocksparseMatmul`` (once per process): dx by
    ``BlocksparseMatmulDX`` and dW by ``BlocksparseMatmulDW`` (cast to the weight's dtype), from
    the tables the forward op carries.  The dx / dW ops have no gradient (no second order)."""
    if _registered:
        return
    _registered.append(module)

    @tf.RegisterGradient("BlocksparseMatmul")
    def _matmul_grad(op, dy):
        x, w, _, _, dx_headers, dx_entries, dw_groups = op.inputs
        attrs = {name: op.get_attr(name) for name in _ATTRS}
        dx = matmul_dx(module, dy, w, dx_headers, dx_entries, attrs)
        dw = module.blocksparse_matmul_dw(x, dy, dw_groups, **attrs)
        return [dx, tf.cast(dw, w.dtype), None, None, None, None, None]
