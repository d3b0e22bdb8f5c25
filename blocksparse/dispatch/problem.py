"""The problem the cost model plans: one block-sparse linear product on one device."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRECISIONS", "Problem"]

#: Compute precisions a problem (and a table row) may be in.
PRECISIONS = ("float32", "tf32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class Problem:
    """A block-sparse linear product to plan: ``(tokens, in_features) @ (in_features, out_features)``.

    ``dtype``: the compute precision (one of :data:`PRECISIONS`); ``structured``: the layout
    groups well (``blocksparse.ops.matmul.grouping.groups_well``: output columns share their rows);
    ``backward``: both gradients will be computed
    too (training) rather than the forward product alone; ``jit``: the kernels would launch through
    Triton's JIT (no kernel library serves them), at a host cost per launch that the tables, timed
    through the library, do not hold (:data:`~.model.JIT_LAUNCH_MS`).
    """

    tokens: int
    in_features: int
    out_features: int
    block_size: int
    density: float
    dtype: str
    structured: bool = False
    backward: bool = True
    jit: bool = False

    def __post_init__(self):
        if self.dtype not in PRECISIONS:
            raise ValueError(f"dtype must be one of {PRECISIONS}; got {self.dtype!r}")
        for name in ("tokens", "in_features", "out_features", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if not 0 < self.density <= 1:
            raise ValueError(f"density must be in (0, 1]; got {self.density}")

    def launches(self):
        """Kernel launches of the kernels' call: the forward product, and both gradients' if ``backward``."""
        return 3 if self.backward else 1

    def work(self, impl):
        """Multiply-adds of ``impl``: ``N * C * K`` for ``dense``, times the density otherwise."""
        dense = float(self.tokens) * self.in_features * self.out_features
        return dense if impl == "dense" else dense * self.density
