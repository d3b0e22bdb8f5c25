"""The implicit-GEMM path of the PyTorch convolution: launchers, autograd, custom ops.

Forward and input gradient: the Triton kernel of :mod:`blocksparse.ops.conv.implicit_gemm` on
channels-last activations (strided layers take their input gradient from the dense masked
convolution instead, with the filter gradient in one cuDNN call:
:func:`~blocksparse.ops.conv.implicit.dense_input_grad`).  The input (backward: the output
gradient) is read channels-last (a channels-last tensor as it is; any other is copied once, which
costs one pass but makes every chunk of channels one coalesced load), and the result is written
channels-last: a channels-first shaped tensor with channels-last strides, as cuDNN returns for
channels-last inputs.  The filter gradient is the dense masked convolution's
(:func:`.dense.dense_grads`, one cuDNN ``convolution_backward`` for the weight), gathered back to
the blocks -- or, where :func:`~blocksparse.ops.conv.wgrad.worth_sparse_wgrad` says (not yet by
default), the kernel of :mod:`blocksparse.ops.conv.wgrad` over the present blocks
(:func:`conv_implicit_wgrad`).

Eager calls whose launches (the output and, unless strided, the input gradient) come from the kernel
library run as one C++ autograd node, ``blocksparse_native::conv_implicit``
(``csrc/conv.cpp``, built by :mod:`blocksparse.torch._native`): the two prepared launches and the
filter gradient's geometry registered once per call shape (:func:`native_path` says whether an
op's calls were served so), nothing but the op call per call, and a backward in C++ -- which
autograd runs on its CUDA worker thread, where :class:`ImplicitConvFunction`'s Python costs several
times its GPU time.  Every other eager call (a launch through Triton's JIT, float32, an input not
on a 16-byte boundary, ``BLOCKSPARSE_TORCH_NATIVE=off``, the op not built) takes
:class:`ImplicitConvFunction` directly (no dispatcher), or for inference its forward.
``blocksparse::conv_implicit`` (with a fake function and registered autograd),
``blocksparse::conv_implicit_dx`` and ``blocksparse::conv_implicit_wgrad`` serve ``torch.compile``.
The op receives a string *handle* of the op's :class:`~.tables.Tables` (see :func:`register`), so that
the compiler sees only tensors and constants at its boundary (an integer attribute may be made
symbolic when a second op's call recompiles the same code); the dense filter's index is an
input, since the backward (traced by the compiler) builds the dense filter from it.
"""

import collections
import math
import threading
import types
import weakref

import numpy as np
import torch
import triton
from torch import Tensor

from ... import _env
from ...ops.conv import aot as _aot
from ...ops.conv.implicit import dense_input_grad
from ...ops.conv import wgrad as _wgrad
from ...ops.conv.wgrad import conv_wgrad_kernel, wgrad_items, wgrad_splits, worth_sparse_wgrad
from ...ops.conv.implicit_gemm import conv_implicit_kernel
from .. import _native
from .._autograd import direct_apply, functorch_active, owned
from .._backend import kernels_serve, sm_count
from .._reduce import sum_rows
from .._registry import digest
from .._launch import TRITON_TYPES, KernelLaunch, Operand, device_info, library, prepare
from .dense import dense, dense_grads, grad_frame, pad_widths

__all__ = ["implicit", "register", "serves", "launch_path", "native_path", "register_conv", "compiled_launch",
           "conv_implicit_fwd", "conv_implicit_dx", "conv_implicit_wgrad", "ImplicitConvFunction", "conv_implicit_op",
           "conv_implicit_dx_op", "conv_implicit_wgrad_op"]

_HANDLES = weakref.WeakValueDictionary()  # handle -> Tables; an op's handle lives as long as the op
_BUILT = collections.Counter()  # content digest -> Tables made with it so far
_LOCK = threading.Lock()


def register(tables):
    """A new handle of ``tables`` (a :class:`~.tables.Tables` whose spec has an implicit plan): a digest
    of its op's content, as the layouts' handles are, and its place among the ops of that content
    built in this process (each op keeps its own tables).  Compiled and exported graphs, and
    ``torch.compile``'s on-disk cache, reach an op of the same content in any process, never another."""
    spec = tables.spec
    arrays = (*spec.blocks.cs, *spec.blocks.ks)
    content = "conv-implicit-%016x" % digest(spec.geometry, spec.edge_bias, spec.transposed, spec.blocks.blocks,
                                            *(np.ascontiguousarray(a, np.int64).tobytes() for a in arrays))
    with _LOCK:
        handle = f"{content}-{_BUILT[content]}"
        _BUILT[content] += 1
        _HANDLES[handle] = tables
    return handle


def _tables(handle):
    tables = _HANDLES.get(handle)
    if tables is None:  # a graph from another process: any op of that content here serves it
        content = handle.rpartition("-")[0] + "-"
        tables = next((t for name, t in list(_HANDLES.items()) if name.startswith(content)), None)
    if tables is None:
        raise ValueError(f"unknown convolution handle {handle!r}: this process has built no BlocksparseConv with "
                         "that content (build the convolution a compiled or exported graph was made from first)")
    return tables


def serves(spec, x):
    """Whether the kernel can run this call (a convolution, a kernel dtype on a device it runs on)."""
    return spec.implicit is not None and kernels_serve(x)


def _precision(x):
    return "tf32" if x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32 else "ieee"


def _spatial3(values, fill):
    """A per-axis tuple as three axes (1-D / 2-D convolutions lead with neutral axes)."""
    return (fill,) * (3 - len(values)) + tuple(values)


def _scalars(spec, n, pixels, count, written, a5, transposed):
    """The kernel's integer arguments by name (see :mod:`blocksparse.ops.conv.implicit_gemm`)."""
    geometry = spec.geometry
    image, out = [x.image for x in geometry.axes], [x.out for x in geometry.axes]
    size_in, size_out = (out, image) if transposed else (image, out)
    names = ("ID", "IH", "IW", "OD", "OH", "OW", "stride_n", "stride_d", "stride_h", "stride_w", "step_d", "step_h",
             "step_w", "dil_d", "dil_h", "dil_w", "pad_d", "pad_h", "pad_w", "taps_h", "taps_w")
    values = (*_spatial3(size_in, 1), *_spatial3(size_out, 1), *a5.stride()[:4], *_spatial3(geometry.strides, 1),
              *_spatial3(geometry.dilates, 1), *_spatial3([x.pad for x in geometry.axes], 0),
              *_spatial3(geometry.TRS, 1)[1:])
    return {"tiles": count, "pixels": pixels, "K": written, **dict(zip(names, values))}


def compiled_launch(kernels, arch, sms, plan, spec, a5, written, transposed, precision, steps, tiles):
    """``(KernelLaunch, spec index)`` of the kernel library's spec for a call reading ``a5`` (the
    5-D channels-last view of the read tensor), or None where the library has none
    (:mod:`blocksparse.ops.conv.aot` says which calls it compiles)."""
    dtype = TRITON_TYPES.get(a5.dtype)
    if plan.align != 16 or dtype not in _aot.DTYPES:
        return None
    n, count = a5.shape[0], plan.tiles.shape[0]
    pixels = n * math.prod(x.image if transposed else x.out for x in spec.geometry.axes)
    if not pixels:
        return None
    scalars = _scalars(spec, n, pixels, count, written, a5, transposed)
    tile = _aot.tile_for(plan.block_n, count * triton.cdiv(pixels, 128), sms)
    index = kernels.find("conv", arch, dtype=dtype, transposed=transposed, bn=plan.block_n, bk=plan.block_k,
                         tile=tile, window=_aot.window_of(scalars))
    if index is None:
        return None
    bm, num_warps, num_stages = _aot.TILES[tile]
    args = {"X": Operand(0, a5.dtype), "W": Operand(1, a5.dtype), "Y": Operand(2, a5.dtype), "STEPS": steps,
            "TILES": tiles, **scalars}
    consts = {"BM": bm, "BN": plan.block_n, "BK": plan.block_k, "ALIGN": plan.align, "PRECISION": precision,
              "TRANSPOSED": transposed, "PREFETCH": True}
    return KernelLaunch(conv_implicit_kernel, (count * triton.cdiv(pixels, bm),), args, consts, num_warps,
                        num_stages), index


def _compiled(plan, spec, a5, written, transposed, precision, steps, tiles, runs):
    """The prepared launch of the kernel library for this call shape (cached in ``runs``), or None
    where no compiled spec serves it (the JIT does)."""
    key = (transposed, precision, a5.dtype, a5.device.index, tuple(a5.shape), a5.stride(), written)
    if key not in runs:
        runs[key] = None
        kernels = library()
        if kernels is not None and a5.is_cuda:
            info = device_info(a5.device.index)
            found = compiled_launch(kernels, info.arch, info.sms, plan, spec, a5, written, transposed, precision,
                                    steps, tiles)
            if found is not None:
                prepared = prepare(found[0], a5.device.index, kernels, found[1])
                runs[key] = prepared if prepared.path == "aot" else None  # a mismatch: the JIT's autotuner
    return runs[key]


def _launch(a, w, plan, steps, tiles, spec, written, transposed, precision, runs=None):
    """The kernel reading ``a`` (``(N, channels) + spatial``) into an ``(N, written) + spatial``
    tensor with channels-last strides; ``w``: the plan's packed filter.  A compiled spec of the
    kernel library launches it where one serves the call (``runs``: the prepared launches of the
    op's tables on this device), else Triton's JIT with its autotuner."""
    geometry = spec.geometry
    n = a.shape[0]
    image, out = [x.image for x in geometry.axes], [x.out for x in geometry.axes]
    size_in, size_out = (out, image) if transposed else (image, out)
    a_last = a.movedim(1, -1).contiguous()  # no copy for channels-last input
    a5 = a_last.view(n, *_spatial3(size_in, 1), a.shape[1])
    alloc = torch.empty if plan.covers else torch.zeros  # channels no block writes stay zero
    y = alloc((n, *size_out, written), dtype=a.dtype, device=a.device)
    pixels, count = y.numel() // max(written, 1), plan.tiles.shape[0]
    run = None if runs is None else _compiled(plan, spec, a5, written, transposed, precision, steps, tiles, runs)
    if run is not None and not (a5.data_ptr() | w.data_ptr()) % 16:  # the specs assume aligned buffers
        run([a5, w, y])
    elif pixels:
        conv_implicit_kernel[lambda meta: (count * triton.cdiv(pixels, meta["BM"]),)](
            a5, w, y, steps, tiles, **_scalars(spec, n, pixels, count, written, a5, transposed),
            BN=plan.block_n, BK=plan.block_k, ALIGN=plan.align, PRECISION=precision, TRANSPOSED=transposed,
        )
    return y.movedim(-1, 1)


def launch_path(device_tables, transposed=False):
    """``"aot"`` where the op's calls so far launched from the kernel library in direction
    ``transposed`` (the input gradient), ``"jit"`` where they took Triton's JIT, None before any."""
    paths = {run is not None for key, run in _runs(device_tables).items() if key[0] == transposed}
    return None if not paths else "aot" if paths == {True} else "jit"


def _runs(device_tables):
    """The prepared launches of an op's tables on one device (:class:`~.tables.Tables`)."""
    return device_tables.implicit_runs


def conv_implicit_fwd(x, flat, spec, device_tables, precision):
    """``y`` (``(N, K) + MPQ``, channels-last strides) of input ``x`` (``(N, C) + DHW``) and the flat
    filter, both of one kernel dtype."""
    t = device_tables
    return _launch(x, flat.index_select(0, t.implicit_weight), spec.implicit, t.implicit_steps,
                   t.implicit_tiles, spec, spec.blocks.K, False, precision, _runs(t))


def conv_implicit_dx(dy, flat, spec, device_tables, precision):
    """The input gradient (``(N, C) + DHW``, channels-last strides) for output gradient ``dy``."""
    t = device_tables
    return _launch(dy, flat.index_select(0, t.implicit_grad_weight), spec.implicit_grad, t.implicit_grad_steps,
                   t.implicit_grad_tiles, spec, spec.blocks.C, True, precision, _runs(t))


def conv_implicit_wgrad(x, dy, spec, device_tables, precision):
    """The flat filter's gradient over the present blocks only (:mod:`blocksparse.ops.conv.wgrad`),
    for input ``x`` and output gradient ``dy`` of one kernel dtype, in that dtype."""
    plan, t, geometry = spec.implicit, device_tables, spec.geometry
    if not hasattr(t, "implicit_wgrad"):  # (items, int64 packed -> flat index), made on first use
        t.implicit_wgrad = (torch.from_numpy(wgrad_items(plan)).to(x.device), t.implicit_weight.long())
    items, index = t.implicit_wgrad
    n, image = x.shape[0], [a.image for a in geometry.axes]
    x5 = x.movedim(1, -1).contiguous().view(n, *_spatial3(image, 1), x.shape[1])  # no copy if channels-last
    dy_last = dy.movedim(1, -1).contiguous()
    pixels, size = dy_last.numel() // max(spec.blocks.K, 1), plan.weight.size
    bm = _wgrad.WGRAD_BM
    splits = wgrad_splits(items.shape[0], pixels, sm_count(x.device), bm)
    part = torch.empty((splits, size), dtype=torch.float32, device=x.device)
    if pixels and items.shape[0]:
        scalars = _scalars(spec, n, pixels, 0, spec.blocks.K, x5, False)
        del scalars["tiles"]
        conv_wgrad_kernel[(items.shape[0], splits)](
            x5, dy_last, part, t.implicit_steps, t.implicit_tiles, items, size, **scalars,
            BM=bm, BN=plan.block_n, BK=plan.block_k, ALIGN=plan.align, PRECISION=precision,
            num_warps=_wgrad.WGRAD_WARPS, num_stages=_wgrad.WGRAD_STAGES)
    else:
        part.zero_()
    (packed,) = sum_rows([(part, x.dtype)])
    return torch.empty_like(packed).index_copy_(0, index, packed)


class ImplicitConvFunction(torch.autograd.Function):
    """``y`` and the input gradient from the kernel; the dense masked convolution's filter gradient."""

    @staticmethod
    def forward(ctx, x, flat, dense_index, handle, precision):
        tables = _tables(handle)
        ctx.save_for_backward(x, flat, dense_index)
        ctx.handle, ctx.precision = handle, precision
        return owned(conv_implicit_fwd(x, flat, tables.spec, tables.on(x.device), precision))

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # create_graph: the dense convolution's gradients, differentiable again
            return (*_differentiable_grads(ctx, dy), None, None, None)
        return (*_grads(ctx, dy, _eager_dx, _eager_wgrad), None, None, None)


def _differentiable_grads(ctx, dy):
    """``(dx, dflat)`` as the dense masked convolution's autograd gives them, with their own graph
    (a gradient taken with ``create_graph=True``): the kernels' gradients are not differentiable."""
    x, flat, dense_index = ctx.saved_tensors
    needs = ctx.needs_input_grad[:2]
    spec = _tables(ctx.handle).spec
    y = dense(x, flat, spec, types.SimpleNamespace(dense=dense_index))
    grads = iter(torch.autograd.grad(y, [t for t, n in zip((x, flat), needs) if n], dy, create_graph=True))
    return tuple(next(grads) if n else None for n in needs)


def _grads(ctx, dy, input_grad, filter_grad=None, traced=False):
    """``(dx, dflat)``: ``input_grad(dy, flat, handle, precision)`` (strided layers: the dense
    convolution's) and the filter gradient -- ``filter_grad(x, dy, handle, precision)`` where given
    and :func:`~blocksparse.ops.conv.wgrad.worth_sparse_wgrad` says, else the dense convolution's;
    ``traced``: the custom ops' backward (``torch.compile``)."""
    x, flat, dense_index = ctx.saved_tensors
    need_x, need_flat = ctx.needs_input_grad[:2]
    spec = _tables(ctx.handle).spec
    sparse_w = need_flat and filter_grad is not None and worth_sparse_wgrad(spec.implicit, spec.blocks.density)
    dense_x, dense_w = need_x and dense_input_grad(spec.geometry), need_flat and not sparse_w
    dx = dflat = None
    if dense_x or dense_w:  # one cuDNN call for what the dense convolution gives
        dx, dflat = dense_grads(dy, x, flat, spec, dense_index, dense_x, dense_w, traced)
    if need_x and not dense_x:
        dx = input_grad(dy, flat, ctx.handle, ctx.precision)
    if sparse_w:
        dflat = filter_grad(x, dy, ctx.handle, ctx.precision)
    return dx, dflat


def _eager_wgrad(x, dy, handle, precision):
    tables = _tables(handle)
    return conv_implicit_wgrad(x, dy, tables.spec, tables.on(dy.device), precision)


def _eager_dx(dy, flat, handle, precision):
    tables = _tables(handle)
    return conv_implicit_dx(dy, flat, tables.spec, tables.on(dy.device), precision)


_apply = direct_apply(ImplicitConvFunction)


@torch.library.custom_op("blocksparse::conv_implicit", mutates_args=())
def conv_implicit_op(x: Tensor, flat: Tensor, dense_index: Tensor, handle: str, precision: str) -> Tensor:
    tables = _tables(handle)
    return conv_implicit_fwd(x, flat, tables.spec, tables.on(x.device), precision)


@conv_implicit_op.register_fake
def _(x, flat, dense_index, handle, precision):
    spec = _tables(handle).spec
    return x.new_empty((x.shape[0], *spec.geometry.MPQ, spec.blocks.K)).movedim(-1, 1)


@torch.library.custom_op("blocksparse::conv_implicit_dx", mutates_args=())
def conv_implicit_dx_op(dy: Tensor, flat: Tensor, handle: str, precision: str) -> Tensor:
    return _eager_dx(dy, flat, handle, precision)


@conv_implicit_dx_op.register_fake
def _(dy, flat, handle, precision):
    spec = _tables(handle).spec
    return dy.new_empty((dy.shape[0], *spec.geometry.DHW, spec.blocks.C)).movedim(-1, 1)


@torch.library.custom_op("blocksparse::conv_implicit_wgrad", mutates_args=())
def conv_implicit_wgrad_op(x: Tensor, dy: Tensor, handle: str, precision: str) -> Tensor:
    return _eager_wgrad(x, dy, handle, precision)


@conv_implicit_wgrad_op.register_fake
def _(x, dy, handle, precision):
    return x.new_empty((_tables(handle).spec.blocks.size,))


def _setup_context(ctx, inputs, output):
    x, flat, dense_index, handle, precision = inputs
    ctx.save_for_backward(x, flat, dense_index)
    ctx.handle, ctx.precision = handle, precision


def _backward_op(ctx, dy):
    return (*_grads(ctx, dy, conv_implicit_dx_op, conv_implicit_wgrad_op, traced=True), None, None, None)


conv_implicit_op.register_autograd(_backward_op, setup_context=_setup_context)


def native_path(device_tables):
    """``"native"`` where the op's eager call shapes so far were registered with the native op (their
    calls on 16-byte aligned inputs run as its C++ node), ``"python"`` where some were not (their
    calls take :class:`ImplicitConvFunction`), None before any CUDA call with the native op on."""
    ids = list(device_tables.implicit_native.values())
    return None if not ids else "python" if any(i is False for i in ids) else "native"  # id 0 is no False


def _native_conv(x, spec, t, precision):
    """The native op's conv record for calls like ``x`` (registered on the first CUDA call with the op
    on, cached in ``t.implicit_native``), or None where the call takes the Python path: a launch not
    from the kernel library, ``x`` not on a 16-byte boundary, the op off or not built, a filter
    gradient over the present blocks (which the node does not launch)."""
    if worth_sparse_wgrad(spec.implicit, spec.blocks.density):  # the Python path computes that filter gradient
        return None
    key = (precision, x.dtype, x.shape)
    conv = t.implicit_native.get(key)
    if conv is None:
        if not x.is_cuda or not _native.available():  # nothing cached: the op may be switched on later
            return None
        conv = t.implicit_native[key] = _native_record(x, spec, t, precision)
    return conv if conv is not False and not x.data_ptr() % 16 and _env.torch_native() else None


def _native_record(x, spec, t, precision):
    """Register the call shape of ``x`` with the native op: its id, or False where the kernel library
    does not serve both launches (or an output to zero-fill is not a whole number of 32-bit words)."""
    geometry, blocks, runs = spec.geometry, spec.blocks, t.implicit_runs
    n, image, out = x.shape[0], [a.image for a in geometry.axes], [a.out for a in geometry.axes]
    # the tensors the launches read, channels-last: the input, the output gradient
    read = x.new_empty((n, *_spatial3(image, 1), blocks.C)), x.new_empty((n, *_spatial3(out, 1), blocks.K))
    fwd = _compiled(spec.implicit, spec, read[0], blocks.K, False, precision, t.implicit_steps, t.implicit_tiles,
                    runs)
    launches = [(fwd, (n, *out, blocks.K), spec.implicit)]
    if not dense_input_grad(spec.geometry):
        dx = _compiled(spec.implicit_grad, spec, read[1], blocks.C, True, precision, t.implicit_grad_steps,
                       t.implicit_grad_tiles, runs)
        launches.append((dx, (n, *image, blocks.C), spec.implicit_grad))
    if any(run is None for run, _, _ in launches):
        return False
    ids = []
    for run, shape, plan in launches:
        if not plan.covers and math.prod(shape) * x.element_size() % 4:  # the runtime's fill writes words
            return False
        ids.append(_native.add_launch(run, shape, x.dtype, zero=not plan.covers))
    bprop = ids[1] if len(ids) > 1 else -1  # -1: the dense input gradient (strided layers)
    return register_conv(spec, ids[0], bprop, x.shape, x.dtype)


def register_conv(spec, fprop, bprop, x_shape, dtype):
    """The native op's conv record of ``spec`` on inputs of ``x_shape`` and ``dtype``, launching the
    records ``fprop`` (the output) and ``bprop`` (the input gradient; -1: the input gradient is the
    dense masked convolution's, from the filter gradient's cuDNN call): the geometry of the dense
    gradients (:func:`.dense.dense_grads`'s) registered with them."""
    geometry = spec.geometry
    x_pairs, dy_pairs = grad_frame(geometry)
    return _native.add_conv(fprop, bprop, x_shape, dtype, geometry.strides, [a.pad for a in geometry.axes],
                            geometry.dilates, pad_widths(x_pairs), pad_widths(dy_pairs),
                            (*spec.blocks.dense_shape[:2], *geometry.TRS))


def implicit(x, flat, spec, device_tables):
    """The implicit path's output (the custom op while ``torch.compile`` traces; the native op where
    it serves the call)."""
    precision = _precision(x)
    if torch.compiler.is_compiling():
        return conv_implicit_op(x, flat, device_tables.dense, device_tables.implicit_handle, precision)
    if not functorch_active():
        conv = _native_conv(x, spec, device_tables, precision)
        if conv is not None:
            t = device_tables
            return _native.conv(x, flat, t.implicit_weight, t.implicit_grad_weight, t.dense, conv)
    if torch.is_grad_enabled() and (x.requires_grad or flat.requires_grad):
        return _apply(x, flat, device_tables.dense, device_tables.implicit_handle, precision)
    return conv_implicit_fwd(x, flat, spec, device_tables, precision)
