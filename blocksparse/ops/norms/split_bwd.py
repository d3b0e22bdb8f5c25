"""Layer norm's backward in two launches over feature slices: for ``(C, N)`` activations whose
segments are longer than one tile.

The backward needs two sums over each token's features before it can write any ``dx``
(``c1 = mean(xhat * dxhat)``, ``c2 = mean(dxhat)``).  The one-launch kernel
(:func:`.layer_norm.layer_norm_bwd_kernel`) has one program walk a token tile's whole segment
twice, reducing across its threads at every chunk; on ``(C, N)`` activations that left few programs,
narrow rows and a reduction per chunk (0.26-0.37 of HBM bandwidth on the H200).  Here every program
owns a ``[BN tokens, FS features]`` slice of a segment, so a grid holds tokens x feature slices
(:func:`.configs.split_features` makes enough of them):

* :func:`layer_norm_bwd_part_kernel` walks its slice ``R`` features at a time, adding
  ``xhat * dxhat`` and ``dxhat`` element by element (one reduction over features at the end) into
  the slice's partial ``c1`` and ``c2`` (float32 ``(segments * slices, N)``), and writes each
  feature's ``dg`` / ``db`` over its tokens into its token tile's row of the partial buffers
  (``(token tiles, C)``, summed after by :func:`blocksparse.ops.common.reduce.sum_rows_kernel`);
* :func:`layer_norm_bwd_dx_kernel` sums the slices' ``c1`` and ``c2`` of its tokens and walks its
  slice again for ``dx``.

Both load the next step's tiles before they work on the current one.  Bytes moved: ``x`` and
``dy`` twice, ``dx`` once (``5e`` per element against the one-launch form's ``3e`` when its second
pass hits L2, which it did not on ``(C, N)``).
"""
import triton
import triton.language as tl

from .layer_norm import _grads, _load_param, _raw, _rows, _store_tile


@triton.jit
def _program(MEAN, RSTD, N, CS, FS, BN: tl.constexpr):
    """A program of the grid (token tiles, slices of ``FS`` features, segments): its ids, tokens
    (offsets, mask), the segment's first feature ``f0``, the slice's features ``[lo, hi)`` and its
    tokens' statistics."""
    i_n, i_p, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n, m_n = _rows(i_n, N, BN)
    lo = i_p * FS
    b_mean = tl.load(MEAN + i_s * N + o_n, mask=m_n, other=0.0)
    b_rstd = tl.load(RSTD + i_s * N + o_n, mask=m_n, other=0.0)
    return i_n, i_p, i_s, o_n, m_n, i_s * CS, lo, tl.minimum(lo + FS, CS), b_mean, b_rstd


@triton.jit
def _step(X, DY, o_n, m_n, f0, c0, hi, stride_xn, stride_xf, stride_dyn, stride_dyf, R: tl.constexpr):
    """Raw ``x`` and ``dy`` tiles of features ``[c0, c0 + R)`` (masked past ``hi``: none at all past it)."""
    o_c = c0 + tl.arange(0, R)
    m = m_n[:, None] & (o_c < hi)[None, :]
    return _raw(X, o_n, f0 + o_c, m, stride_xn, stride_xf), _raw(DY, o_n, f0 + o_c, m, stride_dyn, stride_dyf)


@triton.jit
def _step_grads(r_x, r_dy, G, B, b_mean, b_rstd, o_n, m_n, f0, c0, hi,
                R: tl.constexpr, HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr):
    """``(o_c, m_c, xhat, dy, dxhat)`` of the raw tiles of features ``[c0, c0 + R)``."""
    o_c = c0 + tl.arange(0, R)
    m_c = o_c < hi
    b_g = _load_param(G, f0 + o_c, m_c, HAS_G)
    b_b = _load_param(B, f0 + o_c, m_c, HAS_B)
    b_xhat, b_dy, b_dxhat = _grads(r_x.to(tl.float32), r_dy.to(tl.float32), b_mean, b_rstd, b_g, b_b,
                                   m_n[:, None] & m_c[None, :], HAS_G, HAS_B, RELU)
    return o_c, m_c, b_xhat, b_dy, b_dxhat


@triton.jit
def layer_norm_bwd_part_kernel(
    X, G, B, DY, MEAN, RSTD, C1_PART, C2_PART, DG_PART, DB_PART,
    N, CS, FS,
    stride_xn, stride_xf, stride_dyn, stride_dyf,
    BN: tl.constexpr, R: tl.constexpr,
    HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr,
):
    i_n, i_p, i_s, o_n, m_n, f0, lo, hi, b_mean, b_rstd = _program(MEAN, RSTD, N, CS, FS, BN)
    n_slices = tl.num_programs(1)
    p_part = i_n.to(tl.int64) * CS * tl.num_programs(2) + f0
    b_c1 = tl.zeros((BN, R), dtype=tl.float32)
    b_c2 = tl.zeros((BN, R), dtype=tl.float32)
    r_x, r_dy = _step(X, DY, o_n, m_n, f0, lo, hi, stride_xn, stride_xf, stride_dyn, stride_dyf, R)
    for c0 in range(lo, hi, R):
        x_now, dy_now = r_x, r_dy
        r_x, r_dy = _step(X, DY, o_n, m_n, f0, c0 + R, hi, stride_xn, stride_xf, stride_dyn, stride_dyf, R)
        o_c, m_c, b_xhat, b_dy, b_dxhat = _step_grads(x_now, dy_now, G, B, b_mean, b_rstd, o_n, m_n, f0, c0, hi,
                                                      R, HAS_G, HAS_B, RELU)
        b_c1 += b_xhat * b_dxhat
        b_c2 += b_dxhat
        if HAS_G:
            tl.store(DG_PART + p_part + o_c, tl.sum(b_dy * b_xhat, 0), mask=m_c)
        if HAS_B:
            tl.store(DB_PART + p_part + o_c, tl.sum(b_dy, 0), mask=m_c)
    p_c = (i_s * n_slices + i_p) * N + o_n
    tl.store(C1_PART + p_c, tl.sum(b_c1, 1), mask=m_n)
    tl.store(C2_PART + p_c, tl.sum(b_c2, 1), mask=m_n)


@triton.jit
def layer_norm_bwd_dx_kernel(
    X, G, B, DY, DX, MEAN, RSTD, C1_PART, C2_PART,
    N, CS, FS,
    stride_xn, stride_xf, stride_dyn, stride_dyf, stride_dxn, stride_dxf,
    BN: tl.constexpr, R: tl.constexpr,
    HAS_G: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr,
):
    i_n, i_p, i_s, o_n, m_n, f0, lo, hi, b_mean, b_rstd = _program(MEAN, RSTD, N, CS, FS, BN)
    n_slices = tl.num_programs(1)
    r_x, r_dy = _step(X, DY, o_n, m_n, f0, lo, hi, stride_xn, stride_xf, stride_dyn, stride_dyf, R)
    b_c1 = tl.zeros((BN,), dtype=tl.float32)
    b_c2 = tl.zeros((BN,), dtype=tl.float32)
    for q in range(0, n_slices):
        p_c = (i_s * n_slices + q) * N + o_n
        b_c1 += tl.load(C1_PART + p_c, mask=m_n, other=0.0)
        b_c2 += tl.load(C2_PART + p_c, mask=m_n, other=0.0)
    b_c1 = b_c1 / CS
    b_c2 = b_c2 / CS
    for c0 in range(lo, hi, R):
        x_now, dy_now = r_x, r_dy
        r_x, r_dy = _step(X, DY, o_n, m_n, f0, c0 + R, hi, stride_xn, stride_xf, stride_dyn, stride_dyf, R)
        o_c, m_c, b_xhat, b_dy, b_dxhat = _step_grads(x_now, dy_now, G, B, b_mean, b_rstd, o_n, m_n, f0, c0, hi,
                                                      R, HAS_G, HAS_B, RELU)
        b_dx = (b_dxhat - b_xhat * b_c1[:, None] - b_c2[:, None]) * b_rstd[:, None]
        _store_tile(DX, b_dx, o_n, f0 + o_c, m_n[:, None] & m_c[None, :], stride_dxn, stride_dxf)
