"""Fused block-sparse attention, backward.

With ``P = exp2(qk_scale * q k^T - lse)`` recomputed from the forward's log-sum-exp,
``delta = rowsum(o * do)``, ``dS = P * (do v^T - delta)``:

``attn_bwd_kernel`` runs two kinds of program:

* dq programs, per query tile (row lists, like the forward): ``dq = scale * dS k``, and, when they
  run first, ``delta`` for the dk/dv programs (where ``o`` and ``do`` tiles are loaded anyway: no
  separate pass over them);
* dk/dv programs, per key tile of a key/value head (column lists): ``dv = P^T do`` and
  ``dk = scale * dS^T q``, summed over the query heads of its group (GQA) in registers, each head
  walking its own layout's column list.

Three ways to run them: a dq launch, then a dk/dv launch (seven products per tile pair, no
atomics: ``S`` and ``dP`` are recomputed in both); ``attn_bwd_delta_kernel``, then both kinds in
one launch, dk/dv programs first (``BwdConfig.fused``: the same products, and the last wave of the
one runs beside the other's instead of alone); or (``BwdConfig.atomic_dq``) the delta kernel, then
a dk/dv launch with ``ATOMIC_DQ``, which also adds each tile pair's ``dS k`` into a float32 ``dq``
(five products, and atomic traffic: with ``TMA`` one bulk reduce-add of the tile through a
descriptor, else element atomics); or (``BwdConfig.store_ds``) the delta kernel, a dk/dv launch
with ``STORE_DS`` that also writes each tile pair's ``dS`` (16-bit, ``[key, query]`` within the
block) into a scratch buffer of one ``BS x BS`` tile per attended block, then a dq launch that only
sums ``dS k`` over the row lists (five products and no atomics: the scratch is read back once; the
row lists' ``ROW_PAIRS`` give each row entry's place among the column entries, which index the
scratch).  The tile-config sweep measures them.

All walk full blocks without masking work, then partial ones; with ``PREFETCH`` the full blocks'
walk reads each table entry one step ahead (:func:`.tiles.entry_ahead`).  A row that attends to nothing
(``lse = -inf``: empty, fully masked, or past a ragged batch's length) is read as ``lse = +inf``:
``P = 0`` there, so it adds nothing and its ``dq`` is zero, never NaN.
"""
import triton
import triton.language as tl

from .tiles import (block_list, entry_ahead, keep_mask, kv_step, kv_tiles, list_entry, load_rows, past_zeroed,
                    row_tile, split_program, store_rows)


@triton.jit
def _load_lse(LSE, i_bh, o_m, S):
    """Log-sum-exp of query rows ``o_m``, ``-inf`` (nothing attended) read as ``+inf``: [BM]."""
    lse = tl.load(LSE + i_bh.to(tl.int64) * S + o_m)
    return tl.where(lse == float("-inf"), float("inf"), lse)


@triton.jit
def ds_tiles(DS, HEADERS, i_bh, BH0, i_hl, NB, E_SPAN, BS: tl.constexpr):
    """Where the ``dS`` scratch of query head ``i_bh`` (batch x head) sits, less its layout head's
    first column entry: adding ``entry * BS * BS`` gives that entry's ``[BS, BS]`` tile (keys by
    queries).  The scratch holds the heads from ``BH0`` on, ``E_SPAN`` tiles each (the most column
    entries of one layout head); ``HEADERS``: the column lists' headers."""
    first = tl.load(HEADERS + i_hl * NB * 3)
    return DS + ((i_bh - BH0).to(tl.int64) * E_SPAN - first) * (BS * BS)


@triton.jit
def ds_at(ds_keys, t, STEPS: tl.constexpr, BS: tl.constexpr, TILE: tl.constexpr):
    """Step ``t`` of a column walk (``STEPS`` tiles of ``TILE`` queries per block): where its ``dS``
    tile starts, ``ds_keys`` pointing at the program's first key row of entry 0."""
    return ds_keys + (t // STEPS) * tl.full([], BS * BS, tl.int64) + (t % STEPS) * TILE


@triton.jit
def _delta_rows(O, DO, DELTA, i_b, i_hq, i_bh, q0, S, stride_ob, stride_oh, stride_os,
                stride_dob, stride_doh, stride_dos, BM: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """Write ``delta = rowsum(o * do)`` of rows ``q0 .. q0 + BM - 1``; return the do tile and delta."""
    b_do = load_rows(DO, i_b, i_hq, q0, stride_dob, stride_doh, stride_dos, BM, D, TMA)
    b_o = load_rows(O, i_b, i_hq, q0, stride_ob, stride_oh, stride_os, BM, D, TMA)
    delta = tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), 1)
    tl.store(DELTA + i_bh.to(tl.int64) * S + q0 + tl.arange(0, BM), delta)
    return b_do, delta


@triton.jit
def attn_bwd_delta_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos,
                          S, HQ, BM: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    # programs: (S // BM, B * HQ)
    i_bh = tl.program_id(1)
    _delta_rows(O, DO, DELTA, i_bh // HQ, i_bh % HQ, i_bh, tl.program_id(0) * BM, S, stride_ob, stride_oh,
                stride_os, stride_dob, stride_doh, stride_dos, BM, D, TMA)


@triton.jit
def _dq_step(b_dq, b_q, b_do, lse, delta, b_k, b_v, qk_scale, keep, MASKED: tl.constexpr):
    b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale         # [BM, D] @ [D, BN] -> [BM, BN]
    b_p = tl.math.exp2(b_s - lse[:, None])
    if MASKED:
        b_p = tl.where(keep, b_p, 0.0)
    b_dp = tl.dot(b_do, tl.trans(b_v))                   # [BM, D] @ [D, BN] -> [BM, BN]
    b_ds = b_p * (b_dp - delta[:, None])
    return tl.dot(b_ds.to(b_k.dtype), b_k, b_dq)         # [BM, BN] @ [BN, D] -> [BM, D]


@triton.jit
def _dq_program(
    i_t, i_bh, Q, K, V, O, DO, DQ, LSE, DELTA, SEQLENS, HEADERS, ENTRIES, ORDER, MASKS,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
    stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs,
    S, HQ, HL, NB, GROUP, qk_scale, sm_scale,
    BS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr, TMA: tl.constexpr,
    PREFETCH: tl.constexpr, DELTA_READY: tl.constexpr,
):
    """dq of query tile ``i_t`` of head ``i_bh`` (and its ``delta``, unless ``DELTA_READY``)."""
    KS: tl.constexpr = BS // BN
    i_b, i_hq, i_hk, i_hl, q_blk, q0 = row_tile(ORDER, i_t, i_bh, HQ, HL, GROUP, BS, BM)
    o_m = q0 + tl.arange(0, BM)
    start, n_full, n_part, seqlen = block_list(HEADERS, SEQLENS, i_b, i_hl, q_blk, NB, q0, S, HAS_SEQLENS)

    b_q = load_rows(Q, i_b, i_hq, q0, stride_qb, stride_qh, stride_qs, BM, D, TMA)
    if DELTA_READY:
        b_do = load_rows(DO, i_b, i_hq, q0, stride_dob, stride_doh, stride_dos, BM, D, TMA)
        delta = tl.load(DELTA + i_bh.to(tl.int64) * S + o_m)
    else:
        b_do, delta = _delta_rows(O, DO, DELTA, i_b, i_hq, i_bh, q0, S, stride_ob, stride_oh, stride_os,
                                  stride_dob, stride_doh, stride_dos, BM, D, TMA)
    lse = _load_lse(LSE, i_bh, o_m, S)
    if HAS_SEQLENS:  # padding rows may hold NaN / inf (q, do): zero probabilities would not stop it
        b_q, b_do = past_zeroed(b_q, o_m, seqlen), past_zeroed(b_do, o_m, seqlen)
        delta = tl.where(o_m < seqlen, delta, 0.0)
    b_dq = tl.zeros([BM, D], dtype=tl.float32)
    kv = (K, V, ENTRIES, MASKS)
    strides = (stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs)
    if PREFETCH:
        lo, hi = start * KS, (start + n_full) * KS
        n_blk, n_k0, _ = entry_ahead(ENTRIES, lo, hi, KS, BS, BN)
        for t in tl.range(lo, hi):
            k_blk, k0 = n_blk, n_k0
            n_blk, n_k0, _ = entry_ahead(ENTRIES, t + 1, hi, KS, BS, BN)
            b_k, b_v, keep = kv_tiles(K, V, MASKS, k_blk, k0, -1, i_b, i_hk, o_m, q_blk, seqlen, *strides,
                                      BS, BN, D, TMA, False, CAUSAL, HAS_SEQLENS, HAS_MASKS)
            b_dq = _dq_step(b_dq, b_q, b_do, lse, delta, b_k, b_v, qk_scale, keep, HAS_SEQLENS)
    else:
        for t in tl.range(start * KS, (start + n_full) * KS):
            b_k, b_v, keep = kv_step(*kv, t, i_b, i_hk, o_m, q_blk, seqlen, *strides,
                                     BS, BN, D, TMA, False, CAUSAL, HAS_SEQLENS, HAS_MASKS)
            b_dq = _dq_step(b_dq, b_q, b_do, lse, delta, b_k, b_v, qk_scale, keep, HAS_SEQLENS)
    for t in tl.range((start + n_full) * KS, (start + n_full + n_part) * KS):
        b_k, b_v, keep = kv_step(*kv, t, i_b, i_hk, o_m, q_blk, seqlen, *strides,
                                 BS, BN, D, TMA, True, CAUSAL, HAS_SEQLENS, HAS_MASKS)
        b_dq = _dq_step(b_dq, b_q, b_do, lse, delta, b_k, b_v, qk_scale, keep, True)

    store_rows(DQ, b_dq * sm_scale, i_b, i_hq, q0, stride_dqb, stride_dqh, stride_dqs, BM, D, TMA)


@triton.jit
def _dq_ds_program(
    i_t, i_bh, K, DQ, HEADERS, ENTRIES, ORDER, PAIRS, COL_HEADERS, DS, stride_kb, stride_kh, stride_ks,
    stride_dqb, stride_dqh, stride_dqs, S, HQ, HL, NB, E_SPAN, GROUP, BH0, sm_scale,
    BS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr,
):
    """dq of query tile ``i_t`` of head ``i_bh`` from the dS tiles the dk/dv launch wrote (``STORE_DS``):
    ``scale * sum(dS k)`` over its row list, masked elements already zero there."""
    KS: tl.constexpr = BS // BN
    i_b, i_hq, i_hk, i_hl, q_blk, q0 = row_tile(ORDER, i_t, i_bh, HQ, HL, GROUP, BS, BM)
    start, n_full, n_part, _ = block_list(HEADERS, HEADERS, i_b, i_hl, q_blk, NB, q0, S, False)
    ds_rows = ds_tiles(DS, COL_HEADERS, i_bh, BH0, i_hl, NB, E_SPAN, BS) + (q0 - q_blk * BS)
    b_dq = tl.zeros([BM, D], dtype=tl.float32)
    for t in tl.range(start * KS, (start + n_full + n_part) * KS):
        k_blk = tl.load(ENTRIES + (t // KS) * 2)
        pair = tl.load(PAIRS + t // KS)
        b_k = load_rows(K, i_b, i_hk, k_blk * BS + (t % KS) * BN, stride_kb, stride_kh, stride_ks, BN, D, TMA)
        p_ds = (ds_rows + pair.to(tl.int64) * (BS * BS) + ((t % KS) * BN + tl.arange(0, BN))[:, None] * BS
                + tl.arange(0, BM)[None, :])
        b_dq = tl.dot(tl.trans(tl.load(p_ds)), b_k, b_dq)   # [BM, BN] @ [BN, D] -> [BM, D]
    store_rows(DQ, b_dq * sm_scale, i_b, i_hq, q0, stride_dqb, stride_dqh, stride_dqs, BM, D, TMA)


@triton.jit
def _dkdv_step(b_dk, b_dv, b_k, b_v, Q, DO, DQ, LSE, DELTA, i_b, i_hq, i_bh, q0, S, seqlen,
               stride_qb, stride_qh, stride_qs, stride_dob, stride_doh, stride_dos,
               qk_scale, sm_scale, keep, p_ds, BM: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr,
               D: tl.constexpr, TMA: tl.constexpr, MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
               HAS_SEQLENS: tl.constexpr, STORE_DS: tl.constexpr):
    """Add the contribution of query rows ``q0 .. q0 + BM - 1`` of head ``i_hq`` to dk and dv (and, with
    ``ATOMIC_DQ``, theirs to the float32 ``DQ``; with ``STORE_DS`` write their ``dS`` tile, keys by
    queries, at ``p_ds`` in the scratch's ``BS``-wide rows); rows past a ragged batch's length add nothing."""
    o_m = q0 + tl.arange(0, BM)
    b_q = load_rows(Q, i_b, i_hq, q0, stride_qb, stride_qh, stride_qs, BM, D, TMA)
    b_do = load_rows(DO, i_b, i_hq, q0, stride_dob, stride_doh, stride_dos, BM, D, TMA)
    lse = _load_lse(LSE, i_bh, o_m, S)
    delta = tl.load(DELTA + i_bh.to(tl.int64) * S + o_m)
    if HAS_SEQLENS:  # padding may hold NaN / inf: zero probabilities would not stop it
        b_q, b_do = past_zeroed(b_q, o_m, seqlen), past_zeroed(b_do, o_m, seqlen)
        delta = tl.where(o_m < seqlen, delta, 0.0)
    b_st = tl.dot(b_k, tl.trans(b_q)) * qk_scale         # [BN, D] @ [D, BM] -> [BN, BM]
    b_pt = tl.math.exp2(b_st - lse[None, :])
    if MASKED:
        b_pt = tl.where(keep, b_pt, 0.0)
    b_dv = tl.dot(b_pt.to(b_do.dtype), b_do, b_dv)       # [BN, BM] @ [BM, D] -> [BN, D]
    b_dpt = tl.dot(b_v, tl.trans(b_do))                  # [BN, D] @ [D, BM] -> [BN, BM]
    b_dst = (b_pt * (b_dpt - delta[None, :])).to(b_q.dtype)
    b_dk = tl.dot(b_dst, b_q, b_dk)                      # [BN, BM] @ [BM, D] -> [BN, D]
    if STORE_DS:
        tl.store(p_ds + tl.arange(0, BN)[:, None] * BS + tl.arange(0, BM)[None, :], b_dst)
    if ATOMIC_DQ:  # DQ: contiguous float32 (B, HQ, S, D); with TMA a descriptor over it
        b_dq = tl.dot(tl.trans(b_dst), b_k) * sm_scale   # [BM, BN] @ [BN, D] -> [BM, D]
        if TMA:  # one bulk reduce-add of the tile by the copy engine (as FlashAttention-3 adds dq)
            DQ.atomic_add([i_b, i_hq, q0, 0], b_dq.reshape(1, 1, BM, D))
        else:
            p_dq = DQ + (i_bh.to(tl.int64) * S + o_m[:, None]) * D + tl.arange(0, D)[None, :]
            tl.atomic_add(p_dq, b_dq, sem="relaxed")
    return b_dk, b_dv


@triton.jit
def _dkdv_program(
    i_t, i_bk, Q, K, V, DO, DK, DV, DQ, LSE, DELTA, SEQLENS, HEADERS, ENTRIES, ORDER, MASKS, DS,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    S, HQ, HL, NB, E_SPAN, GROUP, BH0, qk_scale, sm_scale,
    BS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr, TMA: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, PREFETCH: tl.constexpr, STORE_DS: tl.constexpr,
):
    """dk and dv of key tile ``i_t`` of key/value head ``i_bk`` (with ``STORE_DS`` the dS tiles too)."""
    RN: tl.constexpr = BS // BN    # key tiles per block
    MS: tl.constexpr = BS // BM    # query steps per block
    HK = HQ // GROUP
    i_b = i_bk // HK
    i_hk = i_bk % HK
    k_blk = tl.load(ORDER + i_t // RN)
    k0 = k_blk * BS + (i_t % RN) * BN
    o_n = k0 + tl.arange(0, BN)

    b_k = load_rows(K, i_b, i_hk, k0, stride_kb, stride_kh, stride_ks, BN, D, TMA)
    b_v = load_rows(V, i_b, i_hk, k0, stride_vb, stride_vh, stride_vs, BN, D, TMA)
    if HAS_SEQLENS:  # keys past the length: zeros (with ATOMIC_DQ they reach dq)
        k_len = tl.load(SEQLENS + i_b)
        b_k, b_v = past_zeroed(b_k, o_n, k_len), past_zeroed(b_v, o_n, k_len)
    b_dk = tl.zeros([BN, D], dtype=tl.float32)
    b_dv = tl.zeros([BN, D], dtype=tl.float32)
    for g in range(GROUP):
        i_hq = i_hk * GROUP + g
        i_bh = i_b * HQ + i_hq
        # keys wholly past a ragged batch's length are attended by nobody: an empty list
        start, n_full, n_part, seqlen = block_list(HEADERS, SEQLENS, i_b, i_hq % HL, k_blk, NB, k0, S, HAS_SEQLENS)
        ds_keys = ds_tiles(DS, HEADERS, i_bh, BH0, i_hq % HL, NB, E_SPAN, BS) + (i_t % RN) * BN * BS
        if PREFETCH:
            lo, hi = start * MS, (start + n_full) * MS
            _, n_q0, _ = entry_ahead(ENTRIES, lo, hi, MS, BS, BM)
            for t in tl.range(lo, hi):
                q0 = n_q0
                _, n_q0, _ = entry_ahead(ENTRIES, t + 1, hi, MS, BS, BM)
                b_dk, b_dv = _dkdv_step(b_dk, b_dv, b_k, b_v, Q, DO, DQ, LSE, DELTA, i_b, i_hq, i_bh, q0, S, seqlen,
                                        stride_qb, stride_qh, stride_qs, stride_dob, stride_doh, stride_dos,
                                        qk_scale, sm_scale, o_n[:, None] < seqlen, ds_at(ds_keys, t, MS, BS, BM),
                                        BM, BN, BS, D, TMA, HAS_SEQLENS, ATOMIC_DQ, HAS_SEQLENS, STORE_DS)
        else:
            for t in tl.range(start * MS, (start + n_full) * MS):
                _, q0, _ = list_entry(ENTRIES, t, MS, BS, BM)
                b_dk, b_dv = _dkdv_step(b_dk, b_dv, b_k, b_v, Q, DO, DQ, LSE, DELTA, i_b, i_hq, i_bh, q0, S, seqlen,
                                        stride_qb, stride_qh, stride_qs, stride_dob, stride_doh, stride_dos,
                                        qk_scale, sm_scale, o_n[:, None] < seqlen, ds_at(ds_keys, t, MS, BS, BM),
                                        BM, BN, BS, D, TMA, HAS_SEQLENS, ATOMIC_DQ, HAS_SEQLENS, STORE_DS)
        for t in tl.range((start + n_full) * MS, (start + n_full + n_part) * MS):
            q_blk, q0, mask_id = list_entry(ENTRIES, t, MS, BS, BM)
            keep = keep_mask((q0 + tl.arange(0, BM))[None, :], o_n[:, None], seqlen, q_blk, k_blk, mask_id, MASKS,
                             BS, CAUSAL, HAS_SEQLENS, HAS_MASKS)
            b_dk, b_dv = _dkdv_step(b_dk, b_dv, b_k, b_v, Q, DO, DQ, LSE, DELTA, i_b, i_hq, i_bh, q0, S, seqlen,
                                    stride_qb, stride_qh, stride_qs, stride_dob, stride_doh, stride_dos,
                                    qk_scale, sm_scale, keep, ds_at(ds_keys, t, MS, BS, BM), BM, BN, BS, D, TMA,
                                    True, ATOMIC_DQ, HAS_SEQLENS, STORE_DS)

    store_rows(DK, b_dk * sm_scale, i_b, i_hk, k0, stride_dkb, stride_dkh, stride_dks, BN, D, TMA)
    store_rows(DV, b_dv, i_b, i_hk, k0, stride_dvb, stride_dvh, stride_dvs, BN, D, TMA)


@triton.jit
def attn_bwd_kernel(
    Q1, K1, V1, DO1, DK, DV, Q2, K2, V2, O, DO2, DQ, LSE, DELTA, SEQLENS,
    COL_HEADERS, COL_ENTRIES, COL_ORDER, ROW_HEADERS, ROW_ENTRIES, ROW_ORDER, ROW_PAIRS, MASKS, DS,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs,
    S, HQ, HL, NB, E_SPAN, GROUP, KV_TILES, KV_HEADS, Q_TILES, Q_HEADS, U0, qk_scale, sm_scale,
    BS: tl.constexpr, BM1: tl.constexpr, BN1: tl.constexpr, BM2: tl.constexpr, BN2: tl.constexpr,
    D: tl.constexpr, CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_MASKS: tl.constexpr, TMA: tl.constexpr,
    DKDV: tl.constexpr = True, DQ_PASS: tl.constexpr = True, ATOMIC_DQ: tl.constexpr = False,
    PREFETCH: tl.constexpr = False, HEADS_FIRST: tl.constexpr = False, STORE_DS: tl.constexpr = False,
):
    # a one-dimensional grid: KV_TILES x KV_HEADS dk/dv programs (with DKDV), then Q_TILES x Q_HEADS
    # dq programs (with DQ_PASS); *1 operands are the dk/dv programs' tiles, *2 the dq programs'; with
    # STORE_DS the dk/dv programs write dS into DS, and a later launch's dq programs read it back: then
    # the launches serve the KV_HEADS key/value heads (batch x head) from U0 on and their query heads
    pid = tl.program_id(0)
    kv_programs = KV_TILES * KV_HEADS
    # the operands of each kind of program (constexprs stay out: a tuple would make them values)
    kv = (Q1, K1, V1, DO1, DK, DV, DQ, LSE, DELTA, SEQLENS, COL_HEADERS, COL_ENTRIES, COL_ORDER, MASKS, DS,
          stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
          stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
          S, HQ, HL, NB, E_SPAN, GROUP, U0 * GROUP, qk_scale, sm_scale)
    q = (Q2, K2, V2, O, DO2, DQ, LSE, DELTA, SEQLENS, ROW_HEADERS, ROW_ENTRIES, ROW_ORDER, MASKS,
         stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
         stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs,
         S, HQ, HL, NB, GROUP, qk_scale, sm_scale)
    # alone (the dk/dv launch comes after them), the dq programs compute delta themselves
    if DKDV and DQ_PASS:
        if pid < kv_programs:
            _dkdv_program(*split_program(pid, KV_TILES, KV_HEADS, HEADS_FIRST), *kv, BS, BM1, BN1, D, CAUSAL,
                          HAS_SEQLENS, HAS_MASKS, TMA, ATOMIC_DQ, PREFETCH, False)
        else:
            _dq_program(*split_program(pid - kv_programs, Q_TILES, Q_HEADS, HEADS_FIRST), *q, BS, BM2, BN2, D,
                        CAUSAL, HAS_SEQLENS, HAS_MASKS, TMA, PREFETCH, True)
    elif DKDV:
        i_t, i_h = split_program(pid, KV_TILES, KV_HEADS, HEADS_FIRST)
        _dkdv_program(i_t, U0 + i_h, *kv, BS, BM1, BN1, D, CAUSAL, HAS_SEQLENS, HAS_MASKS, TMA, ATOMIC_DQ,
                      PREFETCH, STORE_DS)
    elif STORE_DS:  # after the dk/dv launch that wrote dS (no ragged lengths: the launcher's rule)
        i_t, i_h = split_program(pid, Q_TILES, Q_HEADS, HEADS_FIRST)
        _dq_ds_program(i_t, U0 * GROUP + i_h, K2, DQ, ROW_HEADERS, ROW_ENTRIES, ROW_ORDER, ROW_PAIRS, COL_HEADERS,
                       DS, stride_kb, stride_kh, stride_ks, stride_dqb, stride_dqh, stride_dqs,
                       S, HQ, HL, NB, E_SPAN, GROUP, U0 * GROUP, sm_scale, BS, BM2, BN2, D, TMA)
    else:
        _dq_program(*split_program(pid, Q_TILES, Q_HEADS, HEADS_FIRST), *q, BS, BM2, BN2, D,
                    CAUSAL, HAS_SEQLENS, HAS_MASKS, TMA, PREFETCH, False)
