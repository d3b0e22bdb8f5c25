"""Implicit-GEMM Triton kernel of the block-sparse convolution and of its input gradient, over the
tables of :mod:`.implicit`.

Activations are channels-last: read pixel ``(n, d, h, w)``, channel ``c`` at
``n * stride_n + d * stride_d + h * stride_h + w * stride_w + c`` (channels contiguous, so a
chunk of consecutive channels is one coalesced load per pixel); the written ``(pixels, K)``
contiguous.  1-D and 2-D convolutions run as 3-D ones with size-1 leading axes.

Per axis, tap ``t`` of written position ``o`` reads position ``o * step - pad + t * dil`` (the
convolution) or, ``TRANSPOSED`` (its input gradient), ``(o + pad - t * dil) / step`` where that
is a whole number: the taps that land between strided positions read nothing.

Program ``pid`` computes output tile ``pid % tiles`` of pixel tile ``pid // tiles``: the programs
that run together share their pixels, so the input they read overlaps in L2.  Each program walks
its column's steps (tap x chunk of input channels) in one flat loop -- one ``[BM, BK] @ [BK, BN]``
product a step, which the compiler can pipeline -- with the input address of each output pixel
computed per tap and masked where the tap falls into the padding.

``PREFETCH`` (a tuning choice): each step's table row is read by the step before, so the step's
loads wait on no table load of their own; compiled for sm_90, the pixels' and the filter's tiles
then get ``num_stages`` shared-memory buffers each where the plain walk gets 2.  The pixels' tile,
gathered under the padding mask, is copied asynchronously only where the read tensor's strides
are multiples of 16 elements (the JIT's specialisation; every channel count the benchmark uses);
otherwise its rows' alignment is unknown and it is loaded in step.

Bytes: each tile reads its pixels' present input channels once per tap (mostly from L2 after the
first tap) and the column's packed filter; writes its ``[BM, BN]`` output once.  Accumulation is
float32; the output takes its buffer's dtype.
"""
import triton
import triton.language as tl

from ... import _env

#: Tile shapes tried on a GPU (``BM`` output pixels; ``BN`` / ``BK`` come from the plan), tuned per
#: pixel count and tile table; the interpreter takes the first only.  Few, and timed briefly: every
#: layout and batch size tunes anew, and each config compiles per (tile sizes, dtype, direction).
CONFIGS = [
    triton.Config({"BM": 128}, num_warps=4, num_stages=3),
    triton.Config({"BM": 128}, num_warps=8, num_stages=3),
    triton.Config({"BM": 64}, num_warps=4, num_stages=4),
    # the step table read one step ahead: num_stages filter buffers instead of 2 (timed in
    # bench/results/conv-implicit-h200-prefetch.md; the GPU picks per layout)
    triton.Config({"BM": 128, "PREFETCH": True}, num_warps=4, num_stages=3),
    triton.Config({"BM": 64, "PREFETCH": True}, num_warps=4, num_stages=4),
]
if _env.triton_interpret():
    CONFIGS = [triton.Config({"BM": 32}, num_warps=4, num_stages=1)]


def _tuning_bench(fn, quantiles):
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


@triton.jit
def _step(STEPS, i_s, valid, ALIGN: tl.constexpr):
    """Row ``i_s`` of the step table: (tap, first channel, channel count, filter row); zeros where
    not ``valid`` (nothing read)."""
    p_step = STEPS + i_s * 4
    tap = tl.load(p_step, mask=valid, other=0)
    c_first = tl.multiple_of(tl.load(p_step + 1, mask=valid, other=0), ALIGN)
    c_count = tl.multiple_of(tl.load(p_step + 2, mask=valid, other=0), ALIGN)
    return tap, c_first, c_count, tl.multiple_of(tl.load(p_step + 3, mask=valid, other=0), ALIGN)


@triton.jit
def _tap_pixels(X, p_n, tap, c_first, c_count, o_c, m_m, o_id, o_ih, o_iw, ID, IH, IW, stride_d, stride_h,
                stride_w, step_d, step_h, step_w, dil_d, dil_h, dil_w, taps_h, taps_w, TRANSPOSED: tl.constexpr):
    """The ``[BM, BK]`` read pixels of ``tap``: channels ``c_first ..``, zeros in the padding."""
    t_d, t_h, t_w = (tap // (taps_h * taps_w)) * dil_d, ((tap // taps_w) % taps_h) * dil_h, (tap % taps_w) * dil_w
    if TRANSPOSED:
        j_d, j_h, j_w = o_id - t_d, o_ih - t_h, o_iw - t_w
        i_id, i_ih, i_iw = j_d // step_d, j_h // step_h, j_w // step_w
        m_x = m_m & (j_d >= 0) & (j_h >= 0) & (j_w >= 0) & (i_id * step_d == j_d) & (i_ih * step_h == j_h)
        m_x = m_x & (i_iw * step_w == j_w)
    else:
        i_id, i_ih, i_iw = o_id + t_d, o_ih + t_h, o_iw + t_w
        m_x = m_m & (i_id >= 0) & (i_ih >= 0) & (i_iw >= 0)
    m_x = m_x & (i_id < ID) & (i_ih < IH) & (i_iw < IW)
    p_x = p_n + i_id.to(tl.int64) * stride_d + i_ih.to(tl.int64) * stride_h + i_iw.to(tl.int64) * stride_w
    m_c = o_c < c_count
    return tl.load(p_x[:, None] + (c_first + o_c)[None, :], mask=m_x[:, None] & m_c[None, :], other=0.0)


@triton.jit
def _tap_product(X, W, p_n, tap, c_first, c_count, w_row, position, width, o_c, o_k, m_k, m_m,
                 o_id, o_ih, o_iw, ID, IH, IW, stride_d, stride_h, stride_w, step_d, step_h, step_w,
                 dil_d, dil_h, dil_w, taps_h, taps_w, PRECISION: tl.constexpr, TRANSPOSED: tl.constexpr):
    """One step's product: the ``[BM, BK]`` input pixels of ``tap`` (channels
    ``c_first ..``, masked in the padding) times the ``[BK, BN]`` filter rows from ``w_row``."""
    b_x = _tap_pixels(X, p_n, tap, c_first, c_count, o_c, m_m, o_id, o_ih, o_iw, ID, IH, IW, stride_d, stride_h,
                      stride_w, step_d, step_h, step_w, dil_d, dil_h, dil_w, taps_h, taps_w, TRANSPOSED)
    m_c = o_c < c_count
    p_w = W + w_row + position + o_c[:, None] * width + o_k[None, :]
    b_w = tl.load(p_w, mask=m_c[:, None] & m_k[None, :], other=0.0)
    return tl.dot(b_x, b_w, input_precision=PRECISION)  # [BM, BK] @ [BK, BN] -> [BM, BN]


@triton.jit
def _pixel_tile(X, i_m, pixels, OD, OH, OW, stride_n, step_d, step_h, step_w, pad_d, pad_h, pad_w,
                BM: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Written pixel tile ``i_m``: its pixels and mask, the read tensor's image of each pixel, and the
    read position of tap 0 (transposed: before the division by the step); tap ``(t, r, s)`` moves it
    by ``(t * dil_d, r * dil_h, s * dil_w)``, forward (transposed: backward)."""
    o_m = i_m * BM + tl.arange(0, BM)
    m_m = o_m < pixels
    o_w = o_m % OW
    o_h = (o_m // OW) % OH
    o_d = (o_m // (OW * OH)) % OD
    o_n = o_m // (OW * OH * OD)
    if TRANSPOSED:
        o_id, o_ih, o_iw = o_d + pad_d, o_h + pad_h, o_w + pad_w
    else:
        o_id, o_ih, o_iw = o_d * step_d - pad_d, o_h * step_h - pad_h, o_w * step_w - pad_w
    return o_m, m_m, X + o_n.to(tl.int64) * stride_n, o_id, o_ih, o_iw


@triton.autotune(CONFIGS, key=["pixels", "tiles", "K", "BN", "BK"], do_bench=_tuning_bench)
@triton.jit
def conv_implicit_kernel(
    X, W, Y, STEPS, TILES,
    tiles, pixels, K,
    ID, IH, IW, OD, OH, OW,  # read and written spatial sizes
    stride_n, stride_d, stride_h, stride_w,  # memory strides of the read tensor (its channel stride is 1)
    step_d, step_h, step_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w, taps_h, taps_w,  # the convolution's
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ALIGN: tl.constexpr,
    PRECISION: tl.constexpr, TRANSPOSED: tl.constexpr, PREFETCH: tl.constexpr = False,
):
    i_pid = tl.program_id(0)
    i_t, i_m = i_pid % tiles, i_pid // tiles
    p_tile = TILES + i_t * 6
    step_lo, step_hi = tl.load(p_tile), tl.load(p_tile + 1)
    # every channel, count and offset of the tables is a multiple of ALIGN: vector loads and stores
    k_first, k_count = tl.multiple_of(tl.load(p_tile + 2), ALIGN), tl.multiple_of(tl.load(p_tile + 3), ALIGN)
    position, width = tl.multiple_of(tl.load(p_tile + 4), ALIGN), tl.multiple_of(tl.load(p_tile + 5), ALIGN)

    o_m, m_m, p_n, o_id, o_ih, o_iw = _pixel_tile(X, i_m, pixels, OD, OH, OW, stride_n, step_d, step_h, step_w,
                                                  pad_d, pad_h, pad_w, BM, TRANSPOSED)

    o_k = tl.arange(0, BN)
    m_k = o_k < k_count
    o_c = tl.arange(0, BK)
    b_acc = tl.zeros([BM, BN], dtype=tl.float32)
    if PREFETCH:  # each step's table row read by the step before (see the module docstring)
        n_tap, n_cf, n_cc, n_wr = _step(STEPS, step_lo, step_lo < step_hi, ALIGN)
        for i_s in range(step_lo, step_hi):
            tap, c_first, c_count, w_row = n_tap, n_cf, n_cc, n_wr
            n_tap, n_cf, n_cc, n_wr = _step(STEPS, i_s + 1, i_s + 1 < step_hi, ALIGN)
            b_acc += _tap_product(X, W, p_n, tap, c_first, c_count, w_row, position, width, o_c, o_k, m_k,
                                 m_m, o_id, o_ih, o_iw, ID, IH, IW, stride_d, stride_h, stride_w, step_d, step_h,
                                 step_w, dil_d, dil_h, dil_w, taps_h, taps_w, PRECISION, TRANSPOSED)
    else:
        for i_s in range(step_lo, step_hi):
            p_step = STEPS + i_s * 4
            tap, c_first = tl.load(p_step), tl.multiple_of(tl.load(p_step + 1), ALIGN)
            c_count, w_row = tl.multiple_of(tl.load(p_step + 2), ALIGN), tl.multiple_of(tl.load(p_step + 3), ALIGN)
            b_acc += _tap_product(X, W, p_n, tap, c_first, c_count, w_row, position, width, o_c, o_k, m_k,
                                 m_m, o_id, o_ih, o_iw, ID, IH, IW, stride_d, stride_h, stride_w, step_d, step_h,
                                 step_w, dil_d, dil_h, dil_w, taps_h, taps_w, PRECISION, TRANSPOSED)
    p_y = Y + o_m[:, None].to(tl.int64) * K + (k_first + o_k)[None, :]
    tl.store(p_y, b_acc.to(Y.dtype.element_ty), mask=m_m[:, None] & m_k[None, :])
