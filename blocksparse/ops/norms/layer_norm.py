"""Layer norm kernels: ``y = relu?((x - mean) * rstd * g + b)`` over segments of the feature axis.

Activations are addressed by strides, so one kernel serves both layouts: token ``n``, feature
``f`` lives at ``n * stride_n + f * stride_f`` (``(N, C)``: ``stride_f == 1``; ``(C, N)``:
``stride_n == 1``).  The feature axis is cut into equal segments of ``CS`` features, each
normalised on its own; program axis 1 is the segment.  ``MEAN`` / ``RSTD`` are float32 ``(S, N)``.

Program axis 0 takes token tiles ``i_p, i_p + P, ...`` (``P`` programs: one per tile, or persistent
ones) and loads its next tile -- or, walking a long segment in chunks in the forward, its next
chunk -- before it works on the current one, so loads stay in flight during the arithmetic (Triton pipelines only
loads that feed a matrix product).  Accumulation is float32 whatever the activations' dtype;
outputs take the dtype of their buffer.

Bytes moved per element of ``x`` (``e`` = element size; the tiny ``g``, ``b``, statistics and
partial sums aside):

* forward: read ``x``, write ``y``: ``2e`` (a segment longer than one tile reads ``x`` twice, the
  second time mostly from L2);
* backward: read ``x`` and ``dy``, write ``dx``: ``3e``.  ``mean`` and ``rstd`` come from the
  forward; ``xhat`` and the relu mask are recomputed, never stored.
"""
import triton
import triton.language as tl


@triton.jit
def _load_param(P, o_f, m_f, HAS: tl.constexpr):
    """A ``[BC]`` slice of ``g`` or ``b`` in float32 (zeros when absent: then never used)."""
    if HAS:
        b_p = tl.load(P + o_f, mask=m_f, other=0.0).to(tl.float32)
    else:
        b_p = tl.zeros(o_f.shape, dtype=tl.float32)
    return b_p


@triton.jit
def _affine(b_xhat, b_g, b_b, HAS_G: tl.constexpr, HAS_B: tl.constexpr):
    """``xhat * g + b`` on a ``[BN, BC]`` tile (before the relu)."""
    b_y = b_xhat
    if HAS_G:
        b_y = b_y * b_g[None, :]
    if HAS_B:
        b_y = b_y + b_b[None, :]
    return b_y


@triton.jit
def _offsets(P, o_n, o_f, stride_n, stride_f):
    return P + o_n[:, None].to(tl.int64) * stride_n + o_f[None, :].to(tl.int64) * stride_f


@triton.jit
def _raw(P, o_n, o_f, m, stride_n, stride_f):
    """Load a ``[BN, BC]`` tile in its own dtype (zeros outside the mask)."""
    return tl.load(_offsets(P, o_n, o_f, stride_n, stride_f), mask=m, other=0.0)


@triton.jit
def _store_tile(P, b, o_n, o_f, m, stride_n, stride_f):
    tl.store(_offsets(P, o_n, o_f, stride_n, stride_f), b.to(P.dtype.element_ty), mask=m)


@triton.jit
def _chunk(P, o_n, m_n, f0, c0, CS, stride_n, stride_f, BC: tl.constexpr):
    """Features ``[c0, c0 + BC)`` of a segment for a token tile, in their own dtype (masked past
    the segment's end: none at all past its last chunk)."""
    o_c = c0 + tl.arange(0, BC)
    return _raw(P, o_n, f0 + o_c, m_n[:, None] & (o_c < CS)[None, :], stride_n, stride_f)


@triton.jit
def _rows(i_n, N, BN: tl.constexpr):
    """Token offsets and mask of token tile ``i_n`` (all masked off past the last tile)."""
    o_n = i_n * BN + tl.arange(0, BN)
    return o_n, o_n < N


@triton.jit
def _first(P, o_n, m_n, f0, stride_n, stride_f):
    """Each token's first feature of the segment, float32: the shift of :func:`_shifted_mean` (0 where
    its magnitude exceeds 2**100 or it is not finite, so that ``x - x0`` never overflows: within 2**100
    of float32's largest number, ``x - x0`` rounds back to ``x``)."""
    b_x0 = tl.load(P + o_n.to(tl.int64) * stride_n + f0.to(tl.int64) * stride_f, mask=m_n, other=0.0)
    b_x0 = b_x0.to(tl.float32)
    return tl.where(tl.abs(b_x0) <= 1.2676506002282294e30, b_x0, 0.0)


@triton.jit
def _shifted_mean(b_x, b_x0, m, count):
    """The mean of each row of ``b_x`` over ``count`` entries, as ``x0 + mean(x - x0)`` (``x0``: a value
    of the row): exact for constant rows, whose plain float32 mean can be an ulp off the value -- which
    would make ``x - mean`` an ulp instead of 0, and ``xhat`` of order one with a small epsilon."""
    return b_x0 + tl.sum(tl.where(m, b_x - b_x0[:, None], 0.0), 1) / count


@triton.jit
def _normalise(b_x, b_x0, m, CS, epsilon):
    """``(xhat, mean, rstd)`` of a tile holding whole segments (masked entries zero); ``b_x0``: each
    row's first value."""
    b_mean = _shifted_mean(b_x, b_x0, m, CS)
    b_xc = tl.where(m, b_x - b_mean[:, None], 0.0)
    b_rstd = tl.math.rsqrt(tl.sum(b_xc * b_xc, 1) / CS + epsilon)
    return b_xc * b_rstd[:, None], b_mean, b_rstd


@triton.jit
def layer_norm_fwd_kernel(
    X, G, B, Y, MEAN, RSTD,
    N, CS, epsilon,
    stride_xn, stride_xf, stride_yn, stride_yf,
    BN: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr,
    HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr,
):
    # program i_p takes token tiles i_p, i_p + P, ... (P programs: one per tile, or persistent)
    i_p, i_s = tl.program_id(0), tl.program_id(1)
    n_p = tl.num_programs(0)
    f0 = i_s * CS  # the segment's first feature
    if ONE_CHUNK:
        o_c = tl.arange(0, BC)
        m_c = o_c < CS
        r_g = _load_param(G, f0 + o_c, m_c, HAS_G)
        r_b = _load_param(B, f0 + o_c, m_c, HAS_B)
        # the next tile is loaded before this one is worked on: its loads are in flight meanwhile
        o_n, m_n = _rows(i_p, N, BN)
        r_x = _raw(X, o_n, f0 + o_c, m_n[:, None] & m_c[None, :], stride_xn, stride_xf)
        for i_n in range(i_p, tl.cdiv(N, BN), n_p):
            o_n, m_n = _rows(i_n, N, BN)
            m = m_n[:, None] & m_c[None, :]
            b_x = r_x.to(tl.float32)
            o_nn, m_nn = _rows(i_n + n_p, N, BN)
            r_x = _raw(X, o_nn, f0 + o_c, m_nn[:, None] & m_c[None, :], stride_xn, stride_xf)
            b_x0 = _first(X, o_n, m_n, f0, stride_xn, stride_xf)
            b_xhat, b_mean, b_rstd = _normalise(b_x, b_x0, m, CS, epsilon)
            b_y = _affine(b_xhat, r_g, r_b, HAS_G, HAS_B)
            if RELU:
                b_y = tl.maximum(b_y, 0.0, propagate_nan=tl.PropagateNan.ALL)
            _store_tile(Y, b_y, o_n, f0 + o_c, m, stride_yn, stride_yf)
            tl.store(MEAN + i_s * N + o_n, b_mean, mask=m_n)
            tl.store(RSTD + i_s * N + o_n, b_rstd, mask=m_n)
    else:
        for i_n in range(i_p, tl.cdiv(N, BN), n_p):
            o_n, m_n = _rows(i_n, N, BN)
            # chunk statistics merged pairwise (Chan et al.): no E[x^2] - E[x]^2 cancellation; each
            # pass loads its next chunk before it works on the current one
            b_mean = tl.zeros((BN,), dtype=tl.float32)
            b_m2 = tl.zeros((BN,), dtype=tl.float32)
            b_x0 = _first(X, o_n, m_n, f0, stride_xn, stride_xf)
            r_x = _chunk(X, o_n, m_n, f0, 0, CS, stride_xn, stride_xf, BC)
            for c0 in range(0, CS, BC):
                o_c = c0 + tl.arange(0, BC)
                m = m_n[:, None] & (o_c < CS)[None, :]
                b_x = r_x.to(tl.float32)
                r_x = _chunk(X, o_n, m_n, f0, c0 + BC, CS, stride_xn, stride_xf, BC)
                cnt = tl.minimum(CS - c0, BC).to(tl.float32)
                b_cmean = _shifted_mean(b_x, b_x0, m, cnt)
                b_xc = tl.where(m, b_x - b_cmean[:, None], 0.0)
                b_delta = b_cmean - b_mean
                total = c0 + cnt
                b_mean += b_delta * (cnt / total)
                b_m2 += tl.sum(b_xc * b_xc, 1) + b_delta * b_delta * (c0 * cnt / total)
            b_rstd = tl.math.rsqrt(b_m2 / CS + epsilon)
            r_x = _chunk(X, o_n, m_n, f0, 0, CS, stride_xn, stride_xf, BC)
            for c0 in range(0, CS, BC):
                o_c = c0 + tl.arange(0, BC)
                m_c = o_c < CS
                m = m_n[:, None] & m_c[None, :]
                b_x = r_x.to(tl.float32)
                r_x = _chunk(X, o_n, m_n, f0, c0 + BC, CS, stride_xn, stride_xf, BC)
                b_g = _load_param(G, f0 + o_c, m_c, HAS_G)
                b_b = _load_param(B, f0 + o_c, m_c, HAS_B)
                b_y = _affine((b_x - b_mean[:, None]) * b_rstd[:, None], b_g, b_b, HAS_G, HAS_B)
                if RELU:
                    b_y = tl.maximum(b_y, 0.0, propagate_nan=tl.PropagateNan.ALL)
                _store_tile(Y, b_y, o_n, f0 + o_c, m, stride_yn, stride_yf)
            tl.store(MEAN + i_s * N + o_n, b_mean, mask=m_n)
            tl.store(RSTD + i_s * N + o_n, b_rstd, mask=m_n)


@triton.jit
def _grads(b_x, b_dy, b_mean, b_rstd, b_g, b_b, m, HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr):
    """``(xhat, dy, dxhat)`` of a float32 tile: ``dy`` masked by the recomputed relu, ``dxhat = dy * g``."""
    b_xhat = tl.where(m, (b_x - b_mean[:, None]) * b_rstd[:, None], 0.0)
    if RELU:  # the same float32 arithmetic as the forward, so the same mask
        b_dy = tl.where(_affine(b_xhat, b_g, b_b, HAS_G, HAS_B) > 0.0, b_dy, 0.0)
    b_dxhat = b_dy
    if HAS_G:
        b_dxhat = b_dy * b_g[None, :]
    return b_xhat, b_dy, b_dxhat


@triton.jit
def _chunk_grads(X, G, B, DY, b_mean, b_rstd, o_n, m_n, f0, c0, CS, stride_xn, stride_xf, stride_dn, stride_df,
                 BC: tl.constexpr, HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr):
    """:func:`_grads` of the chunk of features ``[c0, c0 + BC)`` of a segment, with its offsets
    and masks: ``(o_c, m_c, m, xhat, dy, dxhat)``.  (Loaded here, not a chunk ahead: holding the
    next chunks of ``x`` and ``dy`` too spills registers.)"""
    o_c = c0 + tl.arange(0, BC)
    m_c = o_c < CS
    m = m_n[:, None] & m_c[None, :]
    b_g = _load_param(G, f0 + o_c, m_c, HAS_G)
    b_b = _load_param(B, f0 + o_c, m_c, HAS_B)
    b_x = _raw(X, o_n, f0 + o_c, m, stride_xn, stride_xf).to(tl.float32)
    b_dy = _raw(DY, o_n, f0 + o_c, m, stride_dn, stride_df).to(tl.float32)
    b_xhat, b_dy, b_dxhat = _grads(b_x, b_dy, b_mean, b_rstd, b_g, b_b, m, HAS_G, HAS_B, RELU)
    return o_c, m_c, m, b_xhat, b_dy, b_dxhat


@triton.jit
def _stats(MEAN, RSTD, o_n, m_n):
    return tl.load(MEAN + o_n, mask=m_n, other=0.0), tl.load(RSTD + o_n, mask=m_n, other=0.0)


@triton.jit
def layer_norm_bwd_kernel(
    X, G, B, DY, DX, MEAN, RSTD, DG_PART, DB_PART,
    N, CS,
    stride_xn, stride_xf, stride_dyn, stride_dyf, stride_dxn, stride_dxf,
    BN: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr,
    HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr,
):
    # persistent: program i_p takes token tiles i_p, i_p + P, ... and owns row i_p of the (P, C)
    # partial buffers of dg and db
    i_p, i_s = tl.program_id(0), tl.program_id(1)
    n_p = tl.num_programs(0)
    f0 = i_s * CS
    C = CS * tl.num_programs(1)
    p_part = i_p.to(tl.int64) * C + f0
    MEAN += i_s * N
    RSTD += i_s * N
    if ONE_CHUNK:
        o_c = tl.arange(0, BC)
        m_c = o_c < CS
        b_g = _load_param(G, f0 + o_c, m_c, HAS_G)
        b_b = _load_param(B, f0 + o_c, m_c, HAS_B)
        b_dg = tl.zeros((BC,), dtype=tl.float32)
        b_db = tl.zeros((BC,), dtype=tl.float32)
        # the next tile is loaded before this one is worked on: its loads are in flight meanwhile
        o_n, m_n = _rows(i_p, N, BN)
        m = m_n[:, None] & m_c[None, :]
        r_x = _raw(X, o_n, f0 + o_c, m, stride_xn, stride_xf)
        r_dy = _raw(DY, o_n, f0 + o_c, m, stride_dyn, stride_dyf)
        r_mean, r_rstd = _stats(MEAN, RSTD, o_n, m_n)
        for i_n in range(i_p, tl.cdiv(N, BN), n_p):
            o_n, m_n = _rows(i_n, N, BN)
            m = m_n[:, None] & m_c[None, :]
            b_x, b_dy, b_mean, b_rstd = r_x.to(tl.float32), r_dy.to(tl.float32), r_mean, r_rstd
            o_nn, m_nn = _rows(i_n + n_p, N, BN)
            m_next = m_nn[:, None] & m_c[None, :]
            r_x = _raw(X, o_nn, f0 + o_c, m_next, stride_xn, stride_xf)
            r_dy = _raw(DY, o_nn, f0 + o_c, m_next, stride_dyn, stride_dyf)
            r_mean, r_rstd = _stats(MEAN, RSTD, o_nn, m_nn)
            b_xhat, b_dy, b_dxhat = _grads(b_x, b_dy, b_mean, b_rstd, b_g, b_b, m, HAS_G, HAS_B, RELU)
            b_dg += tl.sum(b_dy * b_xhat, 0)
            b_db += tl.sum(b_dy, 0)
            b_c1 = tl.sum(b_xhat * b_dxhat, 1) / CS
            b_c2 = tl.sum(b_dxhat, 1) / CS
            b_dx = (b_dxhat - b_xhat * b_c1[:, None] - b_c2[:, None]) * b_rstd[:, None]
            _store_tile(DX, b_dx, o_n, f0 + o_c, m, stride_dxn, stride_dxf)
        if HAS_G:
            tl.store(DG_PART + p_part + o_c, b_dg, mask=m_c)
        if HAS_B:
            tl.store(DB_PART + p_part + o_c, b_db, mask=m_c)
    else:
        # the partial rows start zeroed and are updated chunk by chunk (read-modify-write of
        # this program's own row; the barrier orders one step's stores before the next's loads)
        for i_n in range(i_p, tl.cdiv(N, BN), n_p):
            o_n, m_n = _rows(i_n, N, BN)
            b_mean, b_rstd = _stats(MEAN, RSTD, o_n, m_n)
            b_c1 = tl.zeros((BN,), dtype=tl.float32)
            b_c2 = tl.zeros((BN,), dtype=tl.float32)
            for c0 in range(0, CS, BC):
                o_c, m_c, m, b_xhat, b_dy, b_dxhat = _chunk_grads(
                    X, G, B, DY, b_mean, b_rstd, o_n, m_n, f0, c0, CS, stride_xn, stride_xf, stride_dyn, stride_dyf,
                    BC, HAS_G, HAS_B, RELU)
                b_c1 += tl.sum(b_xhat * b_dxhat, 1)
                b_c2 += tl.sum(b_dxhat, 1)
            b_c1 = b_c1 / CS
            b_c2 = b_c2 / CS
            for c0 in range(0, CS, BC):
                o_c, m_c, m, b_xhat, b_dy, b_dxhat = _chunk_grads(
                    X, G, B, DY, b_mean, b_rstd, o_n, m_n, f0, c0, CS, stride_xn, stride_xf, stride_dyn, stride_dyf,
                    BC, HAS_G, HAS_B, RELU)
                b_dx = (b_dxhat - b_xhat * b_c1[:, None] - b_c2[:, None]) * b_rstd[:, None]
                _store_tile(DX, b_dx, o_n, f0 + o_c, m, stride_dxn, stride_dxf)
                tl.debug_barrier()
                if HAS_G:
                    p_dg = DG_PART + p_part + o_c
                    tl.store(p_dg, tl.load(p_dg, mask=m_c, other=0.0) + tl.sum(b_dy * b_xhat, 0), mask=m_c)
                if HAS_B:
                    p_db = DB_PART + p_part + o_c
                    tl.store(p_db, tl.load(p_db, mask=m_c, other=0.0) + tl.sum(b_dy, 0), mask=m_c)
