"""Host-side state of the matmul products: layout handles, device tables and launch plans.

The custom ops take an integer *layout handle* rather than the layout's tables: ``torch.compile``
then sees only tensors and ints at the op boundary, and the tables are built eagerly, once per
device, inside the op.  Handles intern layouts: equal layouts share one handle, one set of tables
and one plan cache while an object that prepared it lives (a layout is a few kilobytes of numpy).

A :class:`Plan` is everything about one product that does not change between calls of the same
shape: its tile, split, tables, output shape, and a prepared launch -- a compiled spec of the
kernel library where one serves the call (sm_80+ GPUs, dense activations, 16-byte aligned
buffers, IEEE float32), else the Triton JIT with the tile tables' choice.  Plans are cached per
layout by (product, tokens, strides, dtype, device, alignment, precision, axis[, dW dtype]); a
call looks its plan up and runs it.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

import numpy as np
import torch
import triton

from ... import _env
from ...layout import Layout
from ...ops.common import rows
from ...ops.matmul import configs, grouping
from ...ops.matmul.configs import UpdatConfig, XpropConfig
from .. import _launch, _scratch
from .._registry import Registry
from . import launch as _kernels

#: SM count assumed off-GPU (Triton's interpreter), small so that tests exercise the splits.
INTERPRETER_SMS = 4
#: Blocks one few-token fprop / bprop program must run in series (16-bit, float32) before its
#: reduction is split over several programs.  Splits are finished in the kernel (tickets: no zero
#: fill, no cast, no host cost); on the H200 at N = 64 they gain GPU time from runs of about 16
#: blocks in 16 bits (bs 64: 0.89x the unsplit time at 16 blocks, 1.06x at 6) and from any run in
#: float32 (0.50-0.59x at 6 blocks and more; ``bench/results/raw/tune-tickets-h200.jsonl``).
SPLIT_MIN_RUN = {False: 12, True: 4}
#: Split reductions are finished in the kernel (:mod:`blocksparse.ops.matmul.ticket`) rather than by
#: float32 atomics into a zeroed buffer and a cast; the kernel library's ``ticket`` specs where it has
#: them.
TICKETS = True
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_KERNEL_NAMES = {"xprop": {"tma": "xprop_tma_kernel", "ptr": "xprop_kernel"},
                 "updat": {"tma": "updat_tma_kernel", "ptr": "updat_kernel"}}


@dataclass(eq=False)
class Plan:
    """How one product runs for one call shape; calling it runs it on ``(a, b)`` (``(x, w)``,
    ``(dy, w)`` or ``(x, dy)``) and returns the output.

    ``config``: the tile; ``max_segment``: xprop table segment length (None: one program per
    group); ``split``: updat token slices; ``runner``: the prepared launch (None without tokens);
    the kernel writes a buffer of ``out_shape`` and ``out_dtype``, zero-filled first where
    ``zero`` (split reductions by atomics: by the launch, in the runtime on the ahead-of-time
    path), cast to ``cast_to`` after where set; ``scratch``: the (workspace, counters) sizes of
    split reductions finished in the kernel (the call's zeroed scratch, :mod:`.._scratch`, as
    operands 4 and 5); ``pretranspose``: bprop reads the weight's blocks transposed beforehand;
    ``bias``: the kernel adds a bias (per output feature, in ``a``'s dtype) before it stores
    (fprop; not with atomics); ``transpose_inputs``: updat of ``(F, N)`` activations copied to
    ``(N, F)`` first, and run as that layout's product; ``pack``: the layout's packing (the
    weight's blocks as they lie in its storage); ``pad_tokens``: a product of 16-bit ``(F, N)``
    activations whose token count is not a multiple of 16 (:func:`_padded_tokens`), run on copies
    padded with zero tokens to this many (the same sums; fprop / bprop return the first ``N``
    tokens of the padded output, copied).
    """

    kind: str
    config: XpropConfig | UpdatConfig
    runner: object
    device: torch.device
    out_shape: tuple
    out_dtype: torch.dtype
    zero: bool = False
    cast_to: torch.dtype | None = None
    pretranspose: bool = False
    max_segment: int | None = None
    split: int = 1
    bias: bool = False
    transpose_inputs: bool = False
    scratch: tuple | None = None
    pack: int = 1
    pad_tokens: int = 0

    @property
    def path(self):
        """``"aot"`` (kernel library), ``"jit"`` (Triton) or ``"none"`` (nothing to launch)."""
        return self.runner.path if self.runner is not None else "none"

    @property
    def launches(self):
        """Kernels one call starts: the product, plus the weight transpose, the zero fill and the
        cast of split reductions where they apply."""
        return ((self.runner is not None) + self.pretranspose + self.zero + (self.cast_to is not None)
                + 2 * self.transpose_inputs + 2 * bool(self.pad_tokens))

    def __call__(self, a, b, bias=None, axis=1):
        """The product of ``a`` and ``b`` (plus ``bias`` per output feature of a fprop: by the kernel
        where :attr:`bias`, else to a split reduction's float32 sums before their cast; ``axis``: the
        output's feature axis)."""
        if self.pretranspose:
            b = _kernels.transpose_blocks(b, self.pack)
        if self.transpose_inputs:
            a = a.t().contiguous()
            if self.kind == "updat":
                b = b.t().contiguous()
        n = a.shape[1]
        if self.pad_tokens:
            a = copy_rows(a, self.pad_tokens)
            if self.kind == "updat":
                b = copy_rows(b, self.pad_tokens)
        if self.runner is not None:
            out = a.new_empty(self.out_shape, dtype=self.out_dtype)  # on a's device: the plan's
            operands = (a, b, out) if not self.bias else (a, b, out, bias.to(a.dtype).contiguous())
            if self.scratch is not None:
                operands = operands[:4] + (a,) * (4 - len(operands)) + _scratch.scratch(a.device, *self.scratch)
            self.runner(operands)  # zero-fills out first where the launch asks
        else:  # no tokens
            out = (torch.zeros if self.zero else torch.empty)(self.out_shape, dtype=self.out_dtype, device=self.device)
        if self.pad_tokens and self.kind != "updat":
            out = copy_rows(out, n)
        if self.transpose_inputs and self.kind != "updat":
            out = out.t().contiguous()
        if bias is not None and not self.bias:  # (in a's dtype first, as the kernels take it)
            bias = bias.to(a.dtype).to(out.dtype)
            out = out.add_(bias if axis == 1 else bias[:, None])
        return out if self.cast_to is None else out.to(self.cast_to)


#: Token counts from which a 16-bit ``(F, N)`` product whose count is not a multiple of 16 runs
#: otherwise (:data:`ODD_TOKENS`).
PAD_MIN_TOKENS = {"updat": configs.SMALL_N + 1, "fprop": configs.SMALL_N + 1, "bprop": configs.SMALL_N + 1}
#: How such a product runs, by kind: ``("pad", largest block size)`` (:attr:`Plan.pad_tokens`),
#: ``("transpose", ...)`` (on ``(N, F)`` copies, :attr:`Plan.transpose_inputs`) or ``(None, 0)`` (as it
#: is).  Timed on an H200 in two runs (bf16, 4096 x 4096 at d = 0.25, 4095 / 4097 tokens against
#: 4096; ``bench/results/raw/cn-odd-tokens-h200*.json``), padded over unpadded: fprop 0.51-0.65 /
#: 0.62-0.84 / 0.65-0.89 at blocks of 32 / 64 / 128; updat 0.68-0.69 at 32, but 0.74 then 1.25 at 64
#: and 1.09-1.55 at 128; bprop 1.4-3.1 (the copies' launches bound these calls on the host).
#: Transposed copies were slower everywhere (a transpose took 114 µs, the row copy 33-45).
ODD_TOKENS = {"fprop": ("pad", 128), "bprop": (None, 0), "updat": ("pad", 32)}


def copy_rows(t, cols):
    """A contiguous copy of the 2-D ``t`` (unit column stride) with rows of ``cols`` elements: zero
    padded or cut (:mod:`blocksparse.ops.common.rows`)."""
    out = t.new_empty((t.shape[0], cols))
    if out.numel():
        grid = (triton.cdiv(t.shape[0], rows.ROWS), triton.cdiv(cols, rows.COLS))
        rows.copy_rows_kernel[grid](t, out, t.shape[0], t.shape[1], cols, t.stride(0), cols,
                                    BR=rows.ROWS, BC=rows.COLS, num_warps=4)
    return out


def _padded_tokens(kind, a, axis):
    """The token count a plan pads ``(F, N)`` activations ``a`` to (0: none): the next multiple of
    16 where ``N`` is not one and at least :data:`PAD_MIN_TOKENS` (16-bit: float32 updat runs
    transposed).  Triton loads such rows element by element: the bf16 updat took 3-5x the time of
    16 more tokens on an H200, fprop 1.7-2.7x; zero tokens add nothing."""
    n, least = _kernels.tokens(a, axis), PAD_MIN_TOKENS.get(kind)
    if axis != 0 or not n % 16 or least is None or n < least or a.element_size() != 2:
        return 0
    return -(-n // 16) * 16


class LayoutState:
    """A layout with its memoised device tables and plans."""

    def __init__(self, layout):
        self.layout = layout
        self.plans = {}
        self._tables = {}
        self._lock = threading.Lock()

    def xprop_tables(self, kind, max_segment, group, device):
        """(headers, entries) of the fprop/bprop table on ``device``."""
        key = (kind, max_segment, group, str(device))
        if key not in self._tables:
            lut = getattr(self.layout, kind)(max_segment, group=group)
            self._tables[key] = (_to(lut.headers, device), _to(lut.entries, device))
        return self._tables[key]

    def xprop_offsets(self, kind, max_segment, group, device):
        """The fprop/bprop table's ``offsets`` (CSR over headers) on ``device``."""
        key = (kind, "offsets", max_segment, group, str(device))
        if key not in self._tables:
            self._tables[key] = _to(getattr(self.layout, kind)(max_segment, group=group).offsets, device)
        return self._tables[key]

    def updat_table(self, group, device):
        key = ("updat", group, str(device))
        if key not in self._tables:
            self._tables[key] = _to(self.layout.updat_groups(group), device)
        return self._tables[key]

    def coords(self, device):
        key = ("coords", str(device))
        if key not in self._tables:
            self._tables[key] = _to(self.layout.coords, device).long()
        return self._tables[key]

    def plan(self, key, kind, a, b, axis, precision, dw_dtype=None, aligned=True, bias=False):
        """The cached :class:`Plan` under ``key`` (see the module doc), built on first use from
        the call's tensors ``a``, ``b``."""
        plan = self.plans.get(key)
        if plan is None:
            with self._lock:
                plan = self.plans.get(key) or _build(self, kind, a, b, axis, precision, dw_dtype, aligned,
                                                     bias=bias)
                self.plans[key] = plan
        return plan


def _to(array, device):
    return torch.from_numpy(np.array(array, dtype=np.int32)).to(device)


def _aot_spec(kernels, arch, product, dtype, bs, axis, tma, atomic, n, max_tokens=None, dw16=False, ticket=False,
              pack=1):
    """Index of the library's spec for this product (the few-token tile for a few tokens, the TMA
    kernel first where it can run), or None.  ``max_tokens``: only specs of that token class;
    ``dw16``: an updat writing the activations' 16-bit dtype (else float32); ``ticket``: a split
    reduction finished in the kernel; ``pack``: the layout's packing."""
    names = _KERNEL_NAMES["updat" if product == "updat" else "xprop"]
    fields = dict(product=product, dtype=_DTYPE_NAMES.get(dtype), block_size=bs, axis=axis, atomic=atomic,
                  ticket=ticket, pack=pack)
    classes = (max_tokens,) if max_tokens is not None else ((configs.SMALL_N, 0) if n <= configs.SMALL_N else (0,))
    # pointer kernels: the one compiled for multiples of 16 tokens first, where n is one
    n16 = (True, False) if n % 16 == 0 and (axis == 0 or product == "updat") else (False,)  # where compiled
    for size in classes:
        for variant in ("tma", "ptr") if tma else ("ptr",):
            for wide in n16 if variant == "ptr" else (False,):
                index = kernels.find("matmul", arch, kernel=names[variant], max_tokens=size, n16=wide, dw16=dw16,
                                     **fields)
                if index is not None:
                    return index
    return None


def _aot_choice(kernels, arch, sms, layout, kind, a, b, axis, dw_dtype=None):
    """``(config, max_segment or split, spec index, ticket)`` of the kernel library for this call,
    or None where it has no spec (or the tensors are not dense): the specs are compiled for
    contiguous activations.  Tile, split and segments as the JIT path would choose them for that
    tile; a split runs the spec that finishes it in the kernel (``ticket``, where :data:`TICKETS`),
    else the atomic one, else none.  An unsplit 16-bit updat whose gradient takes the activations'
    dtype (``dw_dtype``) gets the spec that writes it (``dw16``) where there is one."""
    if kernels is None or a.dtype not in _DTYPE_NAMES or not (a.is_contiguous() and b.is_contiguous()):
        return None
    n, bs, tma = _kernels.tokens(a, axis), layout.block_size, _kernels.tma_ok(a, b)
    index = _aot_spec(kernels, arch, kind, a.dtype, bs, axis, tma, False, n, pack=layout.packing)
    if index is None:
        return None
    spec = kernels.specs[index]
    same = dict(tma=spec["tma"], n=n, max_tokens=spec["max_tokens"], pack=layout.packing)

    def split_spec():  # (index, ticket) of the spec finishing a split, or (None, False)
        # a ticket updat writes the activations' dtype: not for a float32 gradient of 16-bit activations
        ticket = TICKETS and (kind != "updat" or dw_dtype in (None, a.dtype))
        index = _aot_spec(kernels, arch, kind, a.dtype, bs, axis, atomic=False, ticket=True, **same) if ticket else None
        if index is not None:
            return index, True
        return _aot_spec(kernels, arch, kind, a.dtype, bs, axis, atomic=True, **same), False

    if kind != "updat":
        cfg = XpropConfig(**spec["config"])
        max_segment = _xprop_segments(layout, kind, cfg, n, sms, spec["tma"], _min_run(a.dtype))
        split, ticket = split_spec() if max_segment else (None, False)
        return (cfg, max_segment, split, ticket) if split is not None else (cfg, None, index, False)
    cfg = UpdatConfig(**spec["config"])
    split = configs.updat_split(cfg, n, layout.updat_groups(cfg.G).shape[0], sms)
    split_index, ticket = split_spec() if split > 1 else (None, False)
    if split_index is not None:
        return cfg, split, split_index, ticket
    if dw_dtype == a.dtype != torch.float32:
        twin = _aot_spec(kernels, arch, kind, a.dtype, bs, axis, atomic=False, dw16=True, **same)
        index = index if twin is None else twin
    return cfg, 1, index, False


def _min_run(dtype, interpret=False):
    """Blocks in series before a reduction splits: ``BLOCKSPARSE_SPLIT_MIN_RUN`` where set (read when
    a call shape is planned; ``1`` splits every run, for calls replayed in CUDA graphs, where only GPU
    time counts), else :data:`SPLIT_MIN_RUN`; 1 in the interpreter, so that tests exercise the splits."""
    if interpret:
        return 1
    value = _env.getenv("BLOCKSPARSE_SPLIT_MIN_RUN")
    if value is None:
        return SPLIT_MIN_RUN[dtype == torch.float32]
    try:
        run = int(value)
    except ValueError:
        run = 0
    if run < 1:
        raise ValueError(f"BLOCKSPARSE_SPLIT_MIN_RUN must be a positive integer (blocks); got {value!r}")
    return run


def _xprop_segments(layout, kind, cfg, n, sms, tma, min_run=1):
    """Table segment length that splits long reductions until about ``cfg.WAVES`` programs per SM
    run, or None (one program per output group; also where no group runs ``min_run`` blocks)."""
    lut = getattr(layout, kind)(None, group=cfg.G)
    slices = layout.block_size // configs.output_slice(cfg, layout.block_size, tma)
    programs = math.ceil(max(n, 1) / cfg.BM) * lut.num_segments * slices
    want = cfg.WAVES * sms
    if programs >= want or lut.max_count <= max(1, min_run - 1):
        return None
    return max(1, math.ceil(lut.max_count * programs / want))


def _jit_choice(layout, kind, n, dtype, interpret, sms, tma, axis):
    """``(config, max_segment or split)`` from the tile tables (the JIT path)."""
    bs = layout.block_size
    opts = dict(float32=dtype == torch.float32, tma=tma, interpret=interpret)
    if kind == "updat":
        cfg = configs.updat_config(bs, n, axis=axis, **opts)
        return cfg, configs.updat_split(cfg, n, layout.updat_groups(cfg.G).shape[0], sms)
    cfg = configs.xprop_config(bs, n, axis=axis, **opts)
    # structured layouts: one activation tile serves G output blocks (blocksparse.ops.matmul.grouping)
    cfg = grouping.grouped_config(cfg, layout, kind, float32=opts["float32"], interpret=interpret)
    # regular layouts: persistent programs over equally long columns (blocksparse.ops.matmul.xprop_persistent)
    persistent = configs.persistent_xprop_config(bs, n, float32=opts["float32"], axis=axis)
    if (persistent is not None and tma and not interpret and cfg.G == 1 and _env.persistent_xprop()
            and getattr(layout, kind)().uniform_count is not None):
        return persistent, None
    return cfg, _xprop_segments(layout, kind, cfg, n, sms, cfg.TMA, _min_run(dtype, interpret))


def _build(state, kind, a, b, axis, precision, dw_dtype, aligned, target=None, bias=False):
    """A new :class:`Plan` for ``kind`` on the call's tensors.  ``target``: ``(kernel library or
    None, DeviceInfo)`` to plan for; default: the call's GPU and the kernel library, or Triton's
    interpreter for CPU tensors.  ``bias`` (fprop): the kernel adds the bias where its sums are
    final (no split reduction; else the plan's ``bias`` is False and the caller adds it)."""
    layout, device = state.layout, a.device
    if kind == "updat" and axis == 0 and a.dtype == torch.float32 and _kernels.tokens(a, 0) > configs.SMALL_N:
        # float32 (F, N): the FMA product of token-contiguous tiles took 2.2-3.3x the (N, F) one on
        # an H200 (bench/README.md); two transposing copies cost ~0.1 of that.  Planned as (N, F).
        a_t, b_t = (t.new_empty((t.shape[1], t.shape[0])) for t in (a, b))
        return replace(_build(state, kind, a_t, b_t, 1, precision, dw_dtype, True, target), transpose_inputs=True)
    padded = _padded_tokens(kind, a, axis)
    how, largest = ODD_TOKENS.get(kind, (None, 0))
    if layout.block_size > largest:
        padded = 0
    if padded and how == "transpose":
        a_t = a.new_empty((a.shape[1], a.shape[0]))
        b_t = b.new_empty((b.shape[1], b.shape[0])) if kind == "updat" else b
        return replace(_build(state, kind, a_t, b_t, 1, precision, dw_dtype, True, target, bias), transpose_inputs=True)
    if padded and how == "pad":  # planned for the padded count
        a_p = a.new_empty((a.shape[0], padded))
        b_p = b.new_empty((b.shape[0], padded)) if kind == "updat" else b
        return replace(_build(state, kind, a_p, b_p, 0, precision, dw_dtype, True, target, bias), pad_tokens=padded)
    if target is None:
        target = (_launch.library(), _launch.device_info(a.get_device())) if a.is_cuda else (None, None)
    kernels, info = target
    arch, sms = (info.arch, info.sms) if info is not None else (0, INTERPRETER_SMS)
    n, bs = _kernels.tokens(a, axis), layout.block_size
    tma = aligned and _kernels.tma_ok(a, b) and (info is None or arch >= 90)
    aot = _aot_choice(kernels, arch, sms, layout, kind, a, b, axis, dw_dtype) if aligned else None
    if aot is not None:
        cfg, part, spec_index, ticket = aot
        tma = "_tma" in kernels.specs[spec_index]["kernel"]
    else:
        cfg, part = _jit_choice(layout, kind, n, a.dtype, not a.is_cuda, sms, tma, axis)
        spec_index, tma, ticket = None, tma and cfg.TMA, TICKETS
    max_segment, split = (None, part) if kind == "updat" else (part, 1)
    variant = "tma" if tma else "ptr"
    if kind == "updat":
        groups = state.updat_table(cfg.G, device)
        ticket = ticket and split > 1 and n > 0
        zero = (split > 1 and not ticket) or n == 0
        # the compiled specs write float32 (as the TensorFlow ops take it) except the dw16 and ticket
        # ones (the activations' dtype); the JIT writes dw_dtype directly
        compiled32 = spec_index is not None and not (kernels.specs[spec_index].get("dw16") or ticket)
        buffer = a.dtype if ticket and spec_index is not None else dw_dtype
        buffer = torch.float32 if zero or compiled32 else buffer
        launch = _kernels.updat_launch(variant, tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), a.dtype,
                                       groups, bs=bs, axis=axis, cfg=cfg, split=split,
                                       precision=precision, dw_dtype=buffer, ticket=ticket, pack=layout.packing)
        scratch = _kernels.updat_scratch(layout.blocks, bs, groups.shape[0], cfg) if ticket else None
        out = dict(out_shape=layout.w_shape, out_dtype=buffer, zero=zero, scratch=scratch,
                   cast_to=dw_dtype if buffer != dw_dtype else None)
    else:
        trans = kind == "bprop"
        pretranspose = trans and configs.bprop_pretransposes_weight(a.dtype == torch.float32)
        ticket = ticket and max_segment is not None
        atomic = max_segment is not None and not ticket
        headers, entries = state.xprop_tables(kind, max_segment, cfg.G, device)
        offsets = state.xprop_offsets(kind, max_segment, cfg.G, device) if ticket else None
        out_features = layout.C if trans else layout.K
        fused = bias and kind == "fprop" and not atomic
        count = getattr(layout, kind)(max_segment, group=cfg.G).uniform_count if cfg.PERSIST else None
        launch = _kernels.xprop_launch(variant, tuple(a.shape), a.stride(), a.dtype, headers, entries,
                                       blocks=layout.blocks, out_features=out_features, bs=bs, axis=axis,
                                       trans=trans and not pretranspose, cfg=cfg, atomic=atomic, precision=precision,
                                       bias=fused, offsets=offsets, pack=layout.packing, count=count,
                                       programs=cfg.PERSIST * sms)
        scratch = _kernels.xprop_scratch(n, out_features, bs, cfg, tma) if ticket else None
        out = dict(out_shape=_kernels.activation_shape(n, out_features, axis),
                   out_dtype=torch.float32 if atomic else a.dtype, zero=atomic, cast_to=a.dtype if atomic else None,
                   pretranspose=pretranspose, bias=fused, scratch=scratch, pack=layout.packing)
    runner = _launch.prepare(launch, a.get_device(), kernels, spec_index) if n else None
    if n and kind != "updat" and _gluon_serves(layout, a, axis, tma, arch):
        runner = GluonRunner(*state.xprop_tables(kind, None, 1, device), out_features=out_features, bs=bs,
                             trans=trans, pack=layout.packing)
        out.update(out_dtype=a.dtype, zero=False, cast_to=None, pretranspose=False, bias=bias and kind == "fprop",
                   scratch=None)
        max_segment = None
    return Plan(kind, cfg, runner, device, max_segment=max_segment, split=split, **out)


def _gluon_serves(layout, a, axis, tma, arch):
    """Whether ``BLOCKSPARSE_GLUON`` asks for the persistent Gluon fprop / bprop and it can serve the call."""
    from ...ops.matmul.xprop_gluon import TILES

    return (_env.gluon_xprop() and a.is_cuda and arch >= 90 and tma and axis == 1
            and a.dtype in (torch.bfloat16, torch.float16) and layout.block_size in TILES)


class GluonRunner:
    """A plan's launch through :func:`blocksparse.ops.matmul.xprop_gluon.xprop_gluon` (Triton's JIT)."""

    path = "jit"

    def __init__(self, headers, entries, **kwargs):
        from ...ops.matmul.xprop_gluon import split_empty

        self.headers, self.empty = split_empty(headers, kwargs["bs"])
        self.entries, self.kwargs = entries, kwargs

    def __call__(self, operands):
        from ...ops.matmul.xprop_gluon import xprop_gluon

        a, b, out = operands[:3]
        bias = operands[3] if len(operands) > 3 else None
        xprop_gluon(a, b, self.headers, self.entries, bias=bias, out=out, empty=self.empty, **self.kwargs)


_registry = Registry("layout", "the BlocksparseMatMul / layer")


def handle(layout: Layout, owner) -> int:
    """The handle of ``layout``: a digest of its content (equal layouts share one, in any process);
    its state lives at least as long as ``owner``."""
    parts = (layout.block_size, layout.z_order, layout.packing, layout.mask.shape,
             np.ascontiguousarray(layout.mask != 0).tobytes(), np.ascontiguousarray(layout.coords, np.int64).tobytes())
    return _registry.handle(parts, lambda: LayoutState(layout), owner)


def keep(layout_handle: int):
    """What keeps the state behind ``layout_handle`` findable while held (see :meth:`Registry.keep`)."""
    return _registry.keep(layout_handle)


def state(layout_handle: int) -> LayoutState:
    """The layout state behind a handle from :func:`handle`."""
    return _registry.state(layout_handle)
