"""Fused LSTM gates: one step's nonlinearities and cell update in one pass over memory.

With the four gate pre-activations ``i, j, f, o`` (each ``(N, K)``, bias already added by the
kernel when given) and the cell state ``c``::

    i = sigmoid(i)   j = tanh(j)   f = sigmoid(f + forget_bias)   o = sigmoid(o)
    c_next = f * c + i * j
    h_next = o * tanh(c_next)

The gates arrive as four pointers with their own row strides, so one merged ``(N, 4K)`` tensor
(four column views) and four separate tensors take the same kernel; features are contiguous
(column stride 1).  The bias is ``(4K,)``: gate ``g`` of feature ``k`` adds ``bias[g * K + k]``.

Accumulation is float32; outputs take the dtype of their buffers.  Bytes moved per cell element
(``e`` = element size): forward reads ``c`` and four gates, writes ``c_next`` and ``h_next``: ``7e``;
backward reads ``c``, four gates, ``dc_next`` and ``dh_next`` and writes ``dc`` and four gate
gradients: ``12e`` (the activations are recomputed, never stored).  The backward's persistent
programs load their next tile while they work on the current one (Triton pipelines only loads
that feed a matrix product).
"""
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # 1 - 2 / (exp(2x) + 1): exact limits at +-inf, and one exp like the sigmoids
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _load(P, o_n, o_k, m, stride):
    """A ``[BN, BK]`` tile in its own dtype (zeros outside the mask)."""
    return tl.load(P + o_n[:, None].to(tl.int64) * stride + o_k[None, :], mask=m, other=0.0)


@triton.jit
def _biases(BIAS, o_k, m_k, K, HAS_BIAS: tl.constexpr):
    """The four gates' ``[BK]`` biases in float32 (zeros without a bias: then never added)."""
    if HAS_BIAS:
        b_bi = tl.load(BIAS + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_bj = tl.load(BIAS + K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_bf = tl.load(BIAS + 2 * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_bo = tl.load(BIAS + 3 * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    else:
        b_bi = tl.zeros(o_k.shape, dtype=tl.float32)
        b_bj, b_bf, b_bo = b_bi, b_bi, b_bi
    return b_bi, b_bj, b_bf, b_bo


@triton.jit
def _pre(r, b_bias, HAS_BIAS: tl.constexpr):
    """A gate's pre-activation in float32, its bias added."""
    b = r.to(tl.float32)
    if HAS_BIAS:
        b += b_bias[None, :]
    return b


@triton.jit
def _activate(r_c, r_i, r_j, r_f, r_o, b_bi, b_bj, b_bf, b_bo, forget_bias, HAS_BIAS: tl.constexpr):
    """``(c, i, j, f, o, c_next)`` of loaded tiles, gates activated, in float32."""
    b_c = r_c.to(tl.float32)
    b_i = tl.sigmoid(_pre(r_i, b_bi, HAS_BIAS))
    b_j = _tanh(_pre(r_j, b_bj, HAS_BIAS))
    b_f = tl.sigmoid(_pre(r_f, b_bf, HAS_BIAS) + forget_bias)
    b_o = tl.sigmoid(_pre(r_o, b_bo, HAS_BIAS))
    return b_c, b_i, b_j, b_f, b_o, b_f * b_c + b_i * b_j


@triton.jit
def _store(P, b, o_n, o_k, m, stride):
    tl.store(P + o_n[:, None].to(tl.int64) * stride + o_k[None, :], b.to(P.dtype.element_ty), mask=m)


@triton.jit
def lstm_gates_fwd_kernel(
    C, I, J, F, O, BIAS, C_NEXT, H_NEXT,
    N, K, forget_bias,
    stride_c, stride_i, stride_j, stride_f, stride_o, stride_cn, stride_hn,
    BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    i_n, i_k = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    m = (o_n < N)[:, None] & m_k[None, :]
    b_bi, b_bj, b_bf, b_bo = _biases(BIAS, o_k, m_k, K, HAS_BIAS)
    b_c, b_i, b_j, b_f, b_o, b_cn = _activate(
        _load(C, o_n, o_k, m, stride_c), _load(I, o_n, o_k, m, stride_i), _load(J, o_n, o_k, m, stride_j),
        _load(F, o_n, o_k, m, stride_f), _load(O, o_n, o_k, m, stride_o),
        b_bi, b_bj, b_bf, b_bo, forget_bias, HAS_BIAS)
    _store(C_NEXT, b_cn, o_n, o_k, m, stride_cn)
    _store(H_NEXT, b_o * _tanh(b_cn), o_n, o_k, m, stride_hn)


@triton.jit
def lstm_gates_bwd_kernel(
    C, I, J, F, O, BIAS, DC_NEXT, DH_NEXT, DC, DI, DJ, DF, DO, DBIAS_PART,
    N, K, forget_bias,
    stride_c, stride_i, stride_j, stride_f, stride_o, stride_dcn, stride_dhn,
    stride_dc, stride_di, stride_dj, stride_df, stride_do,
    BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    # program i_p takes token tiles i_p, i_p + P, ... of feature tile i_k and owns row i_p of the
    # (P, 4K) dbias partial buffer
    i_p, i_k = tl.program_id(0), tl.program_id(1)
    n_p = tl.num_programs(0)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    b_bi, b_bj, b_bf, b_bo = _biases(BIAS, o_k, m_k, K, HAS_BIAS)
    # dbias: each thread sums its own elements over the tiles, reduced over tokens once at the end
    # (a per-tile column sum crossed warps four times a tile, each a barrier)
    b_dbi = tl.zeros((BN, BK), dtype=tl.float32)
    b_dbj = tl.zeros((BN, BK), dtype=tl.float32)
    b_dbf = tl.zeros((BN, BK), dtype=tl.float32)
    b_dbo = tl.zeros((BN, BK), dtype=tl.float32)
    # the next tile is loaded before this one is worked on: its loads are in flight meanwhile
    o_n = i_p * BN + tl.arange(0, BN)
    m = (o_n < N)[:, None] & m_k[None, :]
    r_c, r_i, r_j = _load(C, o_n, o_k, m, stride_c), _load(I, o_n, o_k, m, stride_i), _load(J, o_n, o_k, m, stride_j)
    r_f, r_o = _load(F, o_n, o_k, m, stride_f), _load(O, o_n, o_k, m, stride_o)
    r_dcn, r_dh = _load(DC_NEXT, o_n, o_k, m, stride_dcn), _load(DH_NEXT, o_n, o_k, m, stride_dhn)
    for i_n in range(i_p, tl.cdiv(N, BN), n_p):
        o_n = i_n * BN + tl.arange(0, BN)
        m = (o_n < N)[:, None] & m_k[None, :]
        b_c, b_i, b_j, b_f, b_o, b_cn = _activate(r_c, r_i, r_j, r_f, r_o, b_bi, b_bj, b_bf, b_bo, forget_bias,
                                                  HAS_BIAS)
        b_dcn, b_dh = r_dcn.to(tl.float32), r_dh.to(tl.float32)
        o_nn = o_n + n_p * BN
        m_nn = (o_nn < N)[:, None] & m_k[None, :]
        r_c, r_i, r_j = (_load(C, o_nn, o_k, m_nn, stride_c), _load(I, o_nn, o_k, m_nn, stride_i),
                         _load(J, o_nn, o_k, m_nn, stride_j))
        r_f, r_o = _load(F, o_nn, o_k, m_nn, stride_f), _load(O, o_nn, o_k, m_nn, stride_o)
        r_dcn, r_dh = _load(DC_NEXT, o_nn, o_k, m_nn, stride_dcn), _load(DH_NEXT, o_nn, o_k, m_nn, stride_dhn)
        b_t = _tanh(b_cn)
        b_dcn += b_dh * b_o * (1.0 - b_t * b_t)
        b_di = b_dcn * b_j * b_i * (1.0 - b_i)
        b_dj = b_dcn * b_i * (1.0 - b_j * b_j)
        b_df = b_dcn * b_c * b_f * (1.0 - b_f)
        b_do = b_dh * b_t * b_o * (1.0 - b_o)
        _store(DC, b_dcn * b_f, o_n, o_k, m, stride_dc)
        _store(DI, b_di, o_n, o_k, m, stride_di)
        _store(DJ, b_dj, o_n, o_k, m, stride_dj)
        _store(DF, b_df, o_n, o_k, m, stride_df)
        _store(DO, b_do, o_n, o_k, m, stride_do)
        if HAS_BIAS:  # masked elements are zeros (their loads' other=0 make every gradient 0)
            b_dbi += b_di
            b_dbj += b_dj
            b_dbf += b_df
            b_dbo += b_do
    if HAS_BIAS:
        p_part = DBIAS_PART + i_p.to(tl.int64) * 4 * K + o_k
        tl.store(p_part, tl.sum(b_dbi, 0), mask=m_k)
        tl.store(p_part + K, tl.sum(b_dbj, 0), mask=m_k)
        tl.store(p_part + 2 * K, tl.sum(b_dbf, 0), mask=m_k)
        tl.store(p_part + 3 * K, tl.sum(b_dbo, 0), mask=m_k)
