"""Launchers of the transformer kernels on torch tensors: read dims, allocate, grid, launch.

Kernel arguments are plain (pointers, ints, strides, the flat int32 tables of
:class:`.state.Tables`, constexprs), so the same kernels are compiled ahead of time
(:mod:`blocksparse.ops.transformer.aot`).  Each call shape's launch is described once
(:class:`~blocksparse.torch._launch.KernelLaunch`) and kept ready: on a GPU the kernel library's
spec where one serves it (one C call), else Triton's JIT (other head dimensions, dtypes, GPUs, and
the CPU interpreter).  Activations must have unit stride along features and packed scores must be
contiguous; the custom ops (:mod:`.ops`) see to that.
"""
import torch
import triton

from ... import _env
from ...ops.transformer.aot import head_slice as _head_slice, warps as _warps
from ...ops.transformer.products import bst_nt_kernel, bst_xn_kernel
from ...ops.transformer.softmax import bst_softmax_grad_kernel, bst_softmax_kernel
from .._launch import TRITON_TYPES, KernelLaunch, Operand, Plans

if _env.triton_interpret():
    from ...ops.common.interpreter import patch_bf16_dot

    patch_bf16_dot()


def _rows(n, heads):
    """The grid's second axis, one program row per (batch, head): CUDA allows 65535."""
    if n * heads > 65535:
        raise ValueError(f"the transformer kernels take at most 65535 batch * heads; got {n} * {heads}: "
                         "split the batch")
    return n * heads


def nt(a, b, tables, *, heads, lut_heads, blocks, bs, precision):
    """Packed scores ``(N, heads, blocks, bs, bs)`` of ``a`` (N, ctx_q, F) and ``b`` (N, ctx_k, F)."""
    c = a.new_empty((a.shape[0], heads, blocks, bs, bs))
    if a.shape[0]:
        key = ("nt", a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, id(tables), heads, lut_heads,
               blocks, bs, precision)
        _run(key, a.device, lambda: nt_launch(a, b, tables, heads=heads, lut_heads=lut_heads, blocks=blocks, bs=bs,
                                               precision=precision), [a, b, c])
    return c


def xn(w, x, tables, *, trans, out_ctx, heads, lut_heads, bs, precision):
    """``nn`` (``trans=False``: ``w @ x`` by query rows, ``out_ctx = ctx_q``) or ``tn``
    (``trans=True``: ``w.T @ x`` by key columns, ``out_ctx = ctx_k``): ``(N, out_ctx, F)``."""
    y = x.new_empty((x.shape[0], out_ctx, x.shape[2]))
    if x.shape[0]:
        key = ("xn", w.shape, w.dtype, x.shape, x.stride(), x.dtype, x.device, id(tables), trans, out_ctx, heads,
               lut_heads, bs, precision)
        _run(key, x.device, lambda: xn_launch(w, x, tables, trans=trans, out_ctx=out_ctx, heads=heads,
                                               lut_heads=lut_heads, bs=bs, precision=precision), [w, x, y])
    return y


def softmax(x, tables, *, scale, autoregress_at_key, masked, lut_heads, q_blocks, dtype):
    """Masked softmax of packed scores ``x`` along query rows, in ``dtype``."""
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    if x.shape[0]:
        key = ("softmax", x.shape, x.dtype, dtype, x.device, id(tables), float(scale), autoregress_at_key, masked,
               lut_heads, q_blocks)
        _run(key, x.device, lambda: softmax_launch(x, tables, scale=scale, autoregress_at_key=autoregress_at_key,
                                                    masked=masked, lut_heads=lut_heads, q_blocks=q_blocks,
                                                    dtype=dtype), [x, y])
    return y


def softmax_grad(dy, y, tables, *, scale, lut_heads, q_blocks, dtype):
    """``(dy - sum_row(dy * y)) * y * scale`` on packed tensors, in ``dtype``."""
    dx = torch.empty(y.shape, dtype=dtype, device=y.device)
    if y.shape[0]:
        key = ("softmax_grad", y.shape, dy.dtype, y.dtype, dtype, y.device, id(tables), float(scale), lut_heads,
               q_blocks)
        _run(key, y.device, lambda: softmax_grad_launch(dy, y, tables, scale=scale, lut_heads=lut_heads,
                                                         q_blocks=q_blocks, dtype=dtype), [dy, y, dx])
    return dx


# The launches, by the kernels' parameter names; the call tensors: nt (a, b, c), xn (w, x, y),
# softmax (x, y), softmax_grad (dy, y, dx).

def nt_launch(a, b, tables, *, heads, lut_heads, blocks, bs, precision):
    n, _, features = a.shape
    head_dim = features // heads
    return KernelLaunch(
        bst_nt_kernel, (blocks, _rows(n, heads)),
        dict(A=Operand(0, a.dtype), B=Operand(1, b.dtype), C=Operand(2, a.dtype), COORDS=tables.coords,
             blocks=blocks, heads=heads, lut_heads=lut_heads, head_dim=head_dim,
             stride_an=a.stride(0), stride_at=a.stride(1), stride_bn=b.stride(0), stride_bt=b.stride(1)),
        dict(BS=bs, BD=_head_slice(head_dim, bs), PRECISION=precision), num_warps=_warps(bs))


def xn_launch(w, x, tables, *, trans, out_ctx, heads, lut_heads, bs, precision):
    n, _, features = x.shape
    head_dim = features // heads
    bd = _head_slice(head_dim, bs)
    return KernelLaunch(
        bst_xn_kernel, (out_ctx // bs, _rows(n, heads), triton.cdiv(head_dim, bd)),
        dict(W=Operand(0, w.dtype), X=Operand(1, x.dtype), Y=Operand(2, x.dtype),
             OFFSETS=tables.col_offsets if trans else tables.row_offsets, BLOCK_IDS=tables.col_blocks,
             COORDS=tables.coords, blocks=w.shape[2], heads=heads, lut_heads=lut_heads, out_blocks=out_ctx // bs,
             head_dim=head_dim, stride_xn=x.stride(0), stride_xt=x.stride(1), stride_yn=out_ctx * features,
             stride_yt=features),
        dict(BS=bs, BD=bd, TRANS_W=trans, PRECISION=precision), num_warps=_warps(bs))


def softmax_launch(x, tables, *, scale, autoregress_at_key, masked, lut_heads, q_blocks, dtype):
    n, heads, blocks, bs, _ = x.shape
    return KernelLaunch(
        bst_softmax_kernel, (q_blocks, _rows(n, heads)),
        dict(X=Operand(0, x.dtype), Y=Operand(1, dtype), ROW_OFFSETS=tables.row_offsets, COORDS=tables.coords,
             MASK_INDEX=tables.mask_index, MASK_BITS=tables.mask_bits, scale=float(scale),
             ar_key=0 if autoregress_at_key is None else int(autoregress_at_key), blocks=blocks, heads=heads,
             lut_heads=lut_heads, q_blocks=q_blocks),
        dict(BS=bs, WORDS=triton.cdiv(bs, 32), HAS_MASK=masked, AUTOREGRESS=autoregress_at_key is not None),
        num_warps=_warps(bs))


def softmax_grad_launch(dy, y, tables, *, scale, lut_heads, q_blocks, dtype):
    n, heads, blocks, bs, _ = y.shape
    return KernelLaunch(
        bst_softmax_grad_kernel, (q_blocks, _rows(n, heads)),
        dict(DY=Operand(0, dy.dtype), Y=Operand(1, y.dtype), DX=Operand(2, dtype), ROW_OFFSETS=tables.row_offsets,
             scale=float(scale), blocks=blocks, heads=heads, lut_heads=lut_heads, q_blocks=q_blocks),
        dict(BS=bs), num_warps=_warps(bs))


def _run(key, device, describe, tensors):
    """Run call shape ``key``'s launch (``describe()`` builds it the first time) on ``tensors``."""
    (run,) = _PLANS.runners(key, device, lambda: [describe()])
    run(tensors)


_PRODUCTS = {bst_nt_kernel: "nt", bst_xn_kernel: "xn", bst_softmax_kernel: "softmax",
             bst_softmax_grad_kernel: "softmax_grad"}


def _spec(kernels, arch, launch):
    """Index of the compiled spec of ``launch`` (fields of :func:`blocksparse.ops.transformer.aot.fields`),
    or None; :func:`blocksparse.torch._launch.prepare` then checks every argument against it (one
    dtype for every data tensor, aligned buffers, head dimensions and strides multiples of 16)."""
    c = launch.constexprs
    dtypes = {a.dtype for a in launch.args.values() if isinstance(a, Operand)}
    if len(dtypes) != 1:
        return None
    fields = dict(product=_PRODUCTS[launch.kernel], dtype=TRITON_TYPES[dtypes.pop()], block_size=c["BS"],
                  bd=c.get("BD", 0), trans=c.get("TRANS_W", False), has_mask=c.get("HAS_MASK", False),
                  autoregress=c.get("AUTOREGRESS", False))
    return kernels.find("transformer", arch, **fields)


#: Prepared launches by call shape.
_PLANS = Plans(_spec)
