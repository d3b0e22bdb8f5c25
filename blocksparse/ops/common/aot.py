"""What the ahead-of-time registrations of several families share: checked signatures, and the
specs of :func:`~blocksparse.ops.common.reduce.sum_rows_kernel` that a family's backward needs.

A family whose backward folds per-program partial rows (layer norm's ``dg`` / ``db``, the LSTM
gates' ``dbias``) lists a :class:`SumRowsSpec` among its own specs, so that its C finds the
reduction in its own family.  The compiled tile is fixed: ``P`` (the partial rows) depends on the
GPU's SM count, and the kernel loops over rows ``BP`` at a time, so one tile serves every ``P``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...aot.family import CompileArgs

__all__ = ["SumRowsSpec", "SUM_ROWS_BP", "SUM_ROWS_BM", "signature", "sum_rows_compile_args",
           "sum_rows_fields"]

#: Partial rows per step and columns per program of the compiled reduction.
SUM_ROWS_BP, SUM_ROWS_BM = 64, 128


@dataclass(frozen=True)
class SumRowsSpec:
    """``OUT_A[m] = sum_p PART_A[p, m]`` (and ``OUT_B`` when ``has_b``): float32 sums, written in
    ``out`` (float32, or a 16-bit dtype: rounded once)."""

    arch: int
    has_b: bool
    product: str = "sum_rows"
    out: str = "fp32"

    @property
    def name(self):
        out = "" if self.out == "fp32" else f"_{self.out}"
        return f"sum_rows_{'ab' if self.has_b else 'a'}{out}_sm{self.arch}"


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
    from .reduce import sum_rows_kernel

    out = f"*{spec.out}"
    types = {"PART_A": "*fp32", "PART_B": "*fp32", "OUT_A": out, "OUT_B": out, "P": "i32", "M": "i32"}
    consts = {"HAS_B": spec.has_b, "BP": SUM_ROWS_BP, "BM": SUM_ROWS_BM}
    return CompileArgs(signature(sum_rows_kernel, types, consts), consts,
                       frozenset({"PART_A", "PART_B", "OUT_A", "OUT_B"}), num_warps=4, num_stages=1)


def sum_rows_fields(spec: SumRowsSpec):
    """No ``dtype`` field (the sums are float32 whatever the activations): a dtype filter of a test
    build keeps it; ``out`` names the outputs' dtype."""
    return {"product": spec.product, "has_b": spec.has_b, "out": spec.out, "bm": SUM_ROWS_BM}
