"""What ``triton.compile`` gets for each ahead-of-time specialisation: signature, constexprs, hints.

These mirror the JIT call sites in :mod:`blocksparse.torch._matmul.launch` (same kernels, tiles and
tensor-descriptor blocks).  Where the JIT specialises on the values it is given -- a stride of 1
becomes a constant, 16-byte aligned pointers and multiples of 16 get divisibility hints -- these fix
what holds for every call of the op library: activations are dense and row-major, so the feature
stride (axis 1) or the token stride (axis 0) is 1; buffers are 16-byte aligned (the runtime checks);
feature counts are multiples of the block size.  The runtime (``src/runtime/bsk.c``) passes the
remaining arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

from .configs import AotSpec

__all__ = ["CompileArgs", "compile_args", "kernel_function", "PRECISION"]

#: float32 products run in IEEE precision (no TF32), as the PyTorch frontend's default.
PRECISION = "ieee"


@dataclass(frozen=True)
class CompileArgs:
    """``signature`` (every parameter in the kernel's order, constexprs as ``"constexpr"``),
    ``constexprs`` and ``divisible`` (parameters hinted as multiples of 16) of one kernel."""

    signature: dict
    constexprs: dict
    divisible: frozenset


def kernel_function(name):
    """The ``@triton.jit`` function called ``name``."""
    from . import updat, updat_tma, xprop, xprop_tma

    for module in (xprop, xprop_tma, updat, updat_tma):
        if hasattr(module, name):
            return getattr(module, name)
    raise ValueError(f"no Triton kernel named {name!r} in blocksparse.kernels")


def _desc(dtype, block, transposed=False):
    """Type of a tensor-descriptor parameter whose ``block`` is given as [tokens, features]."""
    rows, cols = reversed(block) if transposed else block
    return f"tensordesc<{dtype}[{rows}, {cols}]>"


def _strides(axis, *tensors):
    """(unit, wide) stride parameter names of the activations ``tensors`` (``"x"`` -> stride_xn,
    stride_xf): ``unit`` strides are 1; ``wide`` ones are a feature count, a multiple of 16."""
    unit = [f"stride_{t}{'f' if axis == 1 else 'n'}" for t in tensors]
    wide = [f"stride_{t}n" for t in tensors] if axis == 1 else []
    return unit, wide


def _xprop(spec):
    t, cfg, bs = spec.dtype, spec.config, spec.block_size
    out = "fp32" if spec.atomic else t
    trans = spec.trans_w
    consts = dict(BS=bs, G=cfg.G, BM=cfg.BM, TRANS_W=trans, ATOMIC=spec.atomic, PRECISION=PRECISION)
    if spec.kernel == "xprop_kernel":
        types = {"X": f"*{t}", "W": f"*{t}", "Y": f"*{out}", "HEADERS": "*i32", "ENTRIES": "*i32",
                 "N": "i32", "OUT_FEATURES": "i32", "num_segments": "i32",
                 "stride_xn": "i32", "stride_xf": "i32", "stride_yn": "i32", "stride_yf": "i32"}
        unit, wide = _strides(spec.axis, "x", "y")
        divisible = {"X", "W", "Y", "HEADERS", "ENTRIES", "OUT_FEATURES", *wide}
    else:
        bk, bn = cfg.BK or bs, cfg.BN or bs
        x_t = spec.axis == 0
        types = {"x_desc": _desc(t, [cfg.BM, bk], x_t),
                 "w_desc": _desc(t, [bn, bk] if trans else [bk, bn]),
                 "y_desc": _desc(out, [cfg.BM, bn], x_t),
                 "Y": f"*{out}", "HEADERS": "*i32", "ENTRIES": "*i32",
                 "num_segments": "i32", "N": "i32", "OUT_FEATURES": "i32",
                 "stride_yn": "i32", "stride_yf": "i32"}
        consts.update(BK=bk, BN=bn, X_T=x_t, UNROLL=cfg.UNROLL)
        unit, wide = _strides(spec.axis, "y")
        divisible = {"Y", "HEADERS", "ENTRIES", "OUT_FEATURES", *wide}
    return types, consts | {name: 1 for name in unit}, divisible


def _updat(spec):
    t, cfg, bs = spec.dtype, spec.config, spec.block_size
    consts = dict(BS=bs, G=cfg.G, BK=cfg.BK, ATOMIC=spec.atomic, PRECISION=PRECISION)
    if spec.kernel == "updat_kernel":
        types = {"X": f"*{t}", "DY": f"*{t}", "DW": "*fp32", "GROUPS": "*i32",
                 "N": "i32", "tokens_per_split": "i32",
                 "stride_xn": "i32", "stride_xf": "i32", "stride_dn": "i32", "stride_df": "i32"}
        unit, wide = _strides(spec.axis, "x", "d")
        consts |= {name: 1 for name in unit}
        divisible = {"X", "DY", "DW", "GROUPS", "tokens_per_split", *wide}
    else:
        x_t = spec.axis == 0
        types = {"x_desc": _desc(t, [cfg.BK, bs], x_t), "dy_desc": _desc(t, [cfg.BK, bs], x_t),
                 "DW": "*fp32", "GROUPS": "*i32", "tokens_per_split": "i32", "N": "i32"}
        consts.update(X_T=x_t)
        divisible = {"DW", "GROUPS", "tokens_per_split"}
    return types, consts, divisible


def compile_args(spec: AotSpec) -> CompileArgs:
    """The :class:`CompileArgs` of ``spec``, in the parameter order of its kernel."""
    types, consts, divisible = (_updat if spec.product == "updat" else _xprop)(spec)
    fn = kernel_function(spec.kernel)
    names = list(fn.arg_names)
    unknown = (set(types) | set(consts)) - set(names)
    missing = set(names) - set(types) - set(consts)
    if unknown or missing:
        raise ValueError(f"{spec.kernel}: parameters changed; signatures.py names {sorted(unknown)} "
                         f"that the kernel lacks and lacks {sorted(missing)}")
    signature = {n: "constexpr" if n in consts else types[n] for n in names}
    return CompileArgs(signature, consts, frozenset(divisible))
