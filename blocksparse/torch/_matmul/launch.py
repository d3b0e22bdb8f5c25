"""The matmul kernels' launches on torch tensors: what to launch for each product and kernel
variant (a :class:`~blocksparse.torch._launch.KernelLaunch`, built once per plan), and direct calls
(read dims, allocate, launch through Triton) for the kernel tests and the GPU verification.

Operands of every launch, in order: the input activations (``x`` / ``dy``), the weight (or ``dy``
for updat), the output buffer.  Split reductions (``atomic`` / ``split > 1``) accumulate into a
zeroed float32 buffer that is cast to the output dtype at the end.  The compile arguments of the
ahead-of-time specs (:mod:`blocksparse.ops.matmul.aot`) follow these launches exactly.
"""
import torch
import triton

from ... import _env
from ...ops.matmul import configs
from ...ops.matmul.updat import updat_kernel
from ...ops.matmul.updat_tma import updat_tma_kernel
from ...ops.matmul.xprop import xprop_kernel
from ...ops.matmul.xprop_persistent import xprop_persistent_kernel
from ...ops.matmul.xprop_tma import xprop_tma_kernel
from .._launch import Descriptor, JitLaunch, KernelLaunch, Operand
from .._scratch import scratch

if _env.triton_interpret():
    from ...ops.common.interpreter import patch_bf16_dot

    patch_bf16_dot()

#: Kernels by (product family, variant).
KERNELS = {("xprop", "ptr"): xprop_kernel, ("xprop", "tma"): xprop_tma_kernel,
           ("updat", "ptr"): updat_kernel, ("updat", "tma"): updat_tma_kernel}
X, B, OUT, BIAS = 0, 1, 2, 3  # the operands' positions (the bias: fprop plans that add it)
WS, COUNTERS = 4, 5  # split reductions finished in the kernel: the zeroed workspace and ticket counters
DB = 6  # updat with the bias gradient: its per-slice column sums


def xprop_scratch(n, out_features, bs, cfg, tma):
    """(workspace float32 elements, ticket counters) of a ticket-reduced fprop / bprop call."""
    ns = bs // configs.output_slice(cfg, bs, tma)
    groups = triton.cdiv(out_features // bs, cfg.G)
    return n * out_features, triton.cdiv(n, cfg.BM) * groups * cfg.G * ns


def updat_scratch(blocks, bs, rows, cfg):
    """(workspace float32 elements, ticket counters) of a ticket-reduced updat (``rows`` of its
    ``updat_groups`` table)."""
    return blocks * bs * bs, rows * cfg.G


def tokens(t, axis):
    return t.shape[0] if axis == 1 else t.shape[1]


def activation_shape(n, features, axis):
    return (n, features) if axis == 1 else (features, n)


def dense_strides(shape):
    """Strides of a fresh row-major 2-D tensor of ``shape`` (as torch gives them)."""
    return (max(shape[1], 1), 1)


def _token_feature(strides, axis):
    """(token stride, feature stride) of activations with ``strides`` in either layout."""
    return tuple(strides) if axis == 1 else (strides[1], strides[0])


def _desc(operand, dtype, shape, strides, axis, tokens_block, features_block):
    """Descriptor over activations in storage order, tile [tokens, features] (or transposed)."""
    block = (tokens_block, features_block) if axis == 1 else (features_block, tokens_block)
    return Descriptor(operand, tuple(shape), tuple(strides), block, dtype)


def tma_ok(*tensors):
    """Whether tensor descriptors can address these tensors: row-major with 16-byte aligned rows,
    on a GPU with the tensor memory accelerator (sm_90+) or in Triton's interpreter."""
    for t in tensors:
        if t.stride(-1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
        if t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 9:
            return False
    return True


def transpose_blocks(w, pack=1):
    """Every block of the packed weight ``w`` transposed in place (``pack``: the layout's
    :attr:`~blocksparse.layout.Layout.packing`; each part of a stored block transposed where it lies)."""
    if pack == 1:
        return w.transpose(1, 2).contiguous()
    bs = w.shape[1] // pack
    return w.view(-1, pack, bs, pack, bs).transpose(2, 4).contiguous().view(w.shape)


def xprop_launch(variant, x_shape, x_strides, dtype, headers, entries, *, blocks, out_features, bs, axis, trans,
                 cfg, atomic, precision, bias=False, offsets=None, pack=1, count=None, programs=None):
    """fprop (``trans=False``) or bprop of ``dtype`` activations ``x_shape`` / ``x_strides``
    through the ``"ptr"`` or ``"tma"`` kernel; ``headers`` / ``entries``: the xprop table built
    with ``cfg.G``.  The output is float32 where ``atomic``.  ``bias``: the kernel adds a fourth
    operand (per output feature, ``dtype``) before storing (not with ``atomic``).  ``offsets``
    (the table's CSR over headers, on the device): split segments are reduced in the kernel
    through operands 4 and 5 (:data:`WS`, :data:`COUNTERS`, zeroed; :func:`xprop_scratch`), and
    the output takes ``dtype``.  ``blocks``: the layout's; ``pack``: its packing (the weight is
    ``(blocks / pack**2, pack * bs, pack * bs)``).  ``count`` (every segment's entries, where all hold
    as many and segment ``s`` starts at entry ``s * count``) with ``cfg.PERSIST``: the persistent
    kernel (:mod:`~blocksparse.ops.matmul.xprop_persistent`) over ``programs`` programs at most."""
    if bias and atomic:
        raise ValueError("a split (atomic) product cannot add the bias: its sums are not final in the kernel")
    if atomic and offsets is not None:
        raise ValueError("a split reduction is either atomic or finished in the kernel (offsets), not both")
    ticket = offsets is not None
    tickets = dict(WS=Operand(WS, torch.float32) if ticket else None,
                   COUNTERS=Operand(COUNTERS, torch.int32) if ticket else None, OFFSETS=offsets)
    n = x_shape[0] if axis == 1 else x_shape[1]
    y_shape = activation_shape(n, out_features, axis)
    y_strides = dense_strides(y_shape)
    y_dtype = torch.float32 if atomic else dtype
    segments = headers.shape[0]
    consts = dict(BS=bs, G=cfg.G, BM=cfg.BM, TRANS_W=trans, ATOMIC=atomic, PRECISION=precision, TICKET=ticket,
                  PACK=pack)
    # without a bias the kernel never reads BIAS: the input stands in (a valid pointer of its type)
    fused = dict(BIAS=Operand(BIAS if bias else X, dtype), has_bias=int(bias), **tickets)
    if variant == "ptr":
        args = dict(X=Operand(X, dtype), W=Operand(B, dtype), Y=Operand(OUT, y_dtype), HEADERS=headers,
                    ENTRIES=entries, N=n, OUT_FEATURES=out_features, num_segments=segments)
        x_n, x_f = _token_feature(x_strides, axis)
        y_n, y_f = _token_feature(y_strides, axis)
        args.update(stride_xn=x_n, stride_xf=x_f, stride_yn=y_n, stride_yf=y_f, **fused)
        bn = configs.output_slice(cfg, bs, tma=False)
        consts.update(KB=cfg.KB, BN=bn)
        grid = (segments * (bs // bn) * triton.cdiv(n, cfg.BM),)
    else:
        bk, bn = cfg.BK or bs, configs.output_slice(cfg, bs, tma=True)
        rows = pack * bs  # the weight viewed 2-D (blocks.packing)
        w_desc = Descriptor(B, (blocks * bs // pack, rows), (rows, 1), (bn, bk) if trans else (bk, bn), dtype)
        y_n, y_f = _token_feature(y_strides, axis)
        args = dict(x_desc=_desc(X, dtype, x_shape, x_strides, axis, cfg.BM, bk), w_desc=w_desc,
                    y_desc=_desc(OUT, y_dtype, y_shape, y_strides, axis, cfg.BM, bn), Y=Operand(OUT, y_dtype),
                    HEADERS=headers, ENTRIES=entries, num_segments=segments, N=n, OUT_FEATURES=out_features,
                    stride_yn=y_n, stride_yf=y_f, **fused)
        consts.update(BK=bk, BN=bn, X_T=axis == 0, UNROLL=cfg.UNROLL, PREFETCH=cfg.PREFETCH)
        grid = (segments * (bs // bn) * triton.cdiv(n, cfg.BM),)
        if persistent(cfg, count, atomic, ticket):
            yb = bn // 2 if cfg.SUBTILE else bn
            args.update(y_desc=_desc(OUT, y_dtype, y_shape, y_strides, axis, cfg.BM, yb), num_tiles=grid[0],
                        count=count)
            for name in ("Y", "N", "stride_yn", "stride_yf", "WS", "COUNTERS", "OFFSETS"):
                del args[name]
            consts = dict(BS=bs, BM=cfg.BM, BK=bk, BN=bn, X_T=axis == 0, TRANS_W=trans, PRECISION=precision,
                          PACK=pack, PREFETCH=cfg.PREFETCH, SUBTILE=cfg.SUBTILE)
            return KernelLaunch(xprop_persistent_kernel, (min(grid[0], programs),), args, consts, cfg.num_warps,
                                cfg.num_stages)
    return KernelLaunch(KERNELS[("xprop", variant)], grid, args, consts, cfg.num_warps, cfg.num_stages,
                        zero=(OUT,) if atomic else ())


def persistent(cfg, count, atomic, ticket):
    """Whether a TMA fprop / bprop of ``cfg`` runs the persistent kernel (``count``: the segments'
    common length, or None)."""
    return bool(cfg.PERSIST) and count is not None and cfg.G == 1 and not atomic and not ticket


def updat_launch(variant, x_shape, x_strides, dy_shape, dy_strides, dtype, groups, *, bs, axis, cfg, split,
                 precision, dw_dtype=torch.float32, ticket=False, pack=1, bias_first=None, out_features=None):
    """updat of ``dtype`` activations ``x`` and ``dy`` through the ``"ptr"`` or ``"tma"`` kernel
    into a ``dw_dtype`` buffer; ``groups`` is ``Layout.updat_groups(cfg.G)``.  Token slices
    (``split > 1``) are reduced by atomics into a zeroed float32 buffer, or where ``ticket`` in the
    kernel through operands 4 and 5 (:data:`WS`, :data:`COUNTERS`, zeroed; :func:`updat_scratch`).
    ``pack``: the layout's packing (where the kernel writes each block).  ``bias_first`` (the TMA
    kernel only; :func:`~blocksparse.ops.matmul.bias_grad.bias_first` of ``groups``, on the device):
    the bias gradient's token sums of every slice into operand 6 (:data:`DB`, float32
    ``(slices, out_features)``, written whole)."""
    n = x_shape[0] if axis == 1 else x_shape[1]
    per_split = triton.cdiv(triton.cdiv(n, split), cfg.BK) * cfg.BK
    grid = (groups.shape[0], triton.cdiv(n, per_split))
    ticket = ticket and split > 1
    atomic = split > 1 and not ticket
    consts = dict(BS=bs, G=cfg.G, BK=cfg.BK, ATOMIC=atomic, PRECISION=precision, TICKET=ticket, PACK=pack)
    tickets = dict(WS=Operand(WS, torch.float32) if ticket else None,
                   COUNTERS=Operand(COUNTERS, torch.int32) if ticket else None)
    if variant == "ptr":
        if bias_first is not None:
            raise ValueError("the bias gradient comes with the TMA updat kernel only (variant 'tma')")
        x_n, x_f = _token_feature(x_strides, axis)
        d_n, d_f = _token_feature(dy_strides, axis)
        args = dict(X=Operand(X, dtype), DY=Operand(B, dtype), DW=Operand(OUT, dw_dtype), GROUPS=groups, N=n,
                    tokens_per_split=per_split, stride_xn=x_n, stride_xf=x_f, stride_dn=d_n, stride_df=d_f,
                    **tickets)
    else:
        args = dict(x_desc=_desc(X, dtype, x_shape, x_strides, axis, cfg.BK, bs),
                    dy_desc=_desc(B, dtype, dy_shape, dy_strides, axis, cfg.BK, bs), DW=Operand(OUT, dw_dtype),
                    GROUPS=groups, tokens_per_split=per_split, N=n, **tickets,
                    DB=Operand(DB, torch.float32) if bias_first is not None else None, DB_FIRST=bias_first,
                    out_features=out_features if bias_first is not None else None)
        consts.update(X_T=axis == 0, BIAS_GRAD=bias_first is not None)
    return KernelLaunch(KERNELS[("updat", variant)], grid, args, consts, cfg.num_warps, cfg.num_stages,
                        zero=(OUT,) if atomic else ())


# --- direct calls: allocate, launch through Triton (kernel tests, GPU verification) ------------


def xprop(x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision, pack=1):
    """fprop (``trans=False``) or bprop; the TMA kernel where ``cfg`` asks for it and descriptors
    can address the tensors.  ``atomic`` must be true when any output group has several segments."""
    if trans and configs.bprop_pretransposes_weight(x.dtype == torch.float32):
        w, trans = transpose_blocks(w, pack), False
    launch = xprop_tma if cfg.TMA and tma_ok(x, w) else xprop_ptr
    return launch(x, w, headers, entries, out_features=out_features, bs=bs, axis=axis, trans=trans,
                  cfg=cfg, atomic=atomic, precision=precision, pack=pack)


def updat(x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype, pack=1):
    """updat; ``groups`` is ``Layout.updat_groups(cfg.G)``, ``split`` the token slices."""
    launch = updat_tma if cfg.TMA and tma_ok(x, dy) else updat_ptr
    return launch(x, dy, groups, w_shape=w_shape, bs=bs, axis=axis, cfg=cfg, split=split,
                  precision=precision, dw_dtype=dw_dtype, pack=pack)


def _xprop_direct(variant, x, w, headers, entries, *, out_features, bs, axis, trans, cfg, atomic, precision,
                  bias=None, offsets=None, pack=1, count=None):
    """``bias`` (fprop, per output feature): added by the kernel, after it where ``atomic``.
    ``offsets`` (the table's, on ``x``'s device): split segments reduced in the kernel instead of
    by atomics (``atomic`` False)."""
    n = tokens(x, axis)
    out = x.new_empty(activation_shape(n, out_features, axis), dtype=torch.float32 if atomic else x.dtype)
    fused = bias is not None and not atomic
    if n:  # the launch zero-fills a float32 buffer first
        operands = (x, w, out) + ((bias.to(x.dtype).contiguous(),) if fused else (x,))
        if offsets is not None:
            operands += scratch(x.device, *xprop_scratch(n, out_features, bs, cfg, variant == "tma"))
        JitLaunch(xprop_launch(variant, tuple(x.shape), x.stride(), x.dtype, headers, entries,
                               blocks=w.shape[0] * pack * pack, out_features=out_features, bs=bs, axis=axis,
                               trans=trans, cfg=cfg, atomic=atomic, precision=precision, bias=fused, offsets=offsets,
                               pack=pack, count=count, programs=cfg.PERSIST * _sms(x.device)))(operands)
    elif fused:
        fused = False  # nothing launched: the (empty) output takes the bias below
    out = _cast(out, x.dtype)
    if bias is None or fused:
        return out
    return out + (bias.to(out.dtype) if axis == 1 else bias.to(out.dtype)[:, None])


def _updat_direct(variant, x, dy, groups, *, w_shape, bs, axis, cfg, split, precision, dw_dtype, ticket=False,
                  pack=1, bias_first=None):
    """``ticket``: token slices reduced in the kernel instead of by atomics.  ``bias_first``
    (:func:`~blocksparse.ops.matmul.bias_grad.bias_first`'s marks, on the device; the TMA kernel):
    also the bias gradient, float32 -- ``(dw, db)``."""
    n = tokens(x, axis)
    atomic = (split > 1 and not ticket) or n == 0
    dw = x.new_empty(w_shape, dtype=torch.float32 if atomic else dw_dtype)
    out_features = dy.shape[1] if axis == 1 else dy.shape[0]
    db = None
    if n:  # the launch zero-fills a float32 buffer first
        operands = (x, dy, dw, x)
        operands += (scratch(x.device, *updat_scratch(w_shape[0] * pack * pack, bs, groups.shape[0], cfg)) if ticket
                     else (None, None))
        launch = updat_launch(variant, tuple(x.shape), x.stride(), tuple(dy.shape), dy.stride(), x.dtype, groups,
                              bs=bs, axis=axis, cfg=cfg, split=split, precision=precision, dw_dtype=dw.dtype,
                              ticket=ticket, pack=pack, bias_first=bias_first, out_features=out_features)
        if bias_first is not None:  # a row of column sums per token slice, each element written once
            db = x.new_empty((launch.grid[1], out_features), dtype=torch.float32)
            operands += (db,)
        JitLaunch(launch)(operands)
        db = None if db is None else db.sum(0)
    else:
        dw.zero_()  # no tokens: the gradient is zero
        db = None if bias_first is None else x.new_zeros((out_features,), dtype=torch.float32)
    dw = _cast(dw, dw_dtype)
    return dw if bias_first is None else (dw, db)


def xprop_ptr(x, w, headers, entries, **kwargs):
    """:func:`xprop` through :func:`xprop_kernel` (pointer loads, any GPU)."""
    return _xprop_direct("ptr", x, w, headers, entries, **kwargs)


def xprop_tma(x, w, headers, entries, **kwargs):
    """:func:`xprop` through :func:`xprop_tma_kernel` (needs :func:`tma_ok` tensors)."""
    return _xprop_direct("tma", x, w, headers, entries, **kwargs)


def updat_ptr(x, dy, groups, **kwargs):
    """:func:`updat` through :func:`updat_kernel` (pointer loads, any GPU)."""
    return _updat_direct("ptr", x, dy, groups, **kwargs)


def updat_tma(x, dy, groups, **kwargs):
    """:func:`updat` through :func:`updat_tma_kernel` (needs :func:`tma_ok` tensors)."""
    return _updat_direct("tma", x, dy, groups, **kwargs)


def _sms(device):
    """Streaming multiprocessors of ``device`` (4 in the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _cast(t, dtype):
    return t if t.dtype == dtype else t.to(dtype)
