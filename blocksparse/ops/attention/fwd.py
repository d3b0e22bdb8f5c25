"""Fused block-sparse attention, forward: ``o = softmax(scale * q k^T + mask) v`` and its log-sum-exp.

FlashAttention-2's online softmax over the key blocks a query block attends to, and nothing else:
a program owns ``BM`` query rows of one (batch, query head) and walks the row list of their query
block (:mod:`.blocklist`): first the full blocks (no masking work at all), then the partial ones
(causal diagonal, element masks), ``BN`` keys per step.  ``PREFETCH``: the full blocks' walk reads
each table entry one step ahead (:func:`.tiles.entry_ahead`).  Grouped-query attention: query head ``h``
reads key/value head ``h // GROUP``.  Ragged batches (``HAS_SEQLENS``): keys at or past the batch
element's length are masked in every tile; rows past it are written as zeros.

Scores are kept in base 2 (``qk_scale = scale * log2(e)``, ``exp2``).  ``LSE`` holds the row's
log-sum-exp in those units, ``-inf`` for a row that attends to nothing (its output is zeros).
Programs: ``(query tiles in block order, B * HQ)``; query tiles vary fastest, so programs running
together share their heads' keys and values in L2.
"""
import triton
import triton.language as tl

from .tiles import block_list, entry_ahead, kv_step, kv_tiles, load_rows, program_ids, row_tile, store_rows


@triton.jit
def _attend(acc, l_i, m_i, b_q, b_k, b_v, qk_scale, keep, MASKED: tl.constexpr):
    """One online-softmax step over a [BN, D] tile of keys and values."""
    # scaled before the row max, so that any sign of the scale is right
    b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale         # [BM, D] @ [D, BN] -> [BM, BN]
    if MASKED:
        b_s = tl.where(keep, b_s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(b_s, 1))
    m_use = m_new
    if MASKED:
        # a row with nothing attended so far keeps m = -inf; subtract 0 there so p = exp2(-inf) = 0
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    b_p = tl.math.exp2(b_s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(b_p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(b_p.to(b_v.dtype), b_v, acc)          # [BM, BN] @ [BN, D] -> [BM, D]
    return acc, l_i, m_new


@triton.jit
def attn_fwd_kernel(
    Q, K, V, O, LSE, SEQLENS, HEADERS, ENTRIES, ORDER, MASKS,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
    S, HQ, HL, NB, GROUP, qk_scale,
    BS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr, TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, PREFETCH: tl.constexpr = False, HEADS_FIRST: tl.constexpr = False,
):
    KS: tl.constexpr = BS // BN    # key steps per block
    i_t, i_bh = program_ids(HEADS_FIRST)
    i_b, i_hq, i_hk, i_hl, q_blk, q0 = row_tile(ORDER, i_t, i_bh, HQ, HL, GROUP, BS, BM)
    o_m = q0 + tl.arange(0, BM)
    start, n_full, n_part, seqlen = block_list(HEADERS, SEQLENS, i_b, i_hl, q_blk, NB, q0, S, HAS_SEQLENS)

    b_q = load_rows(Q, i_b, i_hq, q0, stride_qb, stride_qh, stride_qs, BM, D, TMA)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)

    # full blocks (masked only by a ragged batch's length), then partial ones (causal diagonal,
    # element masks)
    kv = (K, V, ENTRIES, MASKS)
    strides = (stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs)
    if PREFETCH:  # the full blocks' walk one step ahead (tiles.entry_ahead)
        lo, hi = start * KS, (start + n_full) * KS
        n_blk, n_k0, _ = entry_ahead(ENTRIES, lo, hi, KS, BS, BN)
        for t in tl.range(lo, hi, warp_specialize=WARP_SPECIALIZE):
            k_blk, k0 = n_blk, n_k0
            n_blk, n_k0, _ = entry_ahead(ENTRIES, t + 1, hi, KS, BS, BN)
            b_k, b_v, keep = kv_tiles(K, V, MASKS, k_blk, k0, -1, i_b, i_hk, o_m, q_blk, seqlen, *strides,
                                      BS, BN, D, TMA, False, CAUSAL, HAS_SEQLENS, HAS_MASKS)
            acc, l_i, m_i = _attend(acc, l_i, m_i, b_q, b_k, b_v, qk_scale, keep, HAS_SEQLENS)
    else:
        for t in tl.range(start * KS, (start + n_full) * KS, warp_specialize=WARP_SPECIALIZE):
            b_k, b_v, keep = kv_step(*kv, t, i_b, i_hk, o_m, q_blk, seqlen, *strides,
                                     BS, BN, D, TMA, False, CAUSAL, HAS_SEQLENS, HAS_MASKS)
            acc, l_i, m_i = _attend(acc, l_i, m_i, b_q, b_k, b_v, qk_scale, keep, HAS_SEQLENS)
    for t in tl.range((start + n_full) * KS, (start + n_full + n_part) * KS):
        b_k, b_v, keep = kv_step(*kv, t, i_b, i_hk, o_m, q_blk, seqlen, *strides,
                                 BS, BN, D, TMA, True, CAUSAL, HAS_SEQLENS, HAS_MASKS)
        acc, l_i, m_i = _attend(acc, l_i, m_i, b_q, b_k, b_v, qk_scale, keep, True)

    if HAS_SEQLENS:  # rows past the length: zeros (their keys before the length were attended)
        l_i = tl.where(o_m < seqlen, l_i, 0.0)
    empty = l_i == 0.0
    acc = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
    lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    store_rows(O, acc, i_b, i_hq, q0, stride_ob, stride_oh, stride_os, BM, D, TMA)
    tl.store(LSE + i_bh.to(tl.int64) * S + o_m, lse)
