"""fprop and bprop as one pipelined stream of table entries per program: persistent, stream-K and
grouped-output variants (TMA loads: Hopper and newer, or Triton's interpreter).

Candidates of the second round of kernel work (issue 16), swept on a GPU by
``bench/tune_bsmm2.py``; the production path (:mod:`.xprop_tma`) is unchanged.

A call's work is a sequence of *steps* ``(m, e)``: token tile ``m`` times entry ``e`` of a
:class:`~.stream_table.StreamTable` (one input block, up to ``G`` weight blocks, one per output of
the entry's group).  The kernel reads them from ``STEPS``, one row per step,
``(m, inp, group, last, block_0, ..., block_{G-1})`` (the entry copied in, so that the tile loads
wait on one level of table loads, as in :mod:`.xprop_tma`).  Each step runs in ``BS // BK``
sub-steps; program ``p`` walks the sub-steps ``[lo, hi)`` in ONE software-pipelined loop and writes
an output group when it reaches the group's last entry.  Compared with one program per (token tile,
output group):

* persistent (``SPLIT=False``, a few programs per SM; :func:`.stream_table.aligned_schedule`):
  loads of the next output tile are in flight while the current one finishes, so a short output
  column (3 blocks of bs 128 at density 0.1) no longer pays a pipeline fill and drain of its own;
* stream-K (``SPLIT=True``; :func:`.stream_table.split_schedule`): all sub-steps cut into ``P``
  equal ranges ``lo(p) = p * U // P`` -- for few tokens, every program streams the same number of
  weight blocks.  An output group cut between programs is reduced in the kernel, without atomics
  on the output and without zeroing or casting passes: each part writes its float32 partial to
  ``WS[2 * p + slot]`` (slot 0: the group is the first of the program's range) and, after its
  loop, takes a ticket from ``CNT[m * NG + group]``; the part that draws the last ticket adds every
  part's partial, writes the output and puts the counter back to zero (so ``CNT``, zeroed once,
  serves every later call on the same stream; calls that may run at once need counters of their
  own);
* grouped outputs (``G`` 2 or 4, any output groups, e.g. :func:`.stream_table.overlap_groups`):
  one activation tile serves ``G`` weight blocks; with ``SKIP`` a missing block (``-1``) costs
  neither matrix work nor bytes (its TMA load is zero-filled without a memory access, its dot is
  skipped by a branch uniform over the program).

Descriptors: ``x_desc`` over the activations in storage order, block ``[BM, BK]`` for (N, F)
(``[BK, BM]`` for (F, N), ``X_T``); ``w_desc`` over the packed weight viewed as
``(blocks * BS, BS)``, block ``[BK, BS]`` (``[BS, BK]`` with ``TRANS_W``).  Outputs are written
through pointers (``Y`` and its strides), not a TMA store, whose staging buffer would stay
allocated beside the pipeline's inside the loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import _env
from .stream_table import (StreamTable, adjacent_groups, aligned_schedule, overlap_groups, split_schedule,
                           stream_table)
from .xprop_tma import _w_tile, _x_tile

if _env.triton_interpret():
    from ..common.interpreter import patch_bf16_dot

    patch_bf16_dot()

__all__ = ["StreamConfig", "StreamPlan", "plan_stream", "device_plan", "xprop_stream", "xprop_stream_kernel"]


@dataclass(frozen=True)
class StreamConfig:
    """Tile and schedule of :func:`xprop_stream_kernel`.

    ``BM`` tokens x ``G`` outputs (1, 2, 4) per program tile, reductions in steps of ``BK`` (0: the
    block); ``SKIP``: branch around the dots of missing blocks; ``SPLIT``: stream-K ranges (else
    ranges end at output groups); ``PER_SM``: programs per multiprocessor (0: one per item, i.e.
    not persistent; stream-K needs ``PER_SM >= 1``); ``GROUPING``: ``"overlap"``
    (:func:`.stream_table.overlap_groups`) or ``"adjacent"``.
    """

    BM: int
    G: int
    num_warps: int
    num_stages: int
    BK: int = 0
    SKIP: bool = False
    SPLIT: bool = False
    PER_SM: int = 0
    GROUPING: str = "overlap"


@dataclass(frozen=True)
class StreamPlan:
    """Host side of one product's schedule (numpy): the table, steps and program ranges."""

    table: StreamTable
    steps: np.ndarray           # (S,) int32 step codes m * E + e
    rows: np.ndarray            # (S, 4 + G) int32 the kernel's step table: (m, *entries[e])
    cuts: np.ndarray | None     # (P + 1,) program ranges in steps (aligned schedules)
    programs: int
    token_tiles: int
    sub_steps: int              # BS // BK


# ----------------------------------------------------------------------------- kernels

@triton.jit
def _unit_start(i_p, num_units, num_programs):
    """First sub-step of program ``i_p`` of a stream-K split: ``i_p * U // P``."""
    return (tl.cast(i_p, tl.int64) * num_units // num_programs).to(tl.int32)


@triton.jit
def _owner(unit, num_units, num_programs):
    """The program whose stream-K range holds sub-step ``unit`` (the last p with lo(p) <= unit)."""
    return (((tl.cast(unit, tl.int64) + 1) * num_programs - 1) // num_units).to(tl.int32)


@triton.jit
def _lane_dot(acc, b_x, w_desc, blk, h, BS: tl.constexpr, BK: tl.constexpr, TRANS_W: tl.constexpr,
              SKIP: tl.constexpr, PRECISION: tl.constexpr):
    # the weight load stays outside the branch so that the pipeliner prefetches it (a missing
    # block's load is zero-filled by the copy engine without touching memory)
    b_w = _w_tile(w_desc, blk, h, 0, BS, BK, BS, TRANS_W, 1)
    if SKIP:
        if blk >= 0:
            acc = tl.dot(b_x, b_w, acc, input_precision=PRECISION)  # [BM, BK] @ [BK, BS] -> [BM, BS]
    else:
        acc = tl.dot(b_x, b_w, acc, input_precision=PRECISION)      # [BM, BK] @ [BK, BS] -> [BM, BS]
    return acc


@triton.jit
def _tile_offsets(BM: tl.constexpr, BS: tl.constexpr):
    return tl.arange(0, BM)[:, None] * BS + tl.arange(0, BS)[None, :]


@triton.jit
def _put(Y, OUTS, grp, j: tl.constexpr, acc, i_m, N, stride_yn, stride_yf,
         BM: tl.constexpr, BS: tl.constexpr, G: tl.constexpr):
    """Write lane ``j`` of output group ``grp``, token tile ``i_m`` (nothing for a padding lane)."""
    col = tl.load(OUTS + grp * G + j)
    if col >= 0:
        o_m = i_m * BM + tl.arange(0, BM)
        o_f = col * BS + tl.arange(0, BS)
        p_y = Y + o_m[:, None].to(tl.int64) * stride_yn + o_f[None, :].to(tl.int64) * stride_yf
        tl.store(p_y, acc.to(Y.dtype.element_ty), mask=o_m[:, None] < N)


@triton.jit
def _settle(item, Y, WS, CNT, OUTS, OFFSETS, N, stride_yn, stride_yf,
            num_entries, num_groups, num_units, num_programs,
            BS: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, KS: tl.constexpr):
    """Take a ticket for split ``item`` (its partial written); the last part adds every part's
    float32 partial, writes the output and resets the counter."""
    i_m = item // num_groups
    grp = item % num_groups
    a = (i_m * num_entries + tl.load(OFFSETS + grp)) * KS
    b = (i_m * num_entries + tl.load(OFFSETS + grp + 1)) * KS
    q_lo = _owner(a, num_units, num_programs)
    q_hi = _owner(b - 1, num_units, num_programs)
    ticket = tl.atomic_add(CNT + item, 1, sem="acq_rel")
    if ticket == q_hi - q_lo:
        o_t = _tile_offsets(BM, BS)
        acc0 = tl.zeros((BM, BS), dtype=tl.float32)
        if G > 1:
            acc1 = tl.zeros((BM, BS), dtype=tl.float32)
        if G > 2:
            acc2 = tl.zeros((BM, BS), dtype=tl.float32)
            acc3 = tl.zeros((BM, BS), dtype=tl.float32)
        for q in range(q_lo, q_hi + 1):
            first = a <= _unit_start(q, num_units, num_programs)
            ws = WS + (q * 2 + (1 - first.to(tl.int32))).to(tl.int64) * (G * BM * BS) + o_t
            # .cg: read through L2, where the other programs' partials are (never a stale L1 line)
            acc0 += tl.load(ws, cache_modifier=".cg")
            if G > 1:
                acc1 += tl.load(ws + BM * BS, cache_modifier=".cg")
            if G > 2:
                acc2 += tl.load(ws + 2 * BM * BS, cache_modifier=".cg")
                acc3 += tl.load(ws + 3 * BM * BS, cache_modifier=".cg")
        _put(Y, OUTS, grp, 0, acc0, i_m, N, stride_yn, stride_yf, BM, BS, G)
        if G > 1:
            _put(Y, OUTS, grp, 1, acc1, i_m, N, stride_yn, stride_yf, BM, BS, G)
        if G > 2:
            _put(Y, OUTS, grp, 2, acc2, i_m, N, stride_yn, stride_yf, BM, BS, G)
            _put(Y, OUTS, grp, 3, acc3, i_m, N, stride_yn, stride_yf, BM, BS, G)
        tl.atomic_xchg(CNT + item, 0)


# table sizes change with every layout and token count: one compiled kernel serves them all
@triton.jit(do_not_specialize=["N", "num_entries", "num_groups", "num_units", "num_programs"])
def xprop_stream_kernel(
    x_desc, w_desc, Y, WS, CNT, STEPS, CUTS, OUTS, OFFSETS,
    N, stride_yn, stride_yf, num_entries, num_groups, num_units, num_programs,
    BS: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    X_T: tl.constexpr, TRANS_W: tl.constexpr, SKIP: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    KS: tl.constexpr = BS // BK
    ROW: tl.constexpr = 4 + G
    i_p = tl.program_id(0)
    if SPLIT:
        lo = _unit_start(i_p, num_units, num_programs)
        hi = _unit_start(i_p + 1, num_units, num_programs)
    else:
        lo = tl.load(CUTS + i_p) * KS
        hi = tl.load(CUTS + i_p + 1) * KS
    pend0 = i_p * 0 - 1      # split items this program wrote a partial of (at most two)
    pend1 = i_p * 0 - 1

    acc0 = tl.zeros((BM, BS), dtype=tl.float32)
    if G > 1:
        acc1 = tl.zeros((BM, BS), dtype=tl.float32)
    if G > 2:
        acc2 = tl.zeros((BM, BS), dtype=tl.float32)
        acc3 = tl.zeros((BM, BS), dtype=tl.float32)
    # one flat loop (no nested loop: Triton pipelines innermost loops only)
    for t in tl.range(lo, hi, num_stages=NUM_STAGES):
        # the step's row holds the table entry itself: one level of loads before the tiles' (each
        # level of indirection divides the pipeline depth Triton gives the tile loads)
        row = STEPS + (t // KS) * ROW
        h = t % KS
        i_m = tl.load(row)
        b_x = _x_tile(x_desc, i_m, tl.load(row + 1) * BS + h * BK, BM, X_T)
        acc0 = _lane_dot(acc0, b_x, w_desc, tl.load(row + 4), h, BS, BK, TRANS_W, SKIP, PRECISION)
        if G > 1:
            acc1 = _lane_dot(acc1, b_x, w_desc, tl.load(row + 5), h, BS, BK, TRANS_W, SKIP, PRECISION)
        if G > 2:
            acc2 = _lane_dot(acc2, b_x, w_desc, tl.load(row + 6), h, BS, BK, TRANS_W, SKIP, PRECISION)
            acc3 = _lane_dot(acc3, b_x, w_desc, tl.load(row + 7), h, BS, BK, TRANS_W, SKIP, PRECISION)

        if ((h == KS - 1) & (tl.load(row + 3) != 0)) | (t == hi - 1):
            grp = tl.load(row + 2)
            whole = True
            if SPLIT:
                a = (i_m * num_entries + tl.load(OFFSETS + grp)) * KS
                b = (i_m * num_entries + tl.load(OFFSETS + grp + 1)) * KS
                whole = (a >= lo) & (b <= hi)
                if not whole:
                    ws = WS + (i_p * 2 + (a > lo).to(tl.int32)).to(tl.int64) * (G * BM * BS) \
                        + _tile_offsets(BM, BS)
                    tl.store(ws, acc0)
                    if G > 1:
                        tl.store(ws + BM * BS, acc1)
                    if G > 2:
                        tl.store(ws + 2 * BM * BS, acc2)
                        tl.store(ws + 3 * BM * BS, acc3)
                    # its ticket is taken after the loop: a barrier in the loop stops Triton
                    # from pipelining it
                    if pend0 < 0:
                        pend0 = i_m * num_groups + grp
                    else:
                        pend1 = i_m * num_groups + grp
            if whole:
                _put(Y, OUTS, grp, 0, acc0, i_m, N, stride_yn, stride_yf, BM, BS, G)
                if G > 1:
                    _put(Y, OUTS, grp, 1, acc1, i_m, N, stride_yn, stride_yf, BM, BS, G)
                if G > 2:
                    _put(Y, OUTS, grp, 2, acc2, i_m, N, stride_yn, stride_yf, BM, BS, G)
                    _put(Y, OUTS, grp, 3, acc3, i_m, N, stride_yn, stride_yf, BM, BS, G)
            acc0 = tl.zeros((BM, BS), dtype=tl.float32)
            if G > 1:
                acc1 = tl.zeros((BM, BS), dtype=tl.float32)
            if G > 2:
                acc2 = tl.zeros((BM, BS), dtype=tl.float32)
                acc3 = tl.zeros((BM, BS), dtype=tl.float32)

    if SPLIT:
        tl.debug_barrier()   # every thread's partials are written before a ticket is taken
        if pend0 >= 0:
            _settle(pend0, Y, WS, CNT, OUTS, OFFSETS, N, stride_yn, stride_yf, num_entries, num_groups,
                    num_units, num_programs, BS, G, BM, KS)
        if pend1 >= 0:
            _settle(pend1, Y, WS, CNT, OUTS, OFFSETS, N, stride_yn, stride_yf, num_entries, num_groups,
                    num_units, num_programs, BS, G, BM, KS)


# ----------------------------------------------------------------------------- launcher

def plan_stream(layout, kind, n_tokens, cfg: StreamConfig, sms):
    """The :class:`StreamPlan` of ``kind`` (``"fprop"`` / ``"bprop"``) for ``n_tokens`` tokens on a
    GPU with ``sms`` multiprocessors.  Numpy only; build once per (layout, tokens, config)."""
    if kind not in ("fprop", "bprop"):
        raise ValueError(f"kind must be 'fprop' or 'bprop'; got {kind!r}")
    if cfg.GROUPING not in ("overlap", "adjacent"):
        raise ValueError(f"GROUPING must be 'overlap' or 'adjacent'; got {cfg.GROUPING!r}")
    if cfg.SPLIT and cfg.PER_SM < 1:
        raise ValueError(f"a stream-K split needs PER_SM >= 1; got {cfg.PER_SM}")
    mask = layout.mask if kind == "fprop" else layout.mask.T
    groups = (overlap_groups(mask, cfg.G) if cfg.GROUPING == "overlap"
              else adjacent_groups(mask.shape[1], cfg.G))
    table = stream_table(layout, kind, groups)
    bs = layout.block_size
    sub_steps = bs // (cfg.BK or bs)
    tiles = max(1, math.ceil(n_tokens / cfg.BM))
    if cfg.SPLIT:
        steps, cuts = split_schedule(table, tiles), None
        programs = min(cfg.PER_SM * sms, steps.size * sub_steps)
    else:
        items = tiles * table.num_groups
        programs = items if cfg.PER_SM == 0 else min(items, cfg.PER_SM * sms)
        steps, cuts = aligned_schedule(table, tiles, programs)
    if steps.size * sub_steps >= 2**31:
        raise ValueError(f"{steps.size * sub_steps} sub-steps do not fit int32; use fewer tokens per call")
    rows = np.concatenate([(steps // table.num_entries)[:, None], table.entries[steps % table.num_entries]], axis=1)
    return StreamPlan(table, steps, np.ascontiguousarray(rows, dtype=np.int32), cuts, int(programs), tiles,
                      sub_steps)


def device_plan(plan: StreamPlan, device):
    """The plan's tables as int32 tensors on ``device`` (a dict), with the stream-K ticket counters
    zeroed; keep it with the plan: the kernel leaves the counters at zero after every call."""
    import torch

    def put(a):
        return torch.tensor(np.asarray(a, dtype=np.int32), device=device)

    t = plan.table
    cuts = plan.cuts if plan.cuts is not None else np.zeros(1, dtype=np.int32)
    return dict(steps=put(plan.rows), cuts=put(cuts), outs=put(t.outs),
                offsets=put(t.offsets),
                counters=torch.zeros(max(1, plan.token_tiles * t.num_groups), dtype=torch.int32, device=device))


def xprop_stream(x, w, plan: StreamPlan, tables, *, out_features, bs, axis, trans, cfg: StreamConfig,
                 precision="ieee"):
    """fprop (``trans=False``: ``y = x @ W``) or bprop (``trans=True``: ``dx = dy @ W.T``) through
    :func:`xprop_stream_kernel`.

    ``x``: activations, ``(N, F)`` for ``axis=1`` or ``(F, N)`` for ``axis=0``, row-major with
    16-byte aligned rows; ``w``: packed weight ``(blocks, bs, bs)``; ``plan`` / ``tables``: from
    :func:`plan_stream` / :func:`device_plan` for the same kind, tokens and ``cfg``.
    Returns the output in ``x``'s dtype and layout.
    """
    import torch

    n = x.shape[0] if axis == 1 else x.shape[1]
    if max(1, math.ceil(n / cfg.BM)) != plan.token_tiles:
        raise ValueError(f"plan was built for {plan.token_tiles} token tiles of {cfg.BM}; got {n} tokens")
    y = x.new_empty((n, out_features) if axis == 1 else (out_features, n))
    if n == 0:
        return y
    bk = cfg.BK or bs
    t = plan.table
    ws = (x.new_empty((2 * plan.programs, cfg.G, cfg.BM, bs), dtype=torch.float32) if cfg.SPLIT
          else x.new_empty(1, dtype=torch.float32))
    x_block = [cfg.BM, bk] if axis == 1 else [bk, cfg.BM]
    stride_yn, stride_yf = (y.stride(0), y.stride(1)) if axis == 1 else (y.stride(1), y.stride(0))
    xprop_stream_kernel[(plan.programs,)](
        TensorDescriptor(x, list(x.shape), list(x.stride()), x_block),
        TensorDescriptor(w, [w.shape[0] * bs, bs], [bs, 1], [bs, bk] if trans else [bk, bs]),
        y, ws, tables["counters"], tables["steps"], tables["cuts"], tables["outs"],
        tables["offsets"],
        n, stride_yn, stride_yf, t.num_entries, t.num_groups, plan.steps.size * plan.sub_steps, plan.programs,
        BS=bs, G=cfg.G, BM=cfg.BM, BK=bk, X_T=axis == 0, TRANS_W=trans, SKIP=cfg.SKIP, SPLIT=cfg.SPLIT,
        PRECISION=precision, NUM_STAGES=cfg.num_stages,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
