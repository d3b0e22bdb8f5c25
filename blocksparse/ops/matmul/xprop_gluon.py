"""fprop and bprop as persistent programs pipelined across their output tiles, written in Gluon:
Hopper, 16-bit, ``(N, C)`` activations.

Triton's pipeliner restarts at every output tile: a program fills its buffers, runs the tile's
steps, drains them and stores the tile, and only then starts loading the next one.  Where a
column holds few blocks (short reductions: the pixelfly layers, low densities) the fill and the
store weigh against few steps.  Here each program walks the output tiles ``pid, pid + P, ...``
with two cursors over one ring of ``NB`` shared-memory stages: the loads run ``NB - 1`` steps
ahead of the matrix products *across tile boundaries* (the next tile's first tiles arrive while
this one's last products run), and a tile's store leaves through the copy engine (TMA) while the
next tile's products run (the store is awaited only before the output buffer is reused).

Tables: :meth:`blocksparse.layout.Layout.fprop` / ``bprop`` with ``group=1`` (headers ``(group,
start, count, -)``, entries ``(input block row, weight block)``).  Tiles are ``(segment, output
slice, token tile)``, segments fastest, so that programs running together share a token tile.
Only segments with entries are walked (:func:`split_empty`; the launcher fills the others).
Descriptors (built by :func:`xprop_gluon`): ``x_desc`` over the input ``(N, F)``, block ``[BM,
BK]``; ``w_desc`` over the weight viewed as ``(blocks * BS // PACK, PACK * BS)`` (:mod:`.packing`),
block ``[BK, BN]`` (``[BN, BK]`` with ``TRANS_W``, read through a transposed view); ``y_desc`` over
the output, block ``[BM, BN]``.  Triton's interpreter does not run Gluon: the tests run this source
on the CPU through :mod:`blocksparse.testing.gluon`.
"""
from dataclasses import dataclass

import numpy as np
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)


@dataclass(frozen=True)
class GluonTile:
    """An output tile ``[BM, BN]`` taking ``BK`` features a step through ``NB`` stages."""
    BM: int = 128
    BN: int = 128
    BK: int = 64
    NB: int = 4
    num_warps: int = 4
    PER_SM: int = 1  # persistent programs a SM


@gluon.constexpr_function
def mma_layout(BM, BN, num_warps):
    """The wgmma accumulator layout of a ``[BM, BN]`` tile: warps stacked along the tokens while
    each keeps at least 16 rows, then side by side along the features."""
    warps_m, warps_n = 4, 1
    while warps_m * warps_n < num_warps:
        if BM > 16 * warps_m:
            warps_m *= 2
        else:
            warps_n *= 2
    n = BN // warps_n
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps_m, warps_n], instr_shape=[16, min(n, 256), 16])


@gluon.jit
def _tile(tile, HEADERS, num_segments, num_tiles, NS: gl.constexpr, BS: gl.constexpr, BN: gl.constexpr,
          KS: gl.constexpr):
    """(steps, first entry, token tile, first output feature) of ``tile`` (nothing read past the last)."""
    i_s = tile % num_segments
    i_n = (tile // num_segments) % NS
    i_m = tile // (num_segments * NS)
    valid = tile < num_tiles
    header = HEADERS + i_s * 4
    group = gl.load(header, mask=valid, other=0)
    start = gl.load(header + 1, mask=valid, other=0)
    count = gl.load(header + 2, mask=valid, other=0)
    return count * KS, start, i_m, group * BS + i_n * BN


@gluon.jit
def _entry(ENTRIES, start, t, valid, KS: gl.constexpr):
    """(input block row, weight block) of step ``t`` of a tile whose entries begin at ``start``."""
    e = ENTRIES + (start + t // KS) * 2
    return gl.load(e, mask=valid, other=0), gl.load(e + 1, mask=valid, other=0)


@gluon.jit
def _issue(x_desc, w_desc, bars, a_bufs, b_bufs, slot, row, blk, t, i_m, f0, pred, BS: gl.constexpr,
           BK: gl.constexpr, KS: gl.constexpr, TRANS_W: gl.constexpr, NB: gl.constexpr, PACK: gl.constexpr):
    """Start step ``t`` of a tile (entry ``(row, blk)``) into stage ``slot % NB``."""
    BM: gl.constexpr = x_desc.block_type.shape[0]
    h = t % KS
    i = slot % NB
    bar = bars.index(i)
    mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(x_desc, [i_m * BM, row * BS + h * BK], bar, a_bufs.index(i), pred)
    o = f0 % BS  # the output slice's offset inside its block
    w_row = (blk // PACK) * BS  # the block's origin in the weight's 2-D view (.packing)
    w_col = (blk % PACK) * BS
    if TRANS_W:
        tma.async_copy_global_to_shared(w_desc, [w_row + o, w_col + h * BK], bar, b_bufs.index(i), pred)
    else:
        tma.async_copy_global_to_shared(w_desc, [w_row + h * BK, w_col + o], bar, b_bufs.index(i), pred)


@gluon.jit
def _produce(x_desc, w_desc, bars, a_bufs, b_bufs, produced, cursor, HEADERS, ENTRIES, num_segments, num_tiles, P,
             BS: gl.constexpr, BK: gl.constexpr, BN: gl.constexpr, KS: gl.constexpr, NS: gl.constexpr,
             TRANS_W: gl.constexpr, NB: gl.constexpr, PACK: gl.constexpr):
    """Start the producer's step into stage ``produced % NB`` and move its cursor one step on:
    ``(produced + 1, cursor)``.  The cursor: tile, step, the tile's (steps, first entry, token tile,
    first feature), the next tile's (read a tile ahead), the step's entry (read a step ahead) -- so
    no TMA load waits on a table load."""
    tile, t, steps, start, i_m, f0, q_steps, q_start, q_m, q_f, row, blk = cursor
    _issue(x_desc, w_desc, bars, a_bufs, b_bufs, produced, row, blk, t, i_m, f0, tile < num_tiles, BS, BK, KS,
           TRANS_W, NB, PACK)
    t += 1
    if t >= steps:
        t = 0
        tile += P
        steps, start, i_m, f0 = q_steps, q_start, q_m, q_f
        q_steps, q_start, q_m, q_f = _tile(tile + P, HEADERS, num_segments, num_tiles, NS, BS, BN, KS)
    row, blk = _entry(ENTRIES, start, t, tile < num_tiles, KS)
    return produced + 1, (tile, t, steps, start, i_m, f0, q_steps, q_start, q_m, q_f, row, blk)


@gluon.jit
def xprop_gluon_kernel(x_desc, w_desc, y_desc, HEADERS, ENTRIES, BIAS, num_segments, num_tiles, OUT_FEATURES,
                       BS: gl.constexpr, TRANS_W: gl.constexpr, HAS_BIAS: gl.constexpr, NB: gl.constexpr,
                       num_warps: gl.constexpr, PACK: gl.constexpr = 1):
    BM: gl.constexpr = y_desc.block_type.shape[0]
    BN: gl.constexpr = y_desc.block_type.shape[1]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    KS: gl.constexpr = BS // BK
    NS: gl.constexpr = BS // BN
    dtype: gl.constexpr = x_desc.dtype
    acc_layout: gl.constexpr = mma_layout(BM, BN, num_warps)

    a_bufs = gl.allocate_shared_memory(dtype, [NB] + x_desc.block_type.shape, x_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NB] + w_desc.block_type.shape, w_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, y_desc.block_type.shape, y_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NB):
        mbarrier.init(bars.index(s), count=1)
    fence_async_shared()  # the barriers' initialisation is seen by the TMA unit before its first arrival

    pid = gl.program_id(0)
    P = gl.num_programs(0)
    # the producer's cursor (every tile has steps: the launcher leaves out empty segments)
    steps, start, i_m, f0 = _tile(pid, HEADERS, num_segments, num_tiles, NS, BS, BN, KS)
    q_steps, q_start, q_m, q_f = _tile(pid + P, HEADERS, num_segments, num_tiles, NS, BS, BN, KS)
    row, blk = _entry(ENTRIES, start, 0, pid < num_tiles, KS)
    cursor = (pid, pid * 0, steps, start, i_m, f0, q_steps, q_start, q_m, q_f, row, blk)
    produced = 0
    for _ in gl.static_range(NB - 1):  # the ring's lead
        produced, cursor = _produce(x_desc, w_desc, bars, a_bufs, b_bufs, produced, cursor, HEADERS, ENTRIES,
                                    num_segments, num_tiles, P, BS, BK, BN, KS, NS, TRANS_W, NB, PACK)

    consumed = 0
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=acc_layout)
    # the consumer's next tile, read a tile ahead
    n_steps, n_start, n_m, n_f = _tile(pid, HEADERS, num_segments, num_tiles, NS, BS, BN, KS)
    for tile in range(pid, num_tiles, P):
        steps, i_m, f0 = n_steps, n_m, n_f
        n_steps, n_start, n_m, n_f = _tile(tile + P, HEADERS, num_segments, num_tiles, NS, BS, BN, KS)
        for t in range(steps):
            slot = consumed % NB
            mbarrier.wait(bars.index(slot), (consumed // NB) & 1)
            # the product before this one is done, so its stage (the ring's next) can be refilled
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            produced, cursor = _produce(x_desc, w_desc, bars, a_bufs, b_bufs, produced, cursor, HEADERS, ENTRIES,
                                        num_segments, num_tiles, P, BS, BK, BN, KS, NS, TRANS_W, NB, PACK)
            if TRANS_W:
                b = b_bufs.index(slot).permute((1, 0))
            else:
                b = b_bufs.index(slot)
            acc = warpgroup_mma(a_bufs.index(slot), b, acc, use_acc=t > 0, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))  # (no wait: the last product may run on)
            consumed += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        out = acc
        if HAS_BIAS:
            offs = f0 + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
            out += gl.load(BIAS + offs, mask=offs < OUT_FEATURES, other=0.0).to(gl.float32)[None, :]
        tma.store_wait(pendings=0)  # the last tile's store has left c_smem
        c_smem.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [i_m * BM, f0], c_smem)
    tma.store_wait(pendings=0)
    for s in gl.static_range(NB):
        mbarrier.invalidate(bars.index(s))


def split_empty(headers, bs):
    """``(headers of the segments with entries, output features of the empty ones or None)``: the
    kernel's programs walk only the first; the launcher fills the second (zeros or the bias)."""
    import torch

    full = headers[:, 2] > 0
    if bool(full.all()):
        return headers, None
    groups = headers[~full, 0].long()
    features = (groups[:, None] * bs + torch.arange(bs, device=headers.device)).reshape(-1)
    return headers[full].contiguous(), features


#: The tile by block size (to be measured: ``bench/tune_bsmm.py --gluon``).
TILES = {64: GluonTile(128, 64, 64, 6, 4), 128: GluonTile(128, 128, 64, 4, 4), 256: GluonTile(128, 256, 64, 3, 8)}


def xprop_gluon(x, w, headers, entries, *, out_features, bs, trans, tile=None, bias=None, pack=1, out=None,
                empty=None, programs=None, emulate=False):
    """``y = x @ W`` (``trans``: ``x @ W.T``) over a ``group=1`` table, ``x`` 16-bit ``(N, F)`` on a
    Hopper GPU; ``w``: the blocks in their storage (``pack``: :attr:`~blocksparse.layout.Layout.packing`);
    ``tile``: default :data:`TILES`; ``out``: the ``(N, out_features)`` output to write, else a new one.
    ``headers`` / ``empty``: as :func:`split_empty` gives them (segments with entries only).
    ``programs``: persistent programs (default ``tile.PER_SM`` a SM); ``emulate``: run the kernel's
    source on CPU tensors through :mod:`blocksparse.testing.gluon` (tests)."""
    import torch

    tile = tile or TILES[bs]
    BM, BN, BK, NB, num_warps = tile.BM, min(tile.BN, bs), min(tile.BK, bs), tile.NB, tile.num_warps
    n = x.shape[0]
    y = x.new_empty((n, out_features)) if out is None else out
    w2 = w.reshape(-1, pack * bs)
    blocks = dict(x=[BM, BK], w=[BN, BK] if trans else [BK, BN], y=[BM, BN])
    num_segments = headers.shape[0]
    num_tiles = num_segments * (bs // BN) * triton.cdiv(n, BM)
    if programs is None:
        programs = tile.PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count
    programs = max(1, min(programs, num_tiles))
    consts = dict(BS=bs, TRANS_W=trans, HAS_BIAS=bias is not None, NB=NB, num_warps=num_warps, PACK=pack)
    if num_tiles and emulate:
        from ...testing.gluon import Desc, Ptr, run_kernel

        descs = [Desc(t.float().numpy(), blocks[k]) for t, k in ((x, "x"), (w2, "w"), (y, "y"))]
        y_np = descs[2].array
        descs[2].rounding = lambda v: torch.from_numpy(np.ascontiguousarray(v)).to(y.dtype).float().numpy()
        run_kernel(xprop_gluon_kernel, programs, *descs, Ptr(headers.numpy()), Ptr(entries.numpy()),
                   Ptr((bias if bias is not None else x.new_zeros(1)).float().numpy()), num_segments, num_tiles,
                   out_features, **consts)
        y.copy_(torch.from_numpy(y_np))
    elif num_tiles:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
        x_desc, w_desc, y_desc = (TensorDescriptor.from_tensor(t, blocks[k], gl.NVMMASharedLayout.get_default_for(
            blocks[k], gdt)) for t, k in ((x, "x"), (w2, "w"), (y, "y")))
        xprop_gluon_kernel[(programs,)](x_desc, w_desc, y_desc, headers, entries, bias if bias is not None else x,
                                        num_segments, num_tiles, out_features, **consts)
    if empty is not None:
        y[:, empty] = bias[empty].to(y.dtype) if bias is not None else 0
    return y


def compile_for(tile, *, bs, trans, bias, dtype="bf16", arch=90, pack=1):
    """:func:`xprop_gluon_kernel` of ``tile`` compiled for ``sm_{arch}`` without a GPU (Triton's
    compiler; the interpreter must be off): the compiled kernel, for its resources and code."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    BN, BK = min(tile.BN, bs), min(tile.BK, bs)

    def desc(shape):
        return f"tensordesc<{dtype}[{shape[0]}, {shape[1]}],{gl.NVMMASharedLayout.get_default_for(shape, gdt)!r}>"

    signature = {"x_desc": desc([tile.BM, BK]), "w_desc": desc([BN, BK] if trans else [BK, BN]),
                 "y_desc": desc([tile.BM, BN]), "HEADERS": "*i32", "ENTRIES": "*i32", "BIAS": f"*{dtype}",
                 "num_segments": "i32", "num_tiles": "i32", "OUT_FEATURES": "i32", "BS": "constexpr",
                 "TRANS_W": "constexpr", "HAS_BIAS": "constexpr", "NB": "constexpr", "num_warps": "constexpr",
                 "PACK": "constexpr"}
    constexprs = {"BS": bs, "TRANS_W": trans, "HAS_BIAS": bias, "NB": tile.NB, "num_warps": tile.num_warps,
                  "PACK": pack}
    return triton.compile(GluonASTSource(xprop_gluon_kernel, signature, constexprs),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": tile.num_warps})
