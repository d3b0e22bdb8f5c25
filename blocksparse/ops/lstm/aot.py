"""The LSTM family's ahead-of-time registration (see :mod:`blocksparse.aot.family`): the gate
kernels for the TensorFlow op library, and the reduction of the backward's partial ``dbias`` rows.

A spec fixes dtype, bias or none, direction and the feature tile ``BK`` (16 to 128; a cell of
``K`` features takes :func:`.configs.lstm_gates_config`'s tile, at least 16 wide).  What holds for
every TensorFlow call is compiled in: features are contiguous, ``K`` is a multiple of 16 (the
frontend sends other cells to the reference path), so every row stride (``K`` or ``4K`` for merged
gates) and every gate's offset in a merged tensor keeps 16-byte alignment.  The bias (and ``dbias``)
is float32 -- what the TensorFlow frontend passes -- or, for 16-bit activations, of their dtype, as
PyTorch's layers keep it (``param``; the native op reads it so, with no cast a call).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..common.aot import SumRowsSpec, signature, sum_rows_compile_args, sum_rows_fields
from ...aot.family import CompileArgs
from .configs import GatesConfig, lstm_gates_config

__all__ = ["GatesSpec", "specializations", "kernel", "compile_args", "fields", "DTYPES", "TILES"]

DTYPES = ("fp16", "bf16", "fp32")
#: The feature tiles compiled: a multiple of 16 features takes the one its K selects.
TILES = (16, 32, 64, 128)
_GATES = "IJFO"


@dataclass(frozen=True)
class GatesSpec:
    """One gate kernel: ``product`` ``"fwd"`` or ``"bwd"``."""

    arch: int
    product: str
    dtype: str
    has_bias: bool
    config: GatesConfig
    param: str = "fp32"  # the bias's dtype: float32, or the activations' (16-bit) dtype

    @property
    def name(self):
        param = "" if self.param == "fp32" else f"_b{self.param}"
        return (f"lstm_{self.product}_{self.dtype}{'_bias' if self.has_bias else ''}{param}_k{self.config.BK}"
                f"_sm{self.arch}")


def specializations(archs):
    """Every spec for ``archs``: per arch, dtype, bias (float32; for 16-bit activations also of their
    dtype), direction and feature tile; and the reduction of ``dbias`` into each dtype."""
    specs = []
    for arch in archs:
        for dtype in DTYPES:
            for has_bias, param in ((False, "fp32"), *((True, p) for p in sorted({"fp32", dtype}))):
                for product in ("fwd", "bwd"):
                    specs += [GatesSpec(arch, product, dtype, has_bias, lstm_gates_config(bk, product == "bwd"), param)
                              for bk in TILES]
        # dbias rows: 4K columns, K a multiple of 16
        specs += SumRowsSpec.every(arch, has_b=False, outs=DTYPES)
    return specs


def kernel(spec):
    from ..common.reduce import sum_rows_kernel
    from .gates import lstm_gates_bwd_kernel, lstm_gates_fwd_kernel

    if isinstance(spec, SumRowsSpec):
        return sum_rows_kernel
    return lstm_gates_fwd_kernel if spec.product == "fwd" else lstm_gates_bwd_kernel


def fields(spec):
    """What selects ``spec`` at run time (scalars are C keys): product, dtype, has_bias, the bias's
    dtype ``param``, the tile (``bn``, ``bk``), ``programs_per_sm``, and the whole ``config``."""
    if isinstance(spec, SumRowsSpec):
        return sum_rows_fields(spec)
    cfg = spec.config
    return {"product": spec.product, "dtype": spec.dtype, "has_bias": spec.has_bias, "param": spec.param, "bn": cfg.BN,
            "bk": cfg.BK, "programs_per_sm": cfg.programs_per_sm, "config": asdict(cfg)}


def compile_args(spec) -> CompileArgs:
    """The :class:`CompileArgs` of ``spec``, in the parameter order of its kernel."""
    if isinstance(spec, SumRowsSpec):
        return sum_rows_compile_args(spec)
    t = spec.dtype
    inputs = ["C", *_GATES]
    if spec.product == "fwd":
        tensors = [*inputs, "C_NEXT", "H_NEXT"]
        strides = ["stride_c", *(f"stride_{g.lower()}" for g in _GATES), "stride_cn", "stride_hn"]
        extra = {}
    else:
        tensors = [*inputs, "DC_NEXT", "DH_NEXT", "DC", *(f"D{g}" for g in _GATES)]
        strides = ["stride_c", *(f"stride_{g.lower()}" for g in _GATES), "stride_dcn", "stride_dhn", "stride_dc",
                   *(f"stride_d{g.lower()}" for g in _GATES)]
        extra = {"DBIAS_PART": "*fp32"}
    types = {name: f"*{t}" for name in tensors} | {"BIAS": f"*{spec.param}"} | extra
    types |= {"N": "i32", "K": "i32", "forget_bias": "fp32"} | {name: "i32" for name in strides}
    consts = {"BN": spec.config.BN, "BK": spec.config.BK, "HAS_BIAS": spec.has_bias}
    divisible = {*tensors, "BIAS", *extra, "K", *strides}
    fn = kernel(spec)
    return CompileArgs(signature(fn, types, consts), consts, frozenset(divisible), spec.config.num_warps,
                       num_stages=1)
