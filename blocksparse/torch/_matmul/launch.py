"""Launchers of the Triton kernels on torch tensors: read dims, allocate, grid, launch.

:func:`xprop` and :func:`updat` choose between the TMA kernels (Hopper and newer, where tensor
descriptors can address the tensors) and the pointer-load kernels, as the tile config asks.
Split reductions (``atomic`` / ``split > 1``) accumulate into a zeroed float32 buffer that is cast
to the output dtype at the end.
"""
import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import _env
from ...ops.matmul import configs
from ...ops.matmul.updat import updat_kernel
from ...ops.matmul.updat_tma import updat_tma_kernel
from ...ops.matmul.xprop import xprop_kernel
from ...ops.matmul.xprop_tma import xprop_tma_kernel

if _env.triton_interpret():
    from ...ops.common.interpreter import patch_bf16_dot

    patch_bf16_dot()


def xprop(x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision):
    """fprop (``trans=False``) or bprop (``trans=True``).

    ``headers``/``entries`` are the layout core's xprop table built with ``group=cfg.G``;
    ``atomic`` must be true when any output group has more than one segment.
    """
    if trans and configs.bprop_pretransposes_weight(x.dtype == torch.float32):
        w, trans = w.transpose(1, 2).contiguous(), False
    launch = xprop_tma if cfg.TMA and tma_ok(x, w) else xprop_ptr
    return launch(x, w, headers, entries, out_features=out_features, bs=bs, axis=axis, trans=trans,
                  cfg=cfg, atomic=atomic, precision=precision)


def updat(x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype):
    """updat; ``groups`` is ``Layout.updat_groups(cfg.G)``, ``split`` the token slices."""
    launch = updat_tma if cfg.TMA and tma_ok(x, dy) else updat_ptr
    return launch(x, dy, groups, w_shape=w_shape, bs=bs, axis=axis, cfg=cfg, split=split,
                  precision=precision, dw_dtype=dw_dtype)


def tma_ok(*tensors):
    """Whether tensor descriptors can address these tensors: row-major with 16-byte aligned rows,
    on a GPU with the tensor memory accelerator (sm_90+) or in Triton's interpreter."""
    for t in tensors:
        if t.stride(-1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
        if t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 9:
            return False
    return True


def xprop_ptr(x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision):
    """:func:`xprop` through :func:`xprop_kernel` (pointer loads, any GPU)."""
    n_tokens, out = _xprop_out(x, out_features, axis, atomic)
    if n_tokens:
        grid = (headers.shape[0] * triton.cdiv(n_tokens, cfg.BM),)
        xprop_kernel[grid](
            x, w, out, headers, entries,
            n_tokens, out_features, headers.shape[0],
            *_strides(x, axis), *_strides(out, axis),
            BS=bs, G=cfg.G, BM=cfg.BM, TRANS_W=trans, ATOMIC=atomic, PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return _cast(out, x.dtype)


def xprop_tma(x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision):
    """:func:`xprop` through :func:`xprop_tma_kernel` (needs :func:`tma_ok` tensors)."""
    n_tokens, out = _xprop_out(x, out_features, axis, atomic)
    if n_tokens:
        bk, bn = cfg.BK or bs, cfg.BN or bs
        w_desc = TensorDescriptor(w, [w.shape[0] * bs, bs], [bs, 1], [bn, bk] if trans else [bk, bn])
        grid = (headers.shape[0] * (bs // bn) * triton.cdiv(n_tokens, cfg.BM),)
        xprop_tma_kernel[grid](
            _desc(x, axis, cfg.BM, bk), w_desc, _desc(out, axis, cfg.BM, bn), out, headers, entries,
            headers.shape[0], n_tokens, out_features, *_strides(out, axis),
            BS=bs, G=cfg.G, BM=cfg.BM, BK=bk, BN=bn, X_T=axis == 0, TRANS_W=trans, ATOMIC=atomic,
            PRECISION=precision, UNROLL=cfg.UNROLL,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return _cast(out, x.dtype)


def updat_ptr(x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype):
    """:func:`updat` through :func:`updat_kernel` (pointer loads, any GPU)."""
    n_tokens, atomic, dw = _updat_out(x, axis, w_shape, split, dw_dtype)
    if n_tokens:
        per_split, grid = _token_slices(n_tokens, split, cfg.BK, groups)
        updat_kernel[grid](
            x, dy, dw, groups,
            n_tokens, per_split,
            *_strides(x, axis), *_strides(dy, axis),
            BS=bs, G=cfg.G, BK=cfg.BK, ATOMIC=atomic, PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return _cast(dw, dw_dtype)


def updat_tma(x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype):
    """:func:`updat` through :func:`updat_tma_kernel` (needs :func:`tma_ok` tensors)."""
    n_tokens, atomic, dw = _updat_out(x, axis, w_shape, split, dw_dtype)
    if n_tokens:
        per_split, grid = _token_slices(n_tokens, split, cfg.BK, groups)
        updat_tma_kernel[grid](
            _desc(x, axis, cfg.BK, bs), _desc(dy, axis, cfg.BK, bs), dw, groups, per_split, n_tokens,
            BS=bs, G=cfg.G, BK=cfg.BK, X_T=axis == 0, ATOMIC=atomic, PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return _cast(dw, dw_dtype)


def _tokens(t, axis):
    return t.shape[0] if axis == 1 else t.shape[1]


def _strides(t, axis):
    """(token stride, feature stride) of activations in either layout."""
    return (t.stride(0), t.stride(1)) if axis == 1 else (t.stride(1), t.stride(0))


def _xprop_out(x, out_features, axis, atomic):
    """(tokens, output buffer): float32 zeros for atomics, else uninitialised in x's dtype."""
    n = _tokens(x, axis)
    shape = (n, out_features) if axis == 1 else (out_features, n)
    return n, (x.new_zeros(shape, dtype=torch.float32) if atomic else x.new_empty(shape))


def _updat_out(x, axis, w_shape, split, dw_dtype):
    """(tokens, atomic, dw buffer): token slices reduce into float32 zeros."""
    n = _tokens(x, axis)
    atomic = split > 1 or n == 0
    return n, atomic, (x.new_zeros(w_shape, dtype=torch.float32) if atomic
                       else x.new_empty(w_shape, dtype=dw_dtype))


def _token_slices(n_tokens, split, bk, groups):
    """Tokens per slice (a multiple of ``bk``) and the (runs, slices) grid."""
    per_split = triton.cdiv(triton.cdiv(n_tokens, split), bk) * bk
    return per_split, (groups.shape[0], triton.cdiv(n_tokens, per_split))


def _cast(t, dtype):
    return t if t.dtype == dtype else t.to(dtype)


def _desc(t, axis, tokens_block, features_block):
    """Descriptor over activations in storage order, tile [tokens, features] (or transposed)."""
    block = [tokens_block, features_block] if axis == 1 else [features_block, tokens_block]
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)
