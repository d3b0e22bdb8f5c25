"""Layer norm's forward in three launches over feature slices: for large ``(C, N)`` activations
whose segments are longer than one tile.

The one-launch forward (:func:`.layer_norm.layer_norm_fwd_kernel`) has one program walk a token
tile's whole segment twice (statistics, then output) with a reduction across its threads at every
chunk, on rows of 64 bytes; once the programs' columns outgrow the L2 both walks read HBM, and it
stays near 0.36 of the copy bandwidth in 16 bits.  Here the grid holds token tiles x feature slices
(:meth:`.configs.SplitConfig.slice_features` makes enough of them):

* :func:`layer_norm_fwd_stats_kernel` walks its ``[BN tokens, FS features]`` slice ``R`` features
  at a time, keeping a running mean and sum of squared deviations per element (Welford: no
  ``E[x^2] - E[x]^2`` cancellation) and merging its ``R`` lanes once at the end (Chan et al.), into
  the slice's partial ``(mean, M2)`` per token;
* :func:`layer_norm_fwd_merge_kernel` merges the slices' partials of its tokens into ``mean`` and
  ``rstd``;
* :func:`layer_norm_fwd_apply_kernel` walks the slice again and writes ``y``.

The partials (float32 ``(segments * slices, 2, N)``: a few bytes per token and slice) are staged in
``y``'s own memory, which only the last launch writes -- so the forward needs no workspace.  Bytes
moved: ``x`` twice, ``y`` once, as the one-launch form.
"""
import triton
import triton.language as tl

from .layer_norm import _affine, _load_param, _raw, _rows, _store_tile


@triton.jit
def _slice(N, CS, FS, BN: tl.constexpr):
    """A program of the grid (token tiles, slices of ``FS`` features, segments): its ids, tokens
    (offsets, mask), the segment's first feature ``f0`` and the slice's features ``[lo, hi)``."""
    i_n, i_p, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n, m_n = _rows(i_n, N, BN)
    lo = i_p * FS
    return i_p, i_s, o_n, m_n, i_s * CS, lo, tl.minimum(lo + FS, CS)


@triton.jit
def _step(X, o_n, m_n, f0, c0, hi, stride_xn, stride_xf, R: tl.constexpr):
    """The raw ``x`` tile of features ``[c0, c0 + R)`` (masked past ``hi``: none at all past it)."""
    o_c = c0 + tl.arange(0, R)
    return _raw(X, o_n, f0 + o_c, m_n[:, None] & (o_c < hi)[None, :], stride_xn, stride_xf)


@triton.jit
def layer_norm_fwd_stats_kernel(
    X, PART,
    N, CS, FS,
    stride_xn, stride_xf,
    BN: tl.constexpr, R: tl.constexpr,
):
    i_p, i_s, o_n, m_n, f0, lo, hi = _slice(N, CS, FS, BN)
    b_mean = tl.zeros((BN, R), dtype=tl.float32)
    b_m2 = tl.zeros((BN, R), dtype=tl.float32)
    r_x = _step(X, o_n, m_n, f0, lo, hi, stride_xn, stride_xf, R)
    k = 0.0
    for c0 in range(lo, hi, R):
        x_now = r_x
        r_x = _step(X, o_n, m_n, f0, c0 + R, hi, stride_xn, stride_xf, R)
        m_c = (c0 + tl.arange(0, R)) < hi  # all lanes but at the slice's last step
        k += 1.0
        b_x = x_now.to(tl.float32)
        b_d = b_x - b_mean
        b_new = b_mean + b_d * (1.0 / k)
        b_m2 = tl.where(m_c[None, :], b_m2 + b_d * (b_x - b_new), b_m2)
        b_mean = tl.where(m_c[None, :], b_new, b_mean)
    # merge the lanes: lane r saw the slice's features lo + r, lo + r + R, ...
    n = hi - lo
    b_cnt = ((n - tl.arange(0, R) + R - 1) // R).to(tl.float32)  # 0 for lanes past a short slice
    mean = tl.sum(b_mean * b_cnt[None, :], 1) / n
    mean += tl.sum((b_mean - mean[:, None]) * b_cnt[None, :], 1) / n  # exact for constant rows
    b_dev = b_mean - mean[:, None]
    m2 = tl.sum(b_m2 + b_dev * b_dev * b_cnt[None, :], 1)
    p = (i_s * tl.num_programs(1) + i_p).to(tl.int64) * 2 * N + o_n
    tl.store(PART + p, mean, mask=m_n)
    tl.store(PART + p + N, m2, mask=m_n)


@triton.jit
def layer_norm_fwd_merge_kernel(
    PART, MEAN, RSTD,
    N, CS, FS, epsilon,
    BN: tl.constexpr,
):
    # grid (token tiles, 1, segments)
    i_s = tl.program_id(2)
    o_n, m_n = _rows(tl.program_id(0), N, BN)
    slices = tl.cdiv(CS, FS)
    b_mean = tl.zeros((BN,), dtype=tl.float32)
    b_m2 = tl.zeros((BN,), dtype=tl.float32)
    total = 0.0
    for q in range(0, slices):
        p = (i_s * slices + q).to(tl.int64) * 2 * N + o_n
        q_mean = tl.load(PART + p, mask=m_n, other=0.0)
        q_m2 = tl.load(PART + p + N, mask=m_n, other=0.0)
        cnt = tl.minimum(FS, CS - q * FS).to(tl.float32)
        b_delta = q_mean - b_mean
        both = total + cnt
        b_mean += b_delta * (cnt / both)
        b_m2 += q_m2 + b_delta * b_delta * (total * cnt / both)
        total = both
    tl.store(MEAN + i_s * N + o_n, b_mean, mask=m_n)
    tl.store(RSTD + i_s * N + o_n, tl.math.rsqrt(b_m2 / CS + epsilon), mask=m_n)


@triton.jit
def layer_norm_fwd_apply_kernel(
    X, G, B, Y, MEAN, RSTD,
    N, CS, FS,
    stride_xn, stride_xf, stride_yn, stride_yf,
    BN: tl.constexpr, R: tl.constexpr,
    HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr,
):
    i_p, i_s, o_n, m_n, f0, lo, hi = _slice(N, CS, FS, BN)
    b_mean = tl.load(MEAN + i_s * N + o_n, mask=m_n, other=0.0)
    b_rstd = tl.load(RSTD + i_s * N + o_n, mask=m_n, other=0.0)
    r_x = _step(X, o_n, m_n, f0, lo, hi, stride_xn, stride_xf, R)
    for c0 in range(lo, hi, R):
        x_now = r_x
        r_x = _step(X, o_n, m_n, f0, c0 + R, hi, stride_xn, stride_xf, R)
        o_c = c0 + tl.arange(0, R)
        m_c = o_c < hi
        b_g = _load_param(G, f0 + o_c, m_c, HAS_G)
        b_b = _load_param(B, f0 + o_c, m_c, HAS_B)
        b_y = _affine((x_now.to(tl.float32) - b_mean[:, None]) * b_rstd[:, None], b_g, b_b, HAS_G, HAS_B)
        if RELU:
            b_y = tl.maximum(b_y, 0.0, propagate_nan=tl.PropagateNan.ALL)
        _store_tile(Y, b_y, o_n, f0 + o_c, m_n[:, None] & m_c[None, :], stride_yn, stride_yf)
