"""Launchers of the fused attention kernels on torch tensors: read dims, allocate, launch.

What a call launches is described once per call shape (:class:`~blocksparse.torch._launch.KernelLaunch`:
:func:`fwd_launch`, :func:`bwd_launches`) and kept ready (:func:`runners`): on a GPU the kernel
library's compiled spec where one serves the launch (one C call; :mod:`blocksparse.ops.attention.aot`
says which), else Triton's JIT (any GPU, and Triton's CPU interpreter).

``tables`` are the layout's device tables (:meth:`.state.LayoutState.tables`): the row lists
(forward, dq) and column lists (dk/dv) of :mod:`blocksparse.ops.attention.blocklist`, and the
``uint8`` element-mask table.  With ``cfg.tma`` and tensors that tensor descriptors can address
(Hopper and newer, 16-byte aligned rows), tiles move through 4-D descriptors; otherwise through
pointer loads.
"""
import functools
import math
from dataclasses import asdict, replace

import torch

from ... import _env
from ...ops.attention import configs
from ...ops.attention.aot import backward_launches
from ...ops.attention.bwd import attn_bwd_delta_kernel, attn_bwd_kernel
from ...ops.attention.fwd import attn_fwd_kernel
from .. import _launch
from .._launch import TRITON_TYPES, Descriptor, KernelLaunch, Operand

if _env.triton_interpret():
    from ...ops.common.interpreter import patch_bf16_dot, patch_descriptor_reduce

    patch_bf16_dot()
    patch_descriptor_reduce()

LOG2E = 1.0 / math.log(2.0)

#: The call tensors' positions: forward ``(q, k, v, o, lse, seqlens)``, backward as below.
Q, K, V, O = 0, 1, 2, 3
FWD_LSE, FWD_SEQLENS = 4, 5
DO, DQ, DK, DV, LSE, DELTA, SEQLENS, DS = 4, 5, 6, 7, 8, 9, 10, 11



def fwd(q, k, v, seqlens, tables, *, block_size, causal, scale, cfg):
    """``(o, lse)``: o ``(B, HQ, S, D)`` in q's dtype, lse ``(B, HQ, S)`` float32 in base-2 units."""
    q, k, v = (_unit_stride(t) for t in (q, k, v))
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:3], dtype=torch.float32)
    if o.numel() == 0:  # an empty batch: nothing to launch (descriptors need positive sizes)
        return o, lse
    tma = cfg.tma and tma_ok(q, k, v)
    key = ("fwd", q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, id(tables),
           seqlens is None, block_size, causal, scale, cfg, tma)
    (run,) = runners(key, q.device, cfg, lambda: [fwd_launch(q, k, v, seqlens is not None, tables,
                                                             block_size=block_size, causal=causal, scale=scale,
                                                             cfg=cfg, tma=tma)])
    run([q, k, v, o, lse, seqlens])
    return o, lse


def bwd(do, q, k, v, o, lse, seqlens, tables, *, block_size, causal, scale, cfg):
    """``(dq, dk, dv)`` of :func:`fwd`'s ``o`` given its gradient ``do``."""
    do, q, k, v = (_unit_stride(t) for t in (do, q, k, v))
    dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)
    if q.numel() == 0:
        return q.new_empty(q.shape), dk, dv
    chunk = _ds_chunk(q, k, tables, block_size) if cfg.store_ds and seqlens is None else 0
    if cfg.store_ds and not chunk:
        cfg = replace(cfg, store_ds=False)  # ragged lengths, or one head's scratch too large: dS recomputed
    ds = q.new_empty(chunk * _ds_unit(q, k, tables, block_size)) if chunk else None
    # float32 (zeroed by the launch) that the dk/dv programs add into, or the dq programs' output
    dq = q.new_empty(q.shape, dtype=torch.float32 if cfg.atomic_dq else q.dtype)
    delta = lse.new_empty(lse.shape)
    tma = cfg.tma and tma_ok(q, k, v, o, do)
    key = ("bwd", q.shape, q.stride(), k.shape, k.stride(), v.stride(), o.stride(), do.stride(), q.dtype, q.device,
           id(tables), seqlens is None, block_size, causal, scale, cfg, tma)
    tensors = [q, k, v, o, do, dq, dk, dv, lse, delta, seqlens, ds]
    for run in runners(key, q.device, cfg, lambda: bwd_launches(q, k, v, o, do, seqlens is not None, tables,
                                                                block_size=block_size, causal=causal, scale=scale,
                                                                cfg=cfg, tma=tma)):
        run(tensors)
    return (dq.to(q.dtype) if cfg.atomic_dq else dq), dk, dv


def _ds_unit(q, k, tables, block_size):
    """Elements of the ``dS`` scratch per key/value head (of a batch element): a block per column
    entry of the largest layout head, for each query head it serves."""
    return (q.shape[1] // k.shape[1]) * tables.span * block_size * block_size


def _ds_chunk(q, k, tables, block_size):
    """Key/value heads (batch x head) whose ``dS`` a ``store_ds`` backward holds at once: as many as
    :data:`~blocksparse.ops.attention.configs.DS_SCRATCH_MAX_BYTES` allows, all where they fit (0:
    not even one, or no block attended)."""
    unit = _ds_unit(q, k, tables, block_size) * q.element_size()
    return min(k.shape[0] * k.shape[1], configs.DS_SCRATCH_MAX_BYTES // unit) if unit else 0


def runners(key, device, cfg, describe):
    """The prepared launches of call shape ``key`` with tile config ``cfg`` (``describe()`` lists
    them the first time)."""
    return _PLANS.runners(key, device, describe, cfg)


def prepare_on(launch, cfg, kernels, arch, index):
    """The runner of ``launch`` (tile config ``cfg``) on GPU ``index`` of ``sm_{arch}`` with the
    kernel library ``kernels`` (or None)."""
    return _PLANS.prepare_on(launch, kernels, arch, index, cfg)


def _spec(kernels, arch, launch, cfg):
    """Index of the compiled spec of ``launch`` (fields of :func:`blocksparse.ops.attention.aot.fields`),
    or None; :func:`blocksparse.torch._launch.prepare` then checks every argument against it."""
    c = launch.constexprs
    if not c.get("TMA") or c.get("HAS_SEQLENS") or c.get("HAS_MASKS"):
        return None  # compiled: tensor-descriptor tiles, no ragged lengths or element masks
    dtype = next(TRITON_TYPES[a.dtype] for a in launch.args.values() if isinstance(a, Descriptor))
    if launch.kernel is attn_bwd_delta_kernel:
        return kernels.find("attention", arch, product="delta", dtype=dtype, head_dim=c["D"], bm=cfg.BM2,
                            num_warps=cfg.num_warps)
    unit = launch.args["GROUP"] == 1 and launch.args["HL"] == 1
    fields = dict(dtype=dtype, head_dim=c["D"], block_size=c["BS"], causal=c["CAUSAL"], unit=unit,
                  config=asdict(cfg))
    if launch.kernel is attn_fwd_kernel:
        return kernels.find("attention", arch, product="fwd", **fields)
    return kernels.find("attention", arch, product="bwd", dkdv=c["DKDV"], dq=c["DQ_PASS"], **fields)


#: Prepared launches by call shape.
_PLANS = _launch.Plans(_spec)


def fwd_launch(q, k, v, has_seqlens, tables, *, block_size, causal, scale, cfg, tma):
    """The forward's launch on tensors shaped and strided as ``q``, ``k``, ``v`` (call tensors
    ``(q, k, v, o, lse, seqlens)``; ``o`` contiguous)."""
    B, HQ, S, D = q.shape
    rows = tables.rows
    o_strides = _contiguous(q.shape)
    tiles = _tiles(tma, q.dtype, (Q, "Q", q, q.stride(), cfg.BM), (K, "K", k, k.stride(), cfg.BN),
                   (V, "V", v, v.stride(), cfg.BN), (O, "O", q, o_strides, cfg.BM))
    args = dict(tiles, LSE=Operand(FWD_LSE, torch.float32),
                SEQLENS=Operand(FWD_SEQLENS, torch.int32) if has_seqlens else rows.order,
                HEADERS=rows.headers, ENTRIES=rows.entries, ORDER=rows.order, MASKS=tables.masks,
                **_strides(("q", q.stride()), ("k", k.stride()), ("v", v.stride()), ("o", o_strides)),
                S=S, HQ=HQ, HL=rows.heads, NB=rows.order.shape[0], GROUP=HQ // k.shape[1], qk_scale=scale * LOG2E)
    constexprs = dict(BS=block_size, BM=cfg.BM, BN=cfg.BN, D=D, CAUSAL=causal, HAS_SEQLENS=has_seqlens,
                      HAS_MASKS=tables.has_masks, TMA=tma, WARP_SPECIALIZE=cfg.warp_specialize,
                      PREFETCH=cfg.prefetch, HEADS_FIRST=cfg.heads_first)
    tiles_n = rows.order.shape[0] * (block_size // cfg.BM)
    grid = (B * HQ, tiles_n) if cfg.heads_first else (tiles_n, B * HQ)
    return KernelLaunch(attn_fwd_kernel, grid, args, constexprs, cfg.num_warps, cfg.num_stages)


def bwd_launches(q, k, v, o, do, has_seqlens, tables, *, block_size, causal, scale, cfg, tma):
    """The backward's launches, in order (call tensors ``(q, k, v, o, do, dq, dk, dv, lse, delta,
    seqlens, ds)``; ``dq``, ``dk``, ``dv`` contiguous; ``ds`` the ``store_ds`` scratch): a delta pass
    first where the config runs one, then one or two launches of :func:`attn_bwd_kernel`
    (:func:`~blocksparse.ops.attention.aot.backward_launches`)."""
    B, HQ, S, D = q.shape
    HK = k.shape[1]
    rows, cols = tables.rows, tables.cols
    nb = rows.order.shape[0]
    kv_tiles, q_tiles = nb * (block_size // cfg.BN1), nb * (block_size // cfg.BM2)
    q_out, kv_out = _contiguous(q.shape), _contiguous(k.shape)
    t = q.dtype
    args = dict(_tiles(tma, t, (Q, "Q1", q, q.stride(), cfg.BM1), (K, "K1", k, k.stride(), cfg.BN1),
                       (V, "V1", v, v.stride(), cfg.BN1), (DO, "DO1", q, do.stride(), cfg.BM1),
                       (DK, "DK", k, kv_out, cfg.BN1), (DV, "DV", k, kv_out, cfg.BN1),
                       (Q, "Q2", q, q.stride(), cfg.BM2), (K, "K2", k, k.stride(), cfg.BN2),
                       (V, "V2", v, v.stride(), cfg.BN2), (O, "O", q, o.stride(), cfg.BM2),
                       (DO, "DO2", q, do.stride(), cfg.BM2)),
                LSE=Operand(LSE, torch.float32), DELTA=Operand(DELTA, torch.float32),
                SEQLENS=Operand(SEQLENS, torch.int32) if has_seqlens else rows.order,
                COL_HEADERS=cols.headers, COL_ENTRIES=cols.entries, COL_ORDER=cols.order,
                ROW_HEADERS=rows.headers, ROW_ENTRIES=rows.entries, ROW_ORDER=rows.order, ROW_PAIRS=tables.pairs,
                MASKS=tables.masks, DS=Operand(DS if cfg.store_ds else Q, t),
                **_strides(("q", q.stride()), ("k", k.stride()), ("v", v.stride()), ("o", o.stride()),
                           ("do", do.stride()), ("dk", kv_out), ("dv", kv_out), ("dq", q_out)),
                S=S, HQ=HQ, HL=rows.heads, NB=nb, E_SPAN=tables.span, GROUP=HQ // HK, KV_TILES=kv_tiles,
                KV_HEADS=B * HK, Q_TILES=q_tiles, Q_HEADS=B * HQ, U0=0, qk_scale=scale * LOG2E, sm_scale=scale)
    # atomics add dq into float32 (zeroed first; with TMA bulk reduce-adds of [BM1, D] tiles through a
    # descriptor), else the dq programs store its tiles
    if cfg.atomic_dq:
        args["DQ"] = _tiles(tma, torch.float32, (DQ, "DQ", q, q_out, cfg.BM1))["DQ"]
    else:
        args["DQ"] = _tiles(tma, t, (DQ, "DQ", q, q_out, cfg.BM2))["DQ"]
    flags = dict(BS=block_size, BM1=cfg.BM1, BN1=cfg.BN1, BM2=cfg.BM2, BN2=cfg.BN2, D=D, CAUSAL=causal,
                 HAS_SEQLENS=has_seqlens, HAS_MASKS=tables.has_masks, TMA=tma, ATOMIC_DQ=cfg.atomic_dq,
                 PREFETCH=cfg.prefetch, HEADS_FIRST=cfg.heads_first, STORE_DS=cfg.store_ds)
    kinds, delta_first = backward_launches(cfg)
    launches = [_delta_launch(q, o, do, cfg, tma)] if delta_first else []
    units = B * HK
    # with store_ds the scratch holds the dS of `chunk` key/value heads: their two launches in turn
    chunk = _ds_chunk(q, k, tables, block_size) if cfg.store_ds else units
    for u0 in range(0, units, chunk):
        n = min(chunk, units - u0)
        part = dict(args, KV_HEADS=n, Q_HEADS=n * (HQ // HK), U0=u0)
        for dkdv, dq_pass in kinds:
            programs = kv_tiles * n * dkdv + q_tiles * n * (HQ // HK) * dq_pass
            launches.append(KernelLaunch(attn_bwd_kernel, (programs,), part, dict(flags, DKDV=dkdv, DQ_PASS=dq_pass),
                                         cfg.num_warps, cfg.num_stages, zero=(DQ,) if cfg.atomic_dq else ()))
    return launches


def _delta_launch(q, o, do, cfg, tma):
    """``delta = rowsum(o * do)`` into the call's ``delta`` (its own pass, before kernels that read it)."""
    B, HQ, S, D = q.shape
    args = dict(_tiles(tma, q.dtype, (O, "O", q, o.stride(), cfg.BM2), (DO, "DO", q, do.stride(), cfg.BM2)),
                DELTA=Operand(DELTA, torch.float32), **_strides(("o", o.stride()), ("do", do.stride())), S=S, HQ=HQ)
    return KernelLaunch(attn_bwd_delta_kernel, (S // cfg.BM2, B * HQ), args, dict(BM=cfg.BM2, D=D, TMA=tma),
                        cfg.num_warps, 3)


def _tiles(tma, dtype, *operands):
    """``{parameter: Descriptor or Operand}`` of ``(call index, parameter, tensor of the shape,
    strides, tile rows)`` operands."""
    out = {}
    for index, name, like, strides, rows in operands:
        shape = tuple(like.shape)
        out[name] = (Descriptor(index, shape, tuple(strides), (1, 1, rows, shape[-1]), dtype) if tma
                     else Operand(index, dtype))
    return out


def _strides(*named):
    """The kernels' (batch, head, sequence) stride arguments: ``stride_<name>b/h/s``."""
    return {f"stride_{name}{axis}": s for name, strides in named for axis, s in zip("bhs", strides[:3])}


def _contiguous(shape):
    """Strides of a fresh contiguous tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


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
