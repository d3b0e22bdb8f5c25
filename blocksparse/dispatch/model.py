"""The cost model: expected time of each implementation of a problem, and the choice among them.

Prediction.  Each implementation has a work measure -- ``N * C * K`` multiply-adds for ``dense``,
``N * C * K * density`` for the sparse ones (:meth:`~.problem.Problem.work`).  For a problem, the
``K_NEAREST`` rows with the same precision (else the nearest precision, said in the plan),
measured for that implementation, are taken by distance in log space over (tokens, in, out, block
size, density) plus one for a structure mismatch; each row's time is carried to the problem's work
as ``time * (work / row work) ** WORK_EXPONENT`` and the problem's time is the inverse-distance-
weighted geometric mean of those.  Times grow more slowly than the work over the sizes a layer
spans (fixed launch and host costs, efficiency that rises with size): each table carries its own
exponent (``work_exponent``), fitted to its rows by :func:`leave_one_out` when it is written
(:func:`fit_work_exponent`); :data:`WORK_EXPONENT` serves a table without one.  On the shipped
tables the fit gives 0.7 to PyTorch's CPU table and keeps 0.6 for TensorFlow's (against
proportional carrying, exponent 1: mean regret 0.9% / 0.7% against 1.0% / 1.1%; 94% / 96% of the
rows within the margin, the worst 25% / 23%) and gives 0.9 to the CUDA table (mean regret 0.06%,
every row within the margin, against 1.2% and 58 of 60 at 0.6).  A measured problem (distance 0)
gets exactly its measured time.

Choice (the margin rule).  The fastest expected implementation is the *best*; every implementation
expected within ``margin`` (default 5%) of it is *acceptable*, and the first acceptable one in
:data:`PREFERENCE` is chosen -- the kernels first: a table times one layer's call alone, and
inside a model the kernels' eager call (one native autograd node in PyTorch) costs less host time
than the dense masked product's several framework ops and nodes (the small pixelfly MLP in bf16 on
an H200: 1.10x ``nn.Linear``'s time with the kernels, 1.85x dense masked, where the table had the
two within 2%); dense next, whose speed varies least across shapes.  On the measured grid the expected times are
the measurements, so the choice there is never more than ``margin`` slower than the best.

Launches through the JIT.  The CUDA table times the kernels through the kernel library.  Where a
problem's kernels would launch through Triton's JIT instead (``Problem.jit``: no library), each
launch costs about :data:`JIT_LAUNCH_MS` of host time, so a call takes at least that per launch:
the kernels' expected time is raised to it, and small layers, bound by host time, go to ``dense``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .table import IMPLS, Table

__all__ = ["CostModel", "JIT_LAUNCH_MS", "K_NEAREST", "MARGIN", "PREFERENCE", "Plan", "WORK_EXPONENT",
           "EXPONENTS", "fit_work_exponent", "leave_one_out"]

#: How much slower than the expected best an implementation may be and still be chosen.
MARGIN = 0.05
#: Order of preference among implementations expected within the margin of the best.
PREFERENCE = ("kernels", "dense", "portable", "reference")
#: Neighbouring table rows an expected time is interpolated from.
K_NEAREST = 6
#: How a neighbour's time scales to the problem's work, ``(work / row work) ** exponent``, where a
#: table names no ``work_exponent`` of its own.
WORK_EXPONENT = 0.6
_UNSET = object()
#: Plans a :class:`CostModel` keeps (cleared when full: a layer fed ever new token counts stays bounded).
PLAN_CACHE_SIZE = 4096
#: Host milliseconds of a kernels' call per launch through Triton's JIT, a floor under the kernels'
#: time where no kernel library serves them.  Measured on an H100's host (2026-12-07): the small
#: pixelfly MLP's bf16 step, host-bound, took 1.98 ms for its six launches (0.75 ms with the library);
#: the large one's 2.08 ms, as its two layers' calls at this floor (1 ms each) predict.
JIT_LAUNCH_MS = 0.33
#: The exponents :func:`fit_work_exponent` tries.
EXPONENTS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_NEAREST_PRECISION = {"float32": ("tf32", "float64"), "tf32": ("float32",), "float64": ("float32", "tf32"),
                      "bfloat16": ("float16",), "float16": ("bfloat16",)}


@dataclass(frozen=True)
class Plan:
    """What runs and why: the chosen ``impl``, the expected milliseconds of each candidate
    (``times_ms``; empty where no table applies), a sentence saying why, and where the figures
    come from (``source``: a table file, ``"override"`` or ``"default rule"``)."""

    impl: str
    times_ms: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    why: str = ""
    source: str = ""

    def __str__(self):
        times = ", ".join(f"{k} {v:.3g} ms" for k, v in sorted(self.times_ms.items(), key=lambda kv: kv[1]))
        return f"{self.impl}: {self.why}" + (f" (expected: {times})" if times else "")


def _features(p):
    """A problem's coordinates in the space of nearest neighbours (log sizes and density)."""
    return (math.log2(p.tokens), math.log2(p.in_features), math.log2(p.out_features),
            math.log2(p.block_size), math.log2(p.density))


class CostModel:
    """Expected times and choices from one :class:`~.table.Table` (or none: the default rule).

    Parameters
    ----------
    table : Table or None
    margin : float
        See the module docstring.

    Setting ``table``, ``margin`` or ``exponent`` later takes effect at the next choice: it advances
    ``revision`` (a counter), which the model's caches and the layers' memos of its choices check.
    """

    def __init__(self, table, margin=MARGIN):
        if table is not None and not isinstance(table, Table):
            raise TypeError(f"table must be a blocksparse.dispatch.Table (e.g. Table.load(path)) or None; "
                            f"got {type(table).__name__}")
        if isinstance(margin, bool) or not isinstance(margin, numbers.Real):
            raise TypeError(f"margin must be a number in [0, 1); got {margin!r} of type {type(margin).__name__}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1); got {margin}")
        self.table = table
        self.margin = float(margin)
        self.exponent = WORK_EXPONENT if table is None or table.work_exponent is None else table.work_exponent
        self._held, self._by_key, self._plans = None, {}, {}

    #: The attributes a plan depends on: setting one empties the caches and advances :attr:`revision`.
    PLANNING = frozenset({"table", "margin", "exponent"})

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name in self.PLANNING:  # memos of this model's choices (a layer's) key on the revision
            object.__setattr__(self, "revision", self.__dict__.get("revision", 0) + 1)

    def __getstate__(self):  # pickle / deepcopy: the caches start afresh
        return {k: v for k, v in self.__dict__.items() if k not in ("_held", "_by_key", "_plans")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("revision", 0)  # pickled before models counted their revisions
        self._held, self._by_key, self._plans = None, {}, {}

    def _caches(self):
        """``(row arrays, plans)`` cached for the current table, margin and exponent (attributes a user
        may set: a change empties them)."""
        if self._held != self.revision:
            self._by_key, self._plans = {}, {}  # emptied before they are marked current
            self._held = self.revision
        return self._by_key, self._plans

    def _columns(self, impl, backward, dtype):
        """The rows measuring ``impl`` in ``dtype`` as arrays (computed once): features, structure,
        log time and log work; None where there are none."""
        by_key = self._caches()[0]
        key = (impl, backward, dtype)
        cols = by_key.get(key, _UNSET)
        if cols is _UNSET:
            rows = [r for r in self.table.rows if r.problem.dtype == dtype and impl in r.times(backward)]
            cols = by_key[key] = None if not rows else (
                np.array([_features(r.problem) for r in rows]),
                np.array([r.problem.structured for r in rows]),
                np.log([r.times(backward)[impl] for r in rows]),
                np.log([r.problem.work(impl) for r in rows]))
        return cols

    def expected_ms(self, problem, impl):
        """Expected milliseconds of ``impl`` on ``problem`` and the precision of the rows used, or
        ``(None, None)`` when the table has no row for it."""
        if self.table is None:
            return None, None
        for dtype in (problem.dtype, *_NEAREST_PRECISION.get(problem.dtype, ())):
            cols = self._columns(impl, problem.backward, dtype)
            if cols is not None:
                break
        else:
            return None, None
        features, structured, log_ms, log_work = cols
        # distance to each row, and the row's time carried to the problem's work
        d = np.sqrt(((features - np.array(_features(problem))) ** 2).sum(1)) + (structured != problem.structured)
        carried = log_ms + self.exponent * (math.log(problem.work(impl)) - log_work)
        exact = d < 1e-9
        if exact.any():
            return math.exp(carried[exact].mean()), dtype
        near = np.argsort(d, kind="stable")[:K_NEAREST]
        weights = 1.0 / d[near]
        return math.exp(float((weights * carried[near]).sum() / weights.sum())), dtype

    def choose(self, problem, candidates):
        """The :class:`Plan` for ``problem`` among the implementations ``candidates`` can run
        (cached: a model plans each problem once).

        Without a table, or where it measured none of the candidates, the *default rule* serves:
        the kernels where they can run, else the portable path (or the first candidate).
        """
        plans = self._caches()[1]
        key = (problem, tuple(candidates))
        plan = plans.get(key)
        if plan is None:
            plan = self._choose(problem, key[1])
            if len(plans) >= PLAN_CACHE_SIZE:
                plans.clear()
            plans[key] = plan
        return plan

    def _choose(self, problem, candidates):
        candidates = tuple(c for c in IMPLS if c in candidates)
        if not candidates:
            raise ValueError("candidates must name at least one of " + ", ".join(IMPLS))
        times, used = {}, set()
        for impl in candidates:
            ms, dtype = self.expected_ms(problem, impl)
            if ms is not None:
                times[impl] = ms
                used.add(dtype)
        if not times:
            impl = next((c for c in ("kernels", "portable") if c in candidates), candidates[0])
            why = ("no measured table for this device" if self.table is None else
                   f"{self.table.source} measured none of {', '.join(candidates)}")
            return Plan(impl, why=f"{why}; the default rule takes {impl}", source="default rule")
        floor = JIT_LAUNCH_MS * problem.launches() if problem.jit else 0.0
        host_bound = times.get("kernels", floor) < floor
        if host_bound:
            times["kernels"] = floor
        best = min(times, key=times.get)
        limit = times[best] * (1 + self.margin)
        impl = next(i for i in PREFERENCE if i in times and times[i] <= limit)
        if impl == best:
            why = f"fastest expected of {', '.join(sorted(times))}"
        else:
            why = (f"expected within {self.margin:.0%} of the fastest ({best}, "
                   f"{times[impl] / times[best] - 1:+.1%}) and preferred on a near tie")
        if host_bound:
            why += (f"; the kernels launch through Triton's JIT here (no kernel library serves them): "
                    f"{problem.launches()} launches at ~{JIT_LAUNCH_MS:g} ms of host time each")
        unmeasured = [c for c in candidates if c not in times]
        if unmeasured:
            why += f"; {', '.join(unmeasured)} not measured here"
        if used != {problem.dtype}:
            why += f"; {problem.dtype} not measured, {'/'.join(sorted(used))} figures used"
        return Plan(impl, MappingProxyType(times), why, self.table.source)


def fit_work_exponent(table, margin=MARGIN, exponents=EXPONENTS, tolerance=0.002):
    """The exponent of ``exponents`` under which :func:`leave_one_out` chooses best on ``table``'s own
    rows: the least mean regret, where several come within ``tolerance`` of it the one nearest
    :data:`WORK_EXPONENT` (a row or two of a noisy table should not move it)."""
    def mean_regret(exponent):
        meta = MappingProxyType({**table.meta, "work_exponent": exponent})
        trial = Table(table.framework, table.device, table.rows, meta, table.source)
        return leave_one_out(trial, margin)["mean_regret"]

    regrets = {e: mean_regret(e) for e in exponents}
    best = min(regrets.values())
    return min((e for e, r in regrets.items() if r <= best + tolerance), key=lambda e: abs(e - WORK_EXPONENT))


def leave_one_out(table, margin=MARGIN):
    """How the model chooses where it has not measured: each row measured for two or more
    implementations is planned from a table without it, and the *regret* of that choice is its
    measured time over the row's fastest, minus one.

    Returns a JSON-ready dict: ``rows`` (``key`` = tokens, in, out, block size, density, dtype,
    layout; ``chosen``, ``best``, ``regret`` per row),
    ``median_regret``, ``mean_regret``, ``max_regret``, ``within_margin`` (fraction of rows with
    regret <= margin), ``margin`` and the ``work_exponent`` used.
    """

    rows = []
    for i, r in enumerate(table.rows):
        times = dict(r.fwdbwd_ms)
        others = table.rows[:i] + table.rows[i + 1:]
        if len(times) < 2 or not others:
            continue
        model = CostModel(Table(table.framework, table.device, others, table.meta, table.source), margin)
        chosen = model.choose(r.problem, tuple(times)).impl
        best = min(times, key=times.get)
        p = r.problem
        rows.append({"key": [p.tokens, p.in_features, p.out_features, p.block_size, round(p.density, 4),
                             p.dtype, r.layout],
                     "chosen": chosen, "best": best, "regret": times[chosen] / times[best] - 1})
    regrets = sorted(x["regret"] for x in rows)
    exponent = CostModel(table).exponent
    if not regrets:
        return {"margin": margin, "work_exponent": exponent, "rows": [], "median_regret": 0.0, "mean_regret": 0.0,
                "max_regret": 0.0, "within_margin": 1.0}
    return {"margin": margin, "work_exponent": exponent, "rows": rows, "median_regret": regrets[len(regrets) // 2],
            "mean_regret": sum(regrets) / len(regrets), "max_regret": regrets[-1],
            "within_margin": sum(x <= margin + 1e-12 for x in regrets) / len(regrets)}
