"""updat: the weight gradient ``dw[b] = x[:, c].T @ dy[:, k]`` for every block ``b = (c, k)``.

One program owns one run of the layout core's ``updat_groups(G)`` table -- up to ``G`` blocks of
one layout row ``c`` -- and one slice of the tokens.  It computes the transposed gradients stacked
along rows, ``[G*BS, BS] = dy[:, k_0..k_{G-1}].T @ x[:, c]``, so the ``[BK, BS]`` tile of ``x``
it loads serves ``G`` blocks and the matrix units see ``M = G*BS`` rows.

``PACK``: the weight's packing (:mod:`.packing`): where ``dw`` is written.
Token slices (``tokens_per_split < N``) are reduced by float32 atomics into a zeroed buffer
(``ATOMIC``), or in the kernel (``TICKET``: through ``WS`` / ``COUNTERS``, one ticket per table row;
see :mod:`.ticket`), which writes ``DW`` in its own dtype.
"""
import triton
import triton.language as tl

from .packing import block_offset
from .ticket import add_part


@triton.jit
def updat_kernel(
    X, DY, DW, GROUPS,
    N, tokens_per_split,
    stride_xn, stride_xf, stride_dn, stride_df, WS, COUNTERS,
    BS: tl.constexpr, G: tl.constexpr, BK: tl.constexpr,
    ATOMIC: tl.constexpr, PRECISION: tl.constexpr, TICKET: tl.constexpr = False, PACK: tl.constexpr = 1,
):
    i_g = tl.program_id(0)
    i_s = tl.program_id(1)
    row = GROUPS + i_g * (1 + 2 * G)
    c = tl.load(row).to(tl.int64)
    o_o = tl.arange(0, G * BS)                       # stacked output rows: (j, k-feature)
    k = tl.load(row + 1 + o_o // BS).to(tl.int64)      # [G*BS] layout column of each row
    blk = tl.load(row + 1 + G + o_o // BS).to(tl.int64)
    m_o = blk >= 0
    # feature of dy for each stacked row; hint: runs of BS starting at multiples of BS
    o_dk = tl.max_contiguous(tl.multiple_of(k * BS + o_o % BS, BS), BS)
    o_c = c * BS + tl.arange(0, BS)                    # features of x

    n_lo = i_s * tokens_per_split
    n_hi = tl.minimum(n_lo + tokens_per_split, N)
    acc = tl.zeros((G * BS, BS), dtype=tl.float32)
    for n0 in range(n_lo, n_hi, BK):
        o_n = n0 + tl.arange(0, BK)
        m_n = o_n < n_hi
        b_dy = tl.load(DY + o_n[None, :].to(tl.int64) * stride_dn + o_dk[:, None] * stride_df,
                       mask=m_o[:, None] & m_n[None, :], other=0.0)
        b_x = tl.load(X + o_n[:, None].to(tl.int64) * stride_xn + o_c[None, :] * stride_xf,
                      mask=m_n[:, None], other=0.0)
        # [G*BS, BK] @ [BK, BS] -> [G*BS, BS]
        acc = tl.dot(b_dy, b_x, acc, input_precision=PRECISION)

    # acc[j*BS + kk, cc] = dw[blk_j][cc, kk]
    o_cc = tl.arange(0, BS)
    offsets = block_offset(blk, BS, PACK)[:, None] + o_cc[None, :] * (PACK * BS) + (o_o % BS)[:, None]
    p_dw = DW + offsets
    if ATOMIC:
        tl.atomic_add(p_dw, acc, mask=m_o[:, None], sem="relaxed")
    else:
        last = True
        if TICKET:  # the last slice to finish writes dW (see .ticket)
            p_ws = WS + offsets
            last, acc = add_part(acc, p_ws, m_o[:, None], COUNTERS + i_g, tl.num_programs(1))
        if last:
            tl.store(p_dw, acc.to(DW.dtype.element_ty), mask=m_o[:, None])
