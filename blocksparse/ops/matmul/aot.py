"""The matmul family's ahead-of-time registration (see :mod:`blocksparse.aot.family`): its specs,
their kernels, what ``triton.compile`` gets for each (signature, constexprs, hints) and the fields
that select them at run time.

The compile arguments mirror the JIT launches of :mod:`blocksparse.torch._matmul.launch` (same
kernels, tiles and tensor-descriptor blocks).  Where the JIT specialises on the values it is given -- a stride of 1
becomes a constant, 16-byte aligned pointers and multiples of 16 get divisibility hints -- these fix
what holds for every call of the op library: activations are dense and row-major, so the feature
stride (axis 1) or the token stride (axis 0) is 1; buffers are 16-byte aligned (the runtime checks);
feature counts are multiples of the block size.  The callers (the PyTorch launch plans,
``src/ops/matmul.c`` for the TensorFlow ops) pass the remaining arguments; the runtime checks the
alignment hints at every launch.
"""
from __future__ import annotations

from dataclasses import asdict, replace

from ...aot.family import CompileArgs
from ..common.aot import signature
from .configs import AotSpec, aot_specializations, output_slice

__all__ = ["specializations", "kernel", "compile_args", "fields", "leaner", "kernel_function", "PRECISION"]

#: float32 products run in IEEE precision (no TF32), as the PyTorch frontend's default.
PRECISION = "ieee"


def specializations(archs):
    """Every matmul spec for ``archs``: :func:`.configs.aot_specializations`."""
    return aot_specializations(tuple(archs))


def kernel(spec: AotSpec):
    """The ``@triton.jit`` function ``spec`` compiles."""
    return kernel_function(spec.kernel)


def fields(spec: AotSpec):
    """What selects ``spec`` at run time (the manifest's record; scalars are C keys too):
    product, dtype, block size, axis, kernel, atomics, the tables' ``G``, whether bprop transposes
    weight tiles itself, TMA, the resolved tile (``bm``, ``bk``, ``bn``; 0 where unused), ``waves``,
    ``max_tokens`` (the few-token tiles: calls of at most this many tokens; 0: any), ``n16`` (token
    counts that are multiples of 16),
    ``dw16`` (updat writing the activations' 16-bit dtype), ``ticket`` (split reductions finished in
    the kernel), ``pack`` (the weight's packing) and the whole ``config``."""
    cfg, bs = spec.config, spec.block_size
    if spec.product == "updat":
        bm, bk, bn = 0, cfg.BK, 0
    else:
        bm, bk, bn = cfg.BM, (cfg.BK or bs) if spec.tma else bs, output_slice(cfg, bs, spec.tma)
    return {"product": spec.product, "dtype": spec.dtype, "block_size": bs, "axis": spec.axis,
            "kernel": spec.kernel, "atomic": spec.atomic, "group": spec.group, "trans_w": spec.trans_w,
            "tma": spec.tma, "bm": bm, "bk": bk, "bn": bn, "waves": cfg.WAVES, "max_tokens": spec.max_tokens,
            "n16": spec.n16, "dw16": spec.dw16, "ticket": spec.ticket, "pack": spec.pack, "config": asdict(cfg)}


def leaner(spec: AotSpec):
    """``spec`` with a tile needing less shared memory (for PTX that must fit GPUs the build does
    not know): one pipeline stage fewer down to two, then half the tokens per step (``BM`` of
    fprop / bprop, ``BK`` of updat) down to 16, then a single stage; None past that.  The tables'
    ``G`` stays: the callers build the same tables for any tile."""
    cfg = spec.config
    tokens = "BK" if spec.product == "updat" else "BM"
    if cfg.num_stages > 2:
        return replace(spec, config=replace(cfg, num_stages=cfg.num_stages - 1))
    if getattr(cfg, tokens) > 16:
        return replace(spec, config=replace(cfg, **{tokens: getattr(cfg, tokens) // 2}))
    if cfg.num_stages > 1:
        return replace(spec, config=replace(cfg, num_stages=1))
    return None


def kernel_function(name):
    """The ``@triton.jit`` function called ``name``."""
    from . import updat, updat_tma, xprop, xprop_tma

    for module in (xprop, xprop_tma, updat, updat_tma):
        if hasattr(module, name):
            return getattr(module, name)
    raise ValueError(f"no Triton kernel named {name!r} in blocksparse.ops.matmul")


def _desc(dtype, block, transposed=False):
    """Type of a tensor-descriptor parameter whose ``block`` is given as [tokens, features]."""
    rows, cols = reversed(block) if transposed else block
    return f"tensordesc<{dtype}[{rows}, {cols}]>"


def _strides(axis, *tensors, n16=False):
    """(unit, wide) parameter names of the activations ``tensors`` (``"x"`` -> stride_xn,
    stride_xf): ``unit`` strides are 1; ``wide`` ones are a multiple of 16 -- a feature count
    (axis 1), the token count of an ``n16`` spec (axis 0), and ``N`` itself of an ``n16`` spec."""
    unit = [f"stride_{t}{'f' if axis == 1 else 'n'}" for t in tensors]
    tokens = ["N"] if n16 else []
    if axis == 1:
        return unit, [f"stride_{t}n" for t in tensors] + tokens
    return unit, [f"stride_{t}f" for t in tensors] + tokens if n16 else []


#: The scratch of split reductions finished in the kernel (null where a spec does not finish them;
#: 16-byte aligned: fresh allocations and device tables), vectorised atomics need the hint.
_TICKET_TYPES = {"WS": "*fp32", "COUNTERS": "*i32", "OFFSETS": "*i32"}


def _xprop(spec):
    t, cfg, bs = spec.dtype, spec.config, spec.block_size
    out = "fp32" if spec.atomic else t
    trans = spec.trans_w
    consts = dict(BS=bs, G=cfg.G, BM=cfg.BM, TRANS_W=trans, ATOMIC=spec.atomic, PRECISION=PRECISION,
                  TICKET=spec.ticket, PACK=spec.pack)
    if spec.kernel == "xprop_kernel":
        types = {"X": f"*{t}", "W": f"*{t}", "Y": f"*{out}", "HEADERS": "*i32", "ENTRIES": "*i32",
                 "N": "i32", "OUT_FEATURES": "i32", "num_segments": "i32",
                 "stride_xn": "i32", "stride_xf": "i32", "stride_yn": "i32", "stride_yf": "i32",
                 "BIAS": f"*{t}", "has_bias": "i32", **_TICKET_TYPES}
        unit, wide = _strides(spec.axis, "x", "y", n16=spec.n16)
        divisible = {"X", "W", "Y", "HEADERS", "ENTRIES", "OUT_FEATURES", *_TICKET_TYPES, *wide}
        consts.update(KB=cfg.KB, BN=output_slice(cfg, bs, tma=False))
    else:
        bk, bn = cfg.BK or bs, output_slice(cfg, bs, tma=True)
        x_t = spec.axis == 0
        types = {"x_desc": _desc(t, [cfg.BM, bk], x_t),
                 "w_desc": _desc(t, [bn, bk] if trans else [bk, bn]),
                 "y_desc": _desc(out, [cfg.BM, bn], x_t),
                 "Y": f"*{out}", "HEADERS": "*i32", "ENTRIES": "*i32",
                 "num_segments": "i32", "N": "i32", "OUT_FEATURES": "i32",
                 "stride_yn": "i32", "stride_yf": "i32", "BIAS": f"*{t}", "has_bias": "i32", **_TICKET_TYPES}
        consts.update(BK=bk, BN=bn, X_T=x_t, UNROLL=cfg.UNROLL, PREFETCH=cfg.PREFETCH)
        unit, wide = _strides(spec.axis, "y")
        divisible = {"Y", "HEADERS", "ENTRIES", "OUT_FEATURES", *_TICKET_TYPES, *wide}
    return types, consts | {name: 1 for name in unit}, divisible


def _updat(spec):
    t, cfg, bs = spec.dtype, spec.config, spec.block_size
    consts = dict(BS=bs, G=cfg.G, BK=cfg.BK, ATOMIC=spec.atomic, PRECISION=PRECISION, TICKET=spec.ticket,
                  PACK=spec.pack)
    dw = f"*{t}" if spec.dw16 or spec.ticket else "*fp32"
    tickets = {"WS": "*fp32", "COUNTERS": "*i32"}
    if spec.kernel == "updat_kernel":
        types = {"X": f"*{t}", "DY": f"*{t}", "DW": dw, "GROUPS": "*i32",
                 "N": "i32", "tokens_per_split": "i32",
                 "stride_xn": "i32", "stride_xf": "i32", "stride_dn": "i32", "stride_df": "i32", **tickets}
        unit, wide = _strides(spec.axis, "x", "d", n16=spec.n16)
        consts |= {name: 1 for name in unit}
        divisible = {"X", "DY", "DW", "GROUPS", "tokens_per_split", *tickets, *wide}
    else:
        x_t = spec.axis == 0
        types = {"x_desc": _desc(t, [cfg.BK, bs], x_t), "dy_desc": _desc(t, [cfg.BK, bs], x_t),
                 "DW": dw, "GROUPS": "*i32", "tokens_per_split": "i32", "N": "i32", **tickets}
        # the library's updat leaves the bias gradient to its caller (no BIAS_GRAD operands)
        consts.update(X_T=x_t, DB=None, DB_FIRST=None, out_features=None, BIAS_GRAD=False)
        divisible = {"DW", "GROUPS", "tokens_per_split", *tickets}
    return types, consts, divisible


def compile_args(spec: AotSpec) -> CompileArgs:
    """The :class:`CompileArgs` of ``spec``, in the parameter order of its kernel."""
    types, consts, divisible = (_updat if spec.product == "updat" else _xprop)(spec)
    return CompileArgs(signature(kernel_function(spec.kernel), types, consts), consts, frozenset(divisible),
                       spec.config.num_warps, spec.config.num_stages)
