"""Launchers of the transformer kernels on torch tensors: read dims, allocate, grid, launch.

Kernel arguments are plain (pointers, ints, strides, the flat int32 tables of
:class:`.state.Tables`, constexprs), so the same kernels can be compiled ahead of time for the
TensorFlow op library.  Activations must have unit stride along features and packed scores must be
contiguous; the custom ops (:mod:`.ops`) see to that.
"""
import torch
import triton

from ... import _env
from ...ops.transformer.products import bst_nt_kernel, bst_xn_kernel
from ...ops.transformer.softmax import bst_softmax_grad_kernel, bst_softmax_kernel

if _env.triton_interpret():
    from ...ops.common.interpreter import patch_bf16_dot

    patch_bf16_dot()

#: head-dimension slice of the products (a power of two >= 16, the smallest tl.dot size)
MAX_BD = 128


def _head_slice(head_dim, bs):
    """``BD``: the head dimension rounded up to a power of two, at most 128 (64 for 128-blocks,
    whose ``[128, BD]`` float32 accumulator would not fit the registers otherwise)."""
    return max(16, min(triton.next_power_of_2(head_dim), MAX_BD if bs < 128 else MAX_BD // 2))


def _warps(bs):
    return 4 if bs <= 32 else 8


def _rows(n, heads):
    """The grid's second axis, one program row per (batch, head): CUDA allows 65535."""
    if n * heads > 65535:
        raise ValueError(f"the transformer kernels take at most 65535 batch * heads; got {n} * {heads}: "
                         "split the batch")
    return n * heads


def nt(a, b, tables, *, heads, lut_heads, blocks, bs, precision):
    """Packed scores ``(N, heads, blocks, bs, bs)`` of ``a`` (N, ctx_q, F) and ``b`` (N, ctx_k, F)."""
    n, _, features = a.shape
    head_dim = features // heads
    c = a.new_empty((n, heads, blocks, bs, bs))
    if n:
        bst_nt_kernel[(blocks, _rows(n, heads))](
            a, b, c, tables.coords,
            blocks, heads, lut_heads, head_dim,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            BS=bs, BD=_head_slice(head_dim, bs), PRECISION=precision, num_warps=_warps(bs),
        )
    return c


def xn(w, x, tables, *, trans, out_ctx, heads, lut_heads, bs, precision):
    """``nn`` (``trans=False``: ``w @ x`` by query rows, ``out_ctx = ctx_q``) or ``tn``
    (``trans=True``: ``w.T @ x`` by key columns, ``out_ctx = ctx_k``): ``(N, out_ctx, F)``."""
    n, _, features = x.shape
    head_dim = features // heads
    blocks = w.shape[2]
    y = x.new_empty((n, out_ctx, features))
    offsets = tables.col_offsets if trans else tables.row_offsets
    if n:
        bd = _head_slice(head_dim, bs)
        bst_xn_kernel[(out_ctx // bs, _rows(n, heads), triton.cdiv(head_dim, bd))](
            w, x, y, offsets, tables.col_blocks, tables.coords,
            blocks, heads, lut_heads, out_ctx // bs, head_dim,
            x.stride(0), x.stride(1), y.stride(0), y.stride(1),
            BS=bs, BD=bd, TRANS_W=trans, PRECISION=precision, num_warps=_warps(bs),
        )
    return y


def softmax(x, tables, *, scale, autoregress_at_key, masked, lut_heads, q_blocks, dtype):
    """Masked softmax of packed scores ``x`` along query rows, in ``dtype``."""
    n, heads, blocks, bs, _ = x.shape
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    if n:
        bst_softmax_kernel[(q_blocks, _rows(n, heads))](
            x, y, tables.row_offsets, tables.coords, tables.mask_index, tables.mask_bits,
            float(scale), 0 if autoregress_at_key is None else int(autoregress_at_key),
            blocks, heads, lut_heads, q_blocks,
            BS=bs, WORDS=triton.cdiv(bs, 32), HAS_MASK=masked, AUTOREGRESS=autoregress_at_key is not None,
            num_warps=_warps(bs),
        )
    return y


def softmax_grad(dy, y, tables, *, scale, lut_heads, q_blocks, dtype):
    """``(dy - sum_row(dy * y)) * y * scale`` on packed tensors, in ``dtype``."""
    n, heads, blocks, bs, _ = y.shape
    dx = torch.empty(y.shape, dtype=dtype, device=y.device)
    if n:
        bst_softmax_grad_kernel[(q_blocks, _rows(n, heads))](
            dy, y, dx, tables.row_offsets,
            float(scale), blocks, heads, lut_heads, q_blocks,
            BS=bs, num_warps=_warps(bs),
        )
    return dx
