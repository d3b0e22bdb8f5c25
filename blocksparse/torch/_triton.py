"""Launchers of the Triton kernels on torch tensors: read dims, allocate, grid, launch."""
import torch
import triton

from .. import _env
from triton.tools.tensor_descriptor import TensorDescriptor

from ..kernels.updat import updat_kernel
from ..kernels.updat_tma import updat_tma_kernel, updat_tma_stacked_kernel
from ..kernels.xprop import xprop_kernel
from ..kernels.xprop_tma import xprop_tma_kernel

if _env.triton_interpret():
    from ..kernels._interpreter import patch_bf16_dot

    patch_bf16_dot()

PRECISIONS = {"ieee", "tf32"}


def _strides(t, axis):
    """(token stride, feature stride) of activations in either layout."""
    return (t.stride(0), t.stride(1)) if axis == 1 else (t.stride(1), t.stride(0))


def _empty_out(like, n_tokens, features, axis, dtype):
    shape = (n_tokens, features) if axis == 1 else (features, n_tokens)
    return like.new_empty(shape, dtype=dtype)


def xprop(x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision):
    """fprop (``trans=False``) or bprop (``trans=True``): the TMA kernel where ``cfg`` asks for it
    and descriptors can address the tensors, else the pointer kernel."""
    if trans and x.dtype == torch.float32:
        # exact float32 products read a transposed weight tile very slowly (50x on sm_90);
        # transposing the packed blocks once costs one pass over the (small) weight
        w, trans = w.transpose(1, 2).contiguous(), False
    launch = xprop_tma if cfg.TMA and tma_ok(x, w) else xprop_ptr
    return launch(x, w, headers, entries, out_features=out_features, bs=bs, axis=axis, trans=trans,
                  cfg=cfg, atomic=atomic, precision=precision)


def updat(x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype):
    """updat: the TMA kernel where ``cfg`` asks for it and descriptors can address the tensors."""
    launch = updat_tma if cfg.TMA and tma_ok(x, dy) else updat_ptr
    return launch(x, dy, groups, w_shape=w_shape, bs=bs, axis=axis, cfg=cfg, split=split,
                  precision=precision, dw_dtype=dw_dtype)


def xprop_ptr(x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision):
    """fprop (``trans=False``) or bprop (``trans=True``) through :func:`xprop_kernel`.

    ``headers``/``entries`` are the layout core's xprop table built with ``group=cfg.G``;
    ``atomic`` must be true when any output group has more than one segment.
    """
    n_tokens = x.shape[0] if axis == 1 else x.shape[1]
    num_segments = headers.shape[0]
    y = _empty_out(x, n_tokens, out_features, axis, x.dtype)
    if n_tokens == 0:
        return y
    if atomic:
        y32 = y.new_zeros(y.shape, dtype=torch.float32)
    out = y32 if atomic else y
    grid = (num_segments * triton.cdiv(n_tokens, cfg.BM),)
    xprop_kernel[grid](
        x, w, out, headers, entries,
        n_tokens, out_features, num_segments,
        *_strides(x, axis), *_strides(out, axis),
        BS=bs, G=cfg.G, BM=cfg.BM, TRANS_W=trans, ATOMIC=atomic, PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if atomic:
        y.copy_(y32)
    return y


def updat_ptr(x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype):
    """updat through :func:`updat_kernel`; ``groups`` is ``Layout.updat_groups(cfg.G)``."""
    n_tokens = x.shape[0] if axis == 1 else x.shape[1]
    atomic = split > 1 or n_tokens == 0
    dw = x.new_zeros(w_shape, dtype=torch.float32) if atomic else x.new_empty(w_shape, dtype=dw_dtype)
    if n_tokens == 0:
        return dw.to(dw_dtype)
    per_split = triton.cdiv(triton.cdiv(n_tokens, split), cfg.BK) * cfg.BK
    grid = (groups.shape[0], triton.cdiv(n_tokens, per_split))
    updat_kernel[grid](
        x, dy, dw, groups,
        n_tokens, per_split,
        *_strides(x, axis), *_strides(dy, axis),
        BS=bs, G=cfg.G, BK=cfg.BK, ATOMIC=atomic, PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dw if dw.dtype == dw_dtype else dw.to(dw_dtype)



def tma_ok(*tensors):
    """Whether tensor descriptors can address these tensors: row-major with 16-byte aligned rows,
    on a GPU with the tensor memory accelerator (sm_90+) or in Triton's interpreter."""
    for t in tensors:
        if t.stride(-1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
        if t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 9:
            return False
    return True


def _desc(t, axis, tokens_block, bs):
    """Descriptor over activations in storage order with a [tokens, features] (or transposed) tile."""
    block = [tokens_block, bs] if axis == 1 else [bs, tokens_block]
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def xprop_tma(x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision):
    """:func:`xprop_ptr` through :func:`xprop_tma_kernel` (needs :func:`tma_ok` tensors)."""
    n_tokens = x.shape[0] if axis == 1 else x.shape[1]
    num_segments = headers.shape[0]
    y = _empty_out(x, n_tokens, out_features, axis, torch.float32 if atomic else x.dtype)
    if atomic:
        y.zero_()
    if n_tokens == 0:
        return y.to(x.dtype)
    bk, bn = cfg.BK or bs, cfg.BN or bs
    w_desc = TensorDescriptor(w, [w.shape[0] * bs, bs], [bs, 1], [bn, bk] if trans else [bk, bn])
    grid = (num_segments * (bs // bn) * triton.cdiv(n_tokens, cfg.BM),)
    xprop_tma_kernel[grid](
        _desc(x, axis, cfg.BM, bk), w_desc, _desc(y, axis, cfg.BM, bn), y, headers, entries,
        num_segments, n_tokens, out_features, *_strides(y, axis),
        BS=bs, G=cfg.G, BM=cfg.BM, BK=bk, BN=bn, X_T=axis == 0, TRANS_W=trans, ATOMIC=atomic,
        PRECISION=precision, UNROLL=cfg.UNROLL,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y.to(x.dtype) if atomic else y


def updat_tma(x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype):
    """:func:`updat_ptr` through :func:`updat_tma_kernel` (needs :func:`tma_ok` tensors)."""
    n_tokens = x.shape[0] if axis == 1 else x.shape[1]
    atomic = split > 1 or n_tokens == 0
    dw = x.new_zeros(w_shape, dtype=torch.float32) if atomic else x.new_empty(w_shape, dtype=dw_dtype)
    if n_tokens == 0:
        return dw.to(dw_dtype)
    per_split = triton.cdiv(triton.cdiv(n_tokens, split), cfg.BK) * cfg.BK
    grid = (groups.shape[0], triton.cdiv(n_tokens, per_split))
    kernel = updat_tma_stacked_kernel if cfg.STACK else updat_tma_kernel
    kernel[grid](
        _desc(x, axis, cfg.BK, bs), _desc(dy, axis, cfg.BK, bs), dw, groups, per_split, n_tokens,
        BS=bs, G=cfg.G, BK=cfg.BK, X_T=axis == 0, ATOMIC=atomic, PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dw if dw.dtype == dw_dtype else dw.to(dw_dtype)
