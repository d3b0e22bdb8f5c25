"""The filter gradient of the implicit-GEMM convolution over its present blocks only (not yet the
default: :data:`SPARSE_WGRAD_MAX_DENSITY`).

The forward's tables (:mod:`.implicit`) list, per output-channel tile, the steps of its column: a
tap and a chunk of input channels, at a row of the packed filter.  The gradient of that
``[BK, BN]`` slice of the packed filter is ``sum over written pixels p of x_tap[p, chunk]^T
dy[p, tile]``: one *item* ``(tile, step)`` (:func:`wgrad_items`) is one such product, reduced over
the pixels.  Program ``(item, split)`` takes the pixel tiles ``split, split + splits, ...`` and writes
its float32 partial sum to row ``split`` of a ``(splits, packed size)`` buffer (every element of a
row written by exactly one program: no zero fill, no atomics); the rows are summed after
(deterministic), and the packed gradient scattered to the flat filter's order by the plan's
``weight`` table.  The pixels' tile is gathered as the forward gathers it (``_tap_pixels``), the
output gradient's is ``[BM, BN]`` rows of the channels-last ``dy``.

Work is ``prod(taps) x present channel pairs x pixels`` multiply-adds, the density's share of the
dense filter gradient's.
"""
import numpy as np
import triton
import triton.language as tl

from ... import _env
from .implicit_gemm import _pixel_tile, _tap_pixels

__all__ = ["SPARSE_WGRAD_MAX_DENSITY", "conv_wgrad_kernel", "wgrad_items", "wgrad_splits", "worth_sparse_wgrad",
           "WGRAD_BM", "WGRAD_STAGES", "WGRAD_WARPS"]

#: The filter gradient's choice: ``narrowest block width -> largest channel density`` at which the
#: implicit path takes this kernel rather than cuDNN's dense masked ``convolution_backward``.  All
#: zeros (never) until measured on a GPU; looked up like :data:`.implicit.IMPLICIT_MAX_DENSITY`.
SPARSE_WGRAD_MAX_DENSITY = {32: 0.0, 64: 0.0, 128: 0.0}
#: Written pixels a step of the reduction.
WGRAD_BM = 64
#: Warps and pipeline stages of a program.
WGRAD_WARPS, WGRAD_STAGES = 4, 3


def worth_sparse_wgrad(plan, density):
    """Whether the implicit path computes its filter gradient with :func:`conv_wgrad_kernel`: as
    ``BLOCKSPARSE_CONV_WGRAD`` says (``sparse`` / ``dense``), else (``auto``) as the table says."""
    choice = _env.conv_wgrad()
    if choice != "auto":
        return plan is not None and choice == "sparse"
    widths = [w for w in SPARSE_WGRAD_MAX_DENSITY if plan is not None and w <= plan.width]
    return bool(widths) and density <= SPARSE_WGRAD_MAX_DENSITY[max(widths)]


def wgrad_items(plan):
    """``(items, 2)`` int32: ``(tile, step)`` of every product of the filter gradient."""
    items = [(t, s) for t, (lo, hi) in enumerate(plan.tiles[:, :2].tolist()) for s in range(lo, hi)]
    return np.array(items, dtype=np.int32).reshape(-1, 2)


def wgrad_splits(items, pixels, sms, block_m=WGRAD_BM):
    """Pixel splits of the reduction: enough programs for about four a SM, at most one a pixel tile."""
    return max(1, min(triton.cdiv(pixels, block_m), triton.cdiv(4 * sms, max(items, 1))))


@triton.jit
def conv_wgrad_kernel(
    X, DY, PART, STEPS, TILES, ITEMS,
    size, pixels, K,
    ID, IH, IW, OD, OH, OW,  # input and output spatial sizes
    stride_n, stride_d, stride_h, stride_w,  # memory strides of the input (its channel stride is 1)
    step_d, step_h, step_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w, taps_h, taps_w,  # the convolution's
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ALIGN: tl.constexpr, PRECISION: tl.constexpr,
):
    i_item, i_split = tl.program_id(0), tl.program_id(1)
    splits = tl.num_programs(1)
    i_t, i_s = tl.load(ITEMS + i_item * 2), tl.load(ITEMS + i_item * 2 + 1)
    p_tile, p_step = TILES + i_t * 6, STEPS + i_s * 4
    k_first, k_count = tl.multiple_of(tl.load(p_tile + 2), ALIGN), tl.multiple_of(tl.load(p_tile + 3), ALIGN)
    position, width = tl.multiple_of(tl.load(p_tile + 4), ALIGN), tl.multiple_of(tl.load(p_tile + 5), ALIGN)
    tap, c_first = tl.load(p_step), tl.multiple_of(tl.load(p_step + 1), ALIGN)
    c_count, w_row = tl.multiple_of(tl.load(p_step + 2), ALIGN), tl.multiple_of(tl.load(p_step + 3), ALIGN)
    o_k = tl.arange(0, BN)
    m_k = o_k < k_count
    o_c = tl.arange(0, BK)
    b_acc = tl.zeros([BK, BN], dtype=tl.float32)
    for i_m in range(i_split, tl.cdiv(pixels, BM), splits):
        o_m, m_m, p_n, o_id, o_ih, o_iw = _pixel_tile(X, i_m, pixels, OD, OH, OW, stride_n, step_d, step_h, step_w,
                                                      pad_d, pad_h, pad_w, BM, False)
        b_x = _tap_pixels(X, p_n, tap, c_first, c_count, o_c, m_m, o_id, o_ih, o_iw, ID, IH, IW, stride_d,
                          stride_h, stride_w, step_d, step_h, step_w, dil_d, dil_h, dil_w, taps_h, taps_w, False)
        p_dy = DY + o_m[:, None].to(tl.int64) * K + (k_first + o_k)[None, :]
        b_dy = tl.load(p_dy, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_acc += tl.dot(tl.trans(b_x), b_dy, input_precision=PRECISION)  # [BK, BM] @ [BM, BN]
    p_part = PART + i_split.to(tl.int64) * size + w_row + position + o_c[:, None] * width + o_k[None, :]
    tl.store(p_part, b_acc, mask=(o_c < c_count)[:, None] & m_k[None, :])
