"""fprop and bprop of regular layouts with persistent programs: Hopper and newer.

A layout whose output columns all hold the same number of blocks (butterfly / pixelfly, banded,
block-diagonal; rows alike for bprop) walks the same number of steps for every output tile.  Here
a fixed number of programs deal the output tiles round-robin (tile ``p, p + P, ...``) and walk each
tile's steps in one loop nest that Triton flattens (``FLATTEN``): the next tile's first loads are in
flight while a tile's sums are stored, so a short reduction no longer pays a pipeline fill and an
output store of its own -- the time that keeps :mod:`.xprop_tma`'s one-tile programs below cuBLAS
on short columns.

Tiles, table and descriptors as in :mod:`.xprop_tma` with ``G = 1`` and unsplit segments: segment
``s`` holds table entries ``s * count .. (s + 1) * count - 1`` (``count``: the blocks of every
column), so a tile's steps follow from its index alone.  ``BIAS`` / ``has_bias`` as there.
"""
import triton
import triton.language as tl

from .xprop_tma import _w_tile, _x_tile


@triton.jit
def _tile_coords(tile, num_segments, NS: tl.constexpr):
    """(segment, output slice, token tile) of output tile ``tile`` (segments vary fastest)."""
    return tile % num_segments, (tile // num_segments) % NS, tile // (num_segments * NS)


@triton.jit
def _store(y_desc, acc, m0, f0, X_T: tl.constexpr):
    if X_T:
        y_desc.store([f0, m0], acc.T.to(y_desc.dtype))
    else:
        y_desc.store([m0, f0], acc.to(y_desc.dtype))


@triton.jit
def xprop_persistent_kernel(
    x_desc, w_desc, y_desc, HEADERS, ENTRIES, num_segments, num_tiles, count, OUT_FEATURES, BIAS, has_bias,
    BS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, X_T: tl.constexpr,
    TRANS_W: tl.constexpr, PRECISION: tl.constexpr, PACK: tl.constexpr = 1, FLATTEN: tl.constexpr = True,
    PREFETCH: tl.constexpr = True, SUBTILE: tl.constexpr = False,
):
    NS: tl.constexpr = BS // BN
    KS: tl.constexpr = BS // BK
    programs = tl.num_programs(0)
    steps = count * KS
    # the epilogue's tile index runs apart from the loop's, so that the flattened loop's loads of
    # the next tile do not wait on the store of this one
    tile_c = tl.program_id(0) - programs
    for tile in tl.range(tl.program_id(0), num_tiles, programs, flatten=FLATTEN):
        i_s, i_n, i_m = _tile_coords(tile, num_segments, NS)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if PREFETCH:  # each step loads the next step's entry: its tile loads wait on no load of their own step
            n_row = tl.load(ENTRIES + i_s * count * 2)
            n_blk = tl.load(ENTRIES + i_s * count * 2 + 1)
            for k in tl.range(0, steps):
                row, blk = n_row, n_blk
                nxt = ENTRIES + (i_s * count + (k + 1) // KS) * 2
                n_row = tl.load(nxt, mask=k + 1 < steps, other=0)
                n_blk = tl.load(nxt + 1, mask=k + 1 < steps, other=0)
                b_x = _x_tile(x_desc, i_m, row * BS + (k % KS) * BK, BM, X_T)
                acc = tl.dot(b_x, _w_tile(w_desc, blk, k % KS, i_n, BS, BK, BN, TRANS_W, PACK), acc,
                             input_precision=PRECISION)
        else:
            for k in tl.range(0, steps):
                entry = ENTRIES + (i_s * count + k // KS) * 2
                b_x = _x_tile(x_desc, i_m, tl.load(entry) * BS + (k % KS) * BK, BM, X_T)
                acc = tl.dot(b_x, _w_tile(w_desc, tl.load(entry + 1), k % KS, i_n, BS, BK, BN, TRANS_W, PACK), acc,
                             input_precision=PRECISION)
        tile_c += programs
        c_s, c_n, c_m = _tile_coords(tile_c, num_segments, NS)
        f0 = tl.load(HEADERS + c_s * 4) * BS + c_n * BN
        if has_bias:
            o_f = f0 + tl.arange(0, BN)
            acc += tl.load(BIAS + o_f, mask=o_f < OUT_FEATURES, other=0.0).to(tl.float32)[None, :]
        if SUBTILE:  # two stores of [BM, BN / 2]: half the epilogue's shared memory, for a deeper pipeline
            acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
            _store(y_desc, acc0, c_m * BM, f0, X_T)
            _store(y_desc, acc1, c_m * BM, f0 + BN // 2, X_T)
        else:
            _store(y_desc, acc, c_m * BM, f0, X_T)
