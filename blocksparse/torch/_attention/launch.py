"""Launchers of the fused attention kernels on torch tensors: read dims, allocate, grid, launch.

``tables`` are the layout's device tables (:meth:`.state.LayoutState.tables`): the row lists
(forward, dq) and column lists (dk/dv) of :mod:`blocksparse.ops.attention.blocklist`, and the
``uint8`` element-mask table.  With ``cfg.tma`` and tensors that tensor descriptors can address
(Hopper and newer, 16-byte aligned rows), tiles move through 4-D descriptors; otherwise through
pointer loads.
"""
import functools
import math

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import _env
from ...ops.attention.bwd import attn_bwd_delta_kernel, attn_bwd_kernel
from ...ops.attention.fwd import attn_fwd_kernel

if _env.triton_interpret():
    from ...ops.common.interpreter import patch_bf16_dot

    patch_bf16_dot()

LOG2E = 1.0 / math.log(2.0)


def fwd(q, k, v, seqlens, tables, *, block_size, causal, scale, cfg):
    """``(o, lse)``: o ``(B, HQ, S, D)`` in q's dtype, lse ``(B, HQ, S)`` float32 in base-2 units."""
    q, k, v = (_unit_stride(t) for t in (q, k, v))
    B, HQ, S, D = q.shape
    o = q.new_empty(q.shape)
    lse = q.new_empty((B, HQ, S), dtype=torch.float32)
    if o.numel() == 0:  # an empty batch: nothing to launch (descriptors need positive sizes)
        return o, lse
    rows = tables.rows
    tma = cfg.tma and tma_ok(q, k, v)
    grid = _grid(rows.order.shape[0] * (block_size // cfg.BM), B * HQ, cfg)
    attn_fwd_kernel[grid](
        *_operands(tma, (q, cfg.BM), (k, cfg.BN), (v, cfg.BN), (o, cfg.BM)),
        lse, _seqlens_arg(seqlens, rows), rows.headers, rows.entries, rows.order, tables.masks,
        *_strides(q, k, v, o),
        S, HQ, rows.heads, rows.order.shape[0], HQ // k.shape[1], scale * LOG2E,
        BS=block_size, BM=cfg.BM, BN=cfg.BN, D=D,
        CAUSAL=causal, HAS_SEQLENS=seqlens is not None, HAS_MASKS=tables.has_masks, TMA=tma,
        WARP_SPECIALIZE=cfg.warp_specialize, PREFETCH=cfg.prefetch, HEADS_FIRST=cfg.heads_first,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o, lse


def bwd(do, q, k, v, o, lse, seqlens, tables, *, block_size, causal, scale, cfg):
    """``(dq, dk, dv)`` of :func:`fwd`'s ``o`` given its gradient ``do``."""
    do, q, k, v = (_unit_stride(t) for t in (do, q, k, v))
    B, HQ, S, D = q.shape
    HK = k.shape[1]
    dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)
    if q.numel() == 0:
        return q.new_empty(q.shape), dk, dv
    # float32 zeros that the dk/dv programs add into, or the dq programs' output
    dq = q.new_zeros(q.shape, dtype=torch.float32) if cfg.atomic_dq else q.new_empty(q.shape)
    delta = lse.new_empty(lse.shape)
    rows, cols = tables.rows, tables.cols
    tma = cfg.tma and tma_ok(q, k, v, o, do)
    nb = rows.order.shape[0]
    kv_tiles, q_tiles = nb * (block_size // cfg.BN1), nb * (block_size // cfg.BM2)
    kv_operands = _operands(tma, (q, cfg.BM1), (k, cfg.BN1), (v, cfg.BN1), (do, cfg.BM1), (dk, cfg.BN1), (dv, cfg.BN1))
    q_operands = _operands(tma, (q, cfg.BM2), (k, cfg.BN2), (v, cfg.BN2), (o, cfg.BM2), (do, cfg.BM2))
    dq_operand = dq if cfg.atomic_dq else _operands(tma, (dq, cfg.BM2))[0]  # atomics add through a pointer

    def launch(dkdv, dq_pass):
        programs = kv_tiles * B * HK * dkdv + q_tiles * B * HQ * dq_pass
        attn_bwd_kernel[(programs,)](
            *kv_operands, *q_operands, dq_operand, lse, delta, _seqlens_arg(seqlens, rows),
            cols.headers, cols.entries, cols.order, rows.headers, rows.entries, rows.order, tables.masks,
            *_strides(q, k, v, o, do, dk, dv, dq),
            S, HQ, rows.heads, nb, HQ // HK, kv_tiles, B * HK, q_tiles, B * HQ, scale * LOG2E, scale,
            BS=block_size, BM1=cfg.BM1, BN1=cfg.BN1, BM2=cfg.BM2, BN2=cfg.BN2, D=D, CAUSAL=causal,
            HAS_SEQLENS=seqlens is not None, HAS_MASKS=tables.has_masks, TMA=tma, DKDV=dkdv, DQ_PASS=dq_pass,
            ATOMIC_DQ=cfg.atomic_dq, PREFETCH=cfg.prefetch, HEADS_FIRST=cfg.heads_first,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )

    if cfg.atomic_dq or cfg.fused:  # delta first, then the dk/dv programs (and the dq ones, fused)
        _delta(o, do, delta, S, B, HQ, tma, cfg)
        launch(True, not cfg.atomic_dq)
    else:  # the dq programs write delta, then the dk/dv programs read it
        launch(False, True)
        launch(True, False)
    return (dq.to(q.dtype) if cfg.atomic_dq else dq), dk, dv


def _delta(o, do, delta, S, B, HQ, tma, cfg):
    """``delta = rowsum(o * do)`` into ``delta`` (its own pass, before kernels that read it)."""
    attn_bwd_delta_kernel[(S // cfg.BM2, B * HQ)](
        *_operands(tma, (o, cfg.BM2), (do, cfg.BM2)), delta, *_strides(o, do), S, HQ,
        BM=cfg.BM2, D=o.shape[-1], TMA=tma, num_warps=cfg.num_warps,
    )


def _grid(tiles, heads, cfg):
    """The grid of the forward (:func:`blocksparse.ops.attention.tiles.program_ids`)."""
    return (heads, tiles) if cfg.heads_first else (tiles, heads)


def tma_ok(*tensors):
    """Whether tensor descriptors can address these tensors: unit stride along D, 16-byte aligned
    base and outer strides, on a GPU with the tensor memory accelerator (sm_90+) or in Triton's
    interpreter."""
    for t in tensors:
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * t.element_size() % 16 for s in t.stride()[:-1]):
            return False
        if t.is_cuda and _major(t.device.index) < 9:
            return False
    return True


@functools.cache
def _major(index):
    """The compute capability's major number of CUDA device ``index`` (asked once per device)."""
    return torch.cuda.get_device_capability(index)[0]


def _unit_stride(t):
    """``t``, or a contiguous copy when D is strided or a dimension is broadcast (stride 0)."""
    return t if t.stride(-1) == 1 and 0 not in t.stride() else t.contiguous()


def _operands(tma, *tensors_rows):
    """Each tensor, or a descriptor over it whose block is ``[1, 1, rows, D]``."""
    if not tma:
        return [t for t, _ in tensors_rows]
    return [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[-1]])
            for t, rows in tensors_rows]


def _strides(*tensors):
    """(batch, head, sequence) strides of each tensor, in turn."""
    return [s for t in tensors for s in t.stride()[:3]]


def _seqlens_arg(seqlens, lists):
    """The lengths, or any int32 tensor when there are none (the kernels do not read it then)."""
    return lists.order if seqlens is None else seqlens
