"""Pieces the fused attention kernels share: row-tile loads and stores, and the keep mask of a
partial tile.

Tensors are ``(B, H, S, D)`` with unit stride along ``D``.  With ``TMA`` the kernels get 4-D tensor
descriptors (block ``[1, 1, ROWS, D]``) in place of the pointers; without, pointers and the three
outer strides.  Tiles never cross the sequence end (``S`` is a multiple of every tile), so no
load is masked.
"""
import triton
import triton.language as tl


@triton.jit
def load_rows(X, i_b, i_h, row, stride_b, stride_h, stride_s,
              ROWS: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """Rows ``row .. row + ROWS - 1`` of head ``i_h`` of batch ``i_b``: [ROWS, D]."""
    if TMA:
        b_x = X.load([i_b, i_h, row, 0]).reshape(ROWS, D)
    else:
        o_r = row + tl.arange(0, ROWS)
        o_d = tl.arange(0, D)
        p_x = (X + i_b.to(tl.int64) * stride_b + i_h.to(tl.int64) * stride_h
               + o_r[:, None].to(tl.int64) * stride_s + o_d[None, :])
        b_x = tl.load(p_x)
    return b_x


@triton.jit
def store_rows(X, b_x, i_b, i_h, row, stride_b, stride_h, stride_s,
               ROWS: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """Write the [ROWS, D] tile ``b_x`` at rows ``row ..``, cast to X's dtype."""
    if TMA:
        X.store([i_b, i_h, row, 0], b_x.to(X.dtype).reshape(1, 1, ROWS, D))
    else:
        o_r = row + tl.arange(0, ROWS)
        o_d = tl.arange(0, D)
        p_x = (X + i_b.to(tl.int64) * stride_b + i_h.to(tl.int64) * stride_h
               + o_r[:, None].to(tl.int64) * stride_s + o_d[None, :])
        tl.store(p_x, b_x.to(X.dtype.element_ty))


@triton.jit
def keep_mask(o_q, o_k, seqlen, q_blk, k_blk, mask_id, MASKS,
              BS: tl.constexpr, CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr):
    """Which (query, key) pairs of a partial tile are attended.

    ``o_q`` / ``o_k`` are the tile's query and key positions shaped to broadcast against each other
    (``[BM, 1]`` and ``[1, BN]``, or transposed for a key-major tile); the result has their
    broadcast shape.  ``mask_id``: the entry's row of the element-mask table ``MASKS`` (``uint8``,
    ``(P, BS, BS)``, ``[query, key]`` within the block), or -1.
    """
    keep = (o_q >= 0) & (o_k >= 0)
    if CAUSAL:
        keep = keep & (o_q >= o_k)
    if HAS_SEQLENS:
        keep = keep & (o_k < seqlen)
    if HAS_MASKS:
        p_m = (MASKS + tl.maximum(mask_id, 0).to(tl.int64) * (BS * BS)
               + (o_q - q_blk * BS) * BS + (o_k - k_blk * BS))
        keep = keep & (tl.load(p_m, mask=keep & (mask_id >= 0), other=1) != 0)
    return keep


@triton.jit
def program_ids(HEADS_FIRST: tl.constexpr):
    """``(tile, batch x head)`` of this program.  The grid is ``(tiles, heads)``, or with
    ``HEADS_FIRST`` ``(heads, tiles)``: programs start in launch order, so then every head's
    heaviest tile (the block lists' ``order``) starts before any head's lighter ones, and the last
    wave holds the lightest tiles of all heads (with ``(tiles, heads)`` it holds the last heads'
    tiles, heavy ones among them)."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    if HEADS_FIRST:
        i_t = tl.program_id(1)
        i_bh = tl.program_id(0)
    return i_t, i_bh


@triton.jit
def split_program(pid, tiles, heads, HEADS_FIRST: tl.constexpr):
    """``(tile, head)`` of program ``pid`` of a one-dimensional grid of ``tiles x heads`` programs,
    ordered as :func:`program_ids`'s two-dimensional grids: heads fastest with ``HEADS_FIRST``."""
    if HEADS_FIRST:
        i_t = pid // heads
        i_h = pid % heads
    else:
        i_t = pid % tiles
        i_h = pid // tiles
    return i_t, i_h


@triton.jit
def row_tile(ORDER, i_t, i_bh, HQ, HL, GROUP, BS: tl.constexpr, BM: tl.constexpr):
    """Program ``(i_t, i_bh)`` of a row-list kernel: batch, query head, key/value head, layout head,
    query block and first query row of its ``BM`` rows."""
    i_hq = i_bh % HQ
    q_blk = tl.load(ORDER + i_t // (BS // BM))
    return i_bh // HQ, i_hq, i_hq // GROUP, i_hq % HL, q_blk, q_blk * BS + (i_t % (BS // BM)) * BM


@triton.jit
def block_list(HEADERS, SEQLENS, i_b, i_hl, blk, NB, first, S, HAS_SEQLENS: tl.constexpr):
    """``(start, n_full, n_partial, seqlen)``: block ``blk``'s list in layout head ``i_hl`` and the
    batch element's length.  A tile starting (``first``) at or past the length gets an empty list."""
    p_h = HEADERS + (i_hl * NB + blk) * 3
    start = tl.load(p_h)
    n_full = tl.load(p_h + 1)
    n_part = tl.load(p_h + 2)
    seqlen = S
    if HAS_SEQLENS:
        seqlen = tl.load(SEQLENS + i_b)
        n_full = tl.where(first < seqlen, n_full, 0)
        n_part = tl.where(first < seqlen, n_part, 0)
    return start, n_full, n_part, seqlen


@triton.jit
def list_entry(ENTRIES, t, STEPS: tl.constexpr, BS: tl.constexpr, TILE: tl.constexpr):
    """Step ``t`` of a list walk (``STEPS`` tiles of ``TILE`` per block): ``(block, first position of
    the tile, element-mask row)``."""
    p_e = ENTRIES + (t // STEPS) * 2
    blk = tl.load(p_e)
    return blk, blk * BS + (t % STEPS) * TILE, tl.load(p_e + 1)


@triton.jit
def entry_ahead(ENTRIES, t, hi, STEPS: tl.constexpr, BS: tl.constexpr, TILE: tl.constexpr):
    """:func:`list_entry` of step ``t`` of a walk that ends before ``hi``, read one step ahead of its
    use (``PREFETCH``: the step's tile loads then wait on no table load of their own step, so
    Triton's pipeliner gives them ``num_stages - 1`` steps of lead instead of fewer); past the
    end nothing is read ``(0, 0, -1)``."""
    p_e = ENTRIES + (t // STEPS) * 2
    blk = tl.load(p_e, mask=t < hi, other=0)
    return blk, blk * BS + (t % STEPS) * TILE, tl.load(p_e + 1, mask=t < hi, other=-1)


@triton.jit
def kv_step(K, V, ENTRIES, MASKS, t, i_b, i_hk, o_m, q_blk, seqlen,
            stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
            BS: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr, PARTIAL: tl.constexpr,
            CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr):
    """Step ``t`` of a row-list walk for query rows ``o_m``: the key and value tiles [BN, D] and the
    keep mask ([BM, BN] on partial blocks; on full ones [1, BN], a ragged batch's length only)."""
    k_blk, k0, mask_id = list_entry(ENTRIES, t, BS // BN, BS, BN)
    return kv_tiles(K, V, MASKS, k_blk, k0, mask_id, i_b, i_hk, o_m, q_blk, seqlen,
                    stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                    BS, BN, D, TMA, PARTIAL, CAUSAL, HAS_SEQLENS, HAS_MASKS)


@triton.jit
def kv_tiles(K, V, MASKS, k_blk, k0, mask_id, i_b, i_hk, o_m, q_blk, seqlen,
             stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
             BS: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr, PARTIAL: tl.constexpr,
             CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr):
    """:func:`kv_step` for the table entry ``(k_blk, k0, mask_id)`` already read."""
    o_n = k0 + tl.arange(0, BN)
    if PARTIAL:
        keep = keep_mask(o_m[:, None], o_n[None, :], seqlen, q_blk, k_blk, mask_id, MASKS,
                         BS, CAUSAL, HAS_SEQLENS, HAS_MASKS)
    else:
        keep = o_n[None, :] < seqlen
    b_k = load_rows(K, i_b, i_hk, k0, stride_kb, stride_kh, stride_ks, BN, D, TMA)
    b_v = load_rows(V, i_b, i_hk, k0, stride_vb, stride_vh, stride_vs, BN, D, TMA)
    if HAS_SEQLENS:
        b_k, b_v = past_zeroed(b_k, o_n, seqlen), past_zeroed(b_v, o_n, seqlen)
    return b_k, b_v, keep


@triton.jit
def past_zeroed(b_x, o_r, seqlen):
    """Tile ``b_x`` with its rows at positions ``o_r`` past ``seqlen`` zeroed: a ragged batch's padding
    may hold NaN or inf (an uninitialised buffer), which a zero probability times would still spread."""
    return tl.where((o_r < seqlen)[:, None], b_x, 0.0).to(b_x.dtype)
