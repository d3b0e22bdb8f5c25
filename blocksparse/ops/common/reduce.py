"""Deterministic column sums of per-program partial results.

Kernels that reduce over tokens (layer norm's ``dg`` / ``db``, the LSTM gates' ``dbias``) let each
of their ``P`` programs write its own row of a float32 ``(P, M)`` buffer instead of adding into one
output with atomics; :func:`sum_rows_kernel` then adds the rows in a fixed order, so a gradient is
the same bit for bit on every run.

Bytes moved: ``P * M * 4`` read per buffer, ``M`` elements written.
"""
import triton
import triton.language as tl

#: Elements a program of :func:`sum_rows_kernel` holds per buffer (``BP * BM``).
SUM_TILE = 8192
#: Most partial rows one step loads (more rows loop).
MAX_BP = 512


@triton.jit
def sum_rows_kernel(
    PART_A, PART_B, OUT_A, OUT_B,
    P, M,
    HAS_B: tl.constexpr, BP: tl.constexpr, BM: tl.constexpr,
):
    # OUT_A[m] = sum_p PART_A[p, m] (OUT_B likewise), both partial buffers contiguous (P, M)
    i_m = tl.program_id(0)
    o_m = i_m * BM + tl.arange(0, BM)
    m_m = o_m < M
    b_a = tl.zeros((BM,), dtype=tl.float32)
    b_b = tl.zeros((BM,), dtype=tl.float32)
    for p0 in range(0, P, BP):
        o_p = p0 + tl.arange(0, BP)
        m = (o_p < P)[:, None] & m_m[None, :]
        o = o_p[:, None].to(tl.int64) * M + o_m[None, :]
        b_a += tl.sum(tl.load(PART_A + o, mask=m, other=0.0), 0)
        if HAS_B:
            b_b += tl.sum(tl.load(PART_B + o, mask=m, other=0.0), 0)
    tl.store(OUT_A + o_m, b_a.to(OUT_A.dtype.element_ty), mask=m_m)
    if HAS_B:
        tl.store(OUT_B + o_m, b_b.to(OUT_B.dtype.element_ty), mask=m_m)


def sum_rows_tile(P):
    """``(BP, BM)``: all partial rows in one step where they fit, ``SUM_TILE`` elements a program."""
    bp = min(triton.next_power_of_2(max(P, 1)), MAX_BP)
    return bp, sum_rows_width(bp)


def sum_rows_width(bp):
    """``BM``, the columns of a program that loads ``bp`` partial rows a step (narrow programs for
    many rows: more of them, so the reduction of a short row still fills the GPU)."""
    return max(16, SUM_TILE // bp)
