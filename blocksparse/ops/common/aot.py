"""What the ahead-of-time registrations of several families share: checked signatures, and the
specs of :func:`~blocksparse.ops.common.reduce.sum_rows_kernel` that a family's backward needs.

A family whose backward folds per-program partial rows (layer norm's ``dg`` / ``db``, the LSTM
gates' ``dbias``) lists a :class:`SumRowsSpec` among its own specs, so that its C finds the
reduction in its own family.  ``P`` (the partial rows) depends on the GPU's SM count, and the
kernel loops over rows ``BP`` at a time, so any tile serves every ``P``; a tile is compiled per
``BP`` in :data:`SUM_ROWS_BPS` and the C takes the one :func:`~blocksparse.ops.common.reduce.sum_rows_tile`
gives the JIT launches for the call's ``P`` (with a single fixed ``[64, 128]`` tile the reduction of
a 1024-column row ran on 8 programs and took 3-5x the JIT's time).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...aot.family import CompileArgs

__all__ = ["SumRowsSpec", "SUM_ROWS_BPS", "signature", "sum_rows_compile_args", "sum_rows_fields"]

#: Partial rows per step (``BP``) of the compiled reductions; each tile holds ``SUM_TILE`` elements.
SUM_ROWS_BPS = (64, 128, 256, 512)


@dataclass(frozen=True)
class SumRowsSpec:
    """``OUT_A[m] = sum_p PART_A[p, m]`` (and ``OUT_B`` when ``has_b``): float32 sums, written in
    ``out`` (float32, or a 16-bit dtype: rounded once).  ``aligned``: rows of a multiple of 16
    columns (``M`` is compiled divisible by 16, so that Triton vectorises the loads); an unaligned
    spec serves any ``M``."""

    arch: int
    has_b: bool
    product: str = "sum_rows"
    out: str = "fp32"
    aligned: bool = True
    bp: int = 64

    @property
    def name(self):
        out = "" if self.out == "fp32" else f"_{self.out}"
        return f"sum_rows_{'ab' if self.has_b else 'a'}{'' if self.aligned else 'u'}{out}_p{self.bp}_sm{self.arch}"

    @classmethod
    def every(cls, arch, has_b, outs=("fp32",), alignments=(True,)):
        """A spec per ``BP`` tile, output dtype in ``outs`` and alignment in ``alignments``."""
        return [cls(arch, has_b, out=out, aligned=aligned, bp=bp) for out in outs for aligned in alignments
                for bp in SUM_ROWS_BPS]


def signature(fn, types, consts):
    """``triton.compile``'s signature of ``fn`` from the parameters' ``types`` and ``consts``,
    checked against the kernel's parameters (a renamed parameter fails here, not at run time)."""
    names = list(fn.arg_names)
    unknown = (set(types) | set(consts)) - set(names)
    missing = set(names) - set(types) - set(consts)
    if unknown or missing:
        raise ValueError(f"{fn.__name__}: parameters changed; aot.py names {sorted(unknown)} that the "
                         f"kernel lacks and lacks {sorted(missing)}")
    return {n: "constexpr" if n in consts else types[n] for n in names}


def sum_rows_compile_args(spec: SumRowsSpec) -> CompileArgs:
    from .reduce import sum_rows_kernel, sum_rows_width

    out = f"*{spec.out}"
    types = {"PART_A": "*fp32", "PART_B": "*fp32", "OUT_A": out, "OUT_B": out, "P": "i32", "M": "i32"}
    consts = {"HAS_B": spec.has_b, "BP": spec.bp, "BM": sum_rows_width(spec.bp)}
    divisible = {"PART_A", "PART_B", "OUT_A", "OUT_B"} | ({"M"} if spec.aligned else set())
    return CompileArgs(signature(sum_rows_kernel, types, consts), consts, frozenset(divisible), num_warps=4,
                       num_stages=1)


def sum_rows_fields(spec: SumRowsSpec):
    """No ``dtype`` field (the sums are float32 whatever the activations): a dtype filter of a test
    build keeps it; ``out`` names the outputs' dtype."""
    from .reduce import sum_rows_width

    return {"product": spec.product, "has_b": spec.has_b, "out": spec.out, "aligned": spec.aligned, "bp": spec.bp,
            "bm": sum_rows_width(spec.bp)}
