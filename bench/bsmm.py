"""Block-sparse matmul benchmark on a GPU: ours vs PyTorch's BSR kernels vs dense cuBLAS.

    python bench/bsmm.py --out bench/results        (``make bench``)

One run times, for C = K = 4096, N = 8192 (compute bound) and N = 64 (memory bound), densities
0.1 / 0.25 / 0.5, block sizes 16 / 32 / 64 / 128, bf16 / fp16 / fp32, and the three products
(fprop y = x W, bprop dx = dy W^T, updat dW = x^T dy on the blocks):

* ``dense``      torch.matmul on the dense matrices (cuBLAS);
* ``torch-bsr``  torch.sparse._triton_ops: bsr_dense_mm (fprop, bprop), sampled_addmm (updat);
* ``blocksparse`` the products as eager calls reach them (``blocksparse.torch._matmul.products``: plan
  lookup, then the kernel library's compiled kernel or the JIT; ``BLOCKSPARSE_KERNELS`` chooses).

Every timed configuration is first checked against a float64 reference (outputs NaN-poisoned).
Then, per problem and op, dense, ours and PyTorch BSR are timed interleaved in ``--rounds`` rounds
(each round times each once, in rotated order; as many rounds again where any of them spread by
more than 10% in the first ones) and the median of each is kept (``ms``, and the
dense time beside it, ``dense_ms``).  ``frac_of_dense`` = useful TFLOP/s (nonzero blocks only) over
dense TFLOP/s, the dense time being the median of ``dense_ms`` over every problem of the op, dtype
and N in the run (``pooled_dense_ms``): two runs showed that 16-bit cuBLAS at N = 8192 is the noisy
term -- its per-problem median moves by up to 11% within a run while ours moves by under 1% --
so a ratio to the time beside it inherits that noise (``frac_of_problem_dense`` keeps it).
PyTorch BSR is timed in CUDA graphs at every N: its eager calls spend 0.3-0.6 ms of Python a call,
which at N = 8192 made its rows host-bound and bimodal between runs; the graph times its kernels
alone, which favours it.  ``--runs 2`` (or ``--run 2`` in a later session, then ``--agree``)
repeats the whole run and reports the largest disagreement of ``frac_of_dense``
(``bsmm-h200-agreement.json``).  N = 64 calls are timed in CUDA graphs over rotating operand copies
(several times the L2), so that weights come from device memory; ``hbm_frac`` is the fewest bytes
the op must move over that time, as a fraction of the copy bandwidth measured in this run.  For
N = 64 ``eager_ms`` is measured too: back-to-back eager calls (events around 50 of them), host
time included -- what a training loop sees, where the graph time is the kernels' alone.
Writes ``bsmm-h200.json`` and ``bsmm-h200.md`` into ``--out`` (``-run<N>`` for a later run; a
``--dtypes`` / ``--tokens`` subset adds its names).  A full run takes about 10 minutes on an H200;
where one call cannot hold it, time it in parts (``--dtypes bf16,fp16``, then ``--dtypes fp32``) and
join them with ``--merge PART.json ... [--run N]``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import common  # noqa: E402

C = K = 4096
NS = (8192, 64)
DENSITIES = (0.1, 0.25, 0.5)
BLOCK_SIZES = (16, 32, 64, 128)
OPS = ("fprop", "bprop", "updat")
IMPLS = ("blocksparse", "torch-bsr")
SMALL_N = 512


def problems(dtypes=tuple(common.DTYPES)):
    for dt in dtypes:
        for n in NS:
            for bs in BLOCK_SIZES:
                for d in DENSITIES:
                    yield n, dt, bs, d


class Case:
    """One problem with the callables of every impl and op, on given operand copies."""

    def __init__(self, n, dt, bs, d):
        self.p = common.Problem(C, K, n, bs, d, common.DTYPES[dt], seed=1000 * bs + int(100 * d))
        from blocksparse.torch._matmul import plan as _plan
        self.handle = _plan.handle(self.p.layout)
        self._bsr = None

    def operands(self, copy=False):
        p = self.p
        if not copy:
            return p.x, p.w, p.dy
        return p.x.clone(), p.w.clone(), p.dy.clone()

    def dense(self, w):
        """The dense (C, K) matrix of the weight blocks ``w``."""
        p = self.p
        W = torch.zeros(p.layout.CB, p.bs, p.layout.KB, p.bs, device=w.device, dtype=w.dtype)
        W[p.coords[:, 0], :, p.coords[:, 1], :] = w
        return W.reshape(p.C, p.K)

    def _to_bsr(self, w):
        W, bs = self.dense(w), self.p.bs
        return W.t().contiguous().to_sparse_bsr((bs, bs)), W.to_sparse_bsr((bs, bs))

    def bsr(self, w):
        """(W^T as BSR (K, C), W as BSR (C, K)) for the weight values ``w``.  The problem's own
        weight is converted once; a copy of it (the timers' operand copies) gets the same structure
        with a copy of the values, not a conversion of its own (64 of them a problem at N = 64)."""
        if self._bsr is None:
            self._bsr = self._to_bsr(self.p.w)
        if w is self.p.w:
            return self._bsr
        if w.shape != self.p.w.shape or not torch.equal(w, self.p.w):
            return self._to_bsr(w)
        return tuple(torch.sparse_bsr_tensor(m.crow_indices(), m.col_indices(), m.values().clone(), m.shape)
                     for m in self._bsr)

    def dense_call(self, op, tensors):
        """cuBLAS on a random dense weight: cuBLAS runs faster on zeros, so a weight with the
        block-sparse matrix's zeros would overstate dense speed."""
        x, w, dy = tensors
        W = torch.randn(C, K, device=w.device).to(w.dtype)
        if op == "fprop":
            return lambda: x @ W
        if op == "bprop":
            return lambda: dy @ W.t()
        return lambda: x.t() @ dy

    def call(self, impl, op, tensors):
        x, w, dy = tensors
        if impl == "blocksparse":
            from blocksparse.torch._matmul import products
            if op == "fprop":
                return lambda: products.fprop(x, w, self.handle, 1, "ieee")
            if op == "bprop":
                return lambda: products.bprop(dy, w, self.handle, 1, "ieee")
            return lambda: products.updat(x, dy, self.handle, 1, "ieee", x.dtype)
        from torch.sparse._triton_ops import bsr_dense_mm, sampled_addmm
        wt_bsr, w_bsr = self.bsr(w)
        if op == "fprop":
            xt = x.t().contiguous()
            return lambda: bsr_dense_mm(wt_bsr, xt)          # y^T = W^T x^T
        if op == "bprop":
            dyt = dy.t().contiguous()
            return lambda: bsr_dense_mm(w_bsr, dyt)          # dx^T = W dy^T
        xt = x.t().contiguous()
        return lambda: sampled_addmm(w_bsr, xt, dy, beta=0.0, alpha=1.0)  # (x^T dy) on W's blocks

    def result(self, impl, op, out):
        """The output in the reference's form (y, dx activations; dw packed blocks)."""
        if impl == "blocksparse":
            return out
        if op == "updat":
            return out.values()
        return out.t()

    def config(self, op):
        from blocksparse.torch._matmul import products
        p = self.p
        a, b = {"fprop": (p.x, p.w), "bprop": (p.dy, p.w), "updat": (p.x, p.dy)}[op]
        plan = products.plan_of(op, a, b, self.handle, 1, "ieee", p.x.dtype if op == "updat" else None)
        return dict(asdict(plan.config), max_segment=plan.max_segment, split=plan.split, path=plan.path,
                    launches=plan.launches)


def _warm(chunk):
    """Worker: run each (problem, impl, op) once to fill Triton's caches; return failures."""
    fails = []
    for n, dt, bs, d in chunk:
        try:
            case = Case(n, dt, bs, d)
        except Exception as exc:
            fails.append(((n, dt, bs, d), repr(exc)[:200]))
            continue
        for impl in IMPLS:
            for op in OPS:
                try:
                    case.call(impl, op, case.operands())()
                except Exception as exc:
                    fails.append(((n, dt, bs, d, impl, op), repr(exc)[:200]))
    torch.cuda.synchronize()
    return fails


#: A graph timing replays its graph for about this long (3 to 10 replays): at 10 replays each,
#: PyTorch BSR's slow calls at N = 8192 (its updat at blocks of 16, float32 at blocks of 128: 10-90
#: ms a call) took about half of a run's timing (estimated from the medians of
#: ``bsmm-h200-prefetch.json``).
GRAPH_BUDGET_MS = 40.0


def graph_replays(replay_ms):
    """Replays of a graph whose one replay took ``replay_ms``: :data:`GRAPH_BUDGET_MS` worth, 3 to 10."""
    return max(3, min(10, math.ceil(GRAPH_BUDGET_MS / max(replay_ms, 1e-6))))


class Timer:
    """Times one callable, again and again: events around calls for many tokens (compute bound);
    for few tokens a CUDA graph over enough operand copies to overflow the L2 four times (replays
    per timing from the first round's: :func:`graph_replays`)."""

    def __init__(self, n, build, per_set_bytes, graph=False):
        self.graph, self.replays = None, 3
        self.fn = build(False)
        if n <= SMALL_N or graph:
            copies = max(2, min(64, math.ceil(4 * 60 * 2**20 / per_set_bytes)))
            try:
                self.graph = common.GraphTimer(lambda: [build(True) for _ in range(copies)])
            except Exception:  # a call that cannot be captured: events (launch latency included)
                torch.cuda.synchronize()
        self.kind = "graph" if self.graph else "events"

    def ms(self, first=False):
        if self.graph:
            ms = self.graph.median_ms(replays=self.replays)
            if first:
                self.replays = graph_replays(ms * self.graph.calls)
            return ms
        # the first round warms up for 100 ms: clocks take a while to rise after host-side work
        return common.time_ms(self.fn, warmup=100 if first else 10, rep=40)


def eager_ms(fn, calls=50):
    """Median ms per call of back-to-back eager calls (events around ``calls``), host time included."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


#: A problem whose timings spread by more than this after ``--rounds`` rounds gets as many rounds
#: again (the two full runs of 2026-12-03 disagreed by over 5% only on such rows; about a third of
#: the problems, nearly all at N = 8192: a run takes about a minute longer).
NOISY_SPREAD = 0.10


def interleaved(timers, rounds):
    """(median ms, spread, rounds) of each timer over ``rounds`` rounds; each round times every
    timer once, in an order rotated per round, so a clock change shifts all implementations of a
    problem alike.  Where any timer spread by more than :data:`NOISY_SPREAD`, ``rounds`` more rounds
    follow for all of them: a median of twice as many timings."""
    names = list(timers)
    times = {name: [] for name in names}

    def spread(t):
        return (max(t) - min(t)) / min(t)

    total = rounds
    r = 0
    while r < total:
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            times[name].append(timers[name].ms(first=r == 0))
        r += 1
        if r == rounds and any(spread(t) > NOISY_SPREAD for t in times.values()):
            total = 2 * rounds
    return {name: (statistics.median(t), spread(t), len(t)) for name, t in times.items()}


def _nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(hbm_gbs, save, dtypes, rounds):
    """Check, then time everything, problem by problem: dense, ours and PyTorch BSR interleaved
    in ``rounds`` rounds per problem; ``save(rows)`` is called after each problem (partial
    results survive an interrupted run)."""
    rows = []
    for n, dt, bs, d in problems(dtypes):
        t_problem = time.time()
        case = Case(n, dt, bs, d)
        p = case.p
        operand_bytes = _nbytes(p.x, p.w, p.dy)
        # all checks first (float64 references are heavy), then all timings
        checked = {}
        for op in OPS:
            for impl in IMPLS:
                row = dict(impl=impl, op=op, dtype=dt, bs=bs, density=d, N=n, C=C, K=K,
                           real_density=round(p.density, 4))
                try:
                    with common.poisoned_empty():
                        out = case.call(impl, op, case.operands())()
                    row["rel_err"] = common.rel_err(case.result(impl, op, out), p.ref(op))
                    row["ok"] = row["rel_err"] <= common.tolerance(p.dtype)
                except Exception as exc:  # recorded, never hidden
                    row["error"] = repr(exc)[:300]
                    torch.cuda.synchronize()
                checked[(impl, op)] = row
        case.p._refs.clear()
        setup_s = round(time.time() - t_problem, 2)  # operands, layout, float64 references and checks
        for op in OPS:
            t_op = time.time()
            timers = {"dense": Timer(n, lambda copy: case.dense_call(op, case.operands(copy)),
                                     operand_bytes + C * K * p.x.element_size())}
            for impl in IMPLS:
                if "error" not in checked[(impl, op)]:
                    try:
                        timers[impl] = Timer(n, lambda copy, impl=impl: case.call(impl, op, case.operands(copy)),
                                             operand_bytes, graph=impl == "torch-bsr")
                    except Exception as exc:
                        checked[(impl, op)]["error"] = repr(exc)[:300]
                        torch.cuda.synchronize()
            try:
                medians = interleaved(timers, rounds)
            except Exception as exc:
                torch.cuda.synchronize()
                for impl in IMPLS:
                    checked[(impl, op)].setdefault("error", repr(exc)[:300])
                medians = {}
            timing_s = round(time.time() - t_op, 2)  # the op's timers and rounds, all implementations
            if "dense" in medians:
                dense_ms, spread, taken = medians["dense"]
                dense_tflops = 2.0 * n * C * K / dense_ms / 1e9
                rows.append(dict(impl="dense", op=op, dtype=dt, bs=bs, density=d, N=n, C=C, K=K,
                                 ms=dense_ms, spread=spread, rounds=taken, tflops=dense_tflops,
                                 frac_of_dense=1.0, timer=timers["dense"].kind, timing_s=timing_s,
                                 setup_s=setup_s))
                if n <= SMALL_N:
                    rows[-1]["eager_ms"] = eager_ms(timers["dense"].fn)
                print(json.dumps(rows[-1]), flush=True)
            for impl in IMPLS:
                row = checked[(impl, op)]
                if impl in medians and "dense" in medians:
                    ms, spread, taken = medians[impl]
                    row.update(ms=ms, spread=spread, rounds=taken, timer=timers[impl].kind, dense_ms=dense_ms,
                               tflops=p.useful_flops / ms / 1e9, timing_s=timing_s)
                    row["frac_of_problem_dense"] = row["tflops"] / dense_tflops
                    if n <= SMALL_N:
                        row["hbm_frac"] = bytes_moved(p, op) / ms / 1e6 / hbm_gbs
                        row["eager_ms"] = eager_ms(timers[impl].fn)
                    if impl == "blocksparse":
                        row["config"] = case.config(op)
                rows.append(row)
                print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
        pool_dense(rows)
        save(rows)
    return rows


def pool_dense(rows):
    """Set ``pooled_dense_ms`` (the median dense time of the rows' op, dtype and N) and, from it,
    ``frac_of_dense`` on every timed row."""
    def group(r):
        return r["op"], r["dtype"], r["N"]

    dense = {}
    for r in rows:
        if r["impl"] == "dense" and "ms" in r:
            dense.setdefault(group(r), []).append(r["ms"])
    pooled = {g: statistics.median(ms) for g, ms in dense.items()}
    for r in rows:
        if "ms" in r and r["impl"] != "dense" and group(r) in pooled:
            r["pooled_dense_ms"] = pooled[group(r)]
            dense_tflops = 2.0 * r["N"] * C * K / pooled[group(r)] / 1e9
            r["frac_of_dense"] = r["tflops"] / dense_tflops


def bytes_moved(p, op):
    """Fewest bytes an op must move: the nonzero weights (or dW) plus activations in and out."""
    e = p.x.element_size()
    return p.layout.blocks * p.bs * p.bs * e + p.N * (p.C + p.K) * e


def markdown(meta, rows, stem="bsmm-h200"):
    """The committed table: per N and dtype, frac_of_dense of ours and PyTorch BSR per op."""
    out = [f"# Block-sparse matmul on {meta['device']}", "",
           f"torch {meta['torch']}, triton {meta['triton']}; C = K = {C}; {meta['date']}.  "
           "`frac` = useful TFLOP/s over dense cuBLAS TFLOP/s of the same op, shape and dtype "
           "measured in the same run: the median of the dense times measured beside each problem "
           "(1.0 = exactly density-times faster than dense).  PyTorch BSR is timed in CUDA graphs "
           "(its kernels alone, no Python).  "
           f"Produced by `bench/bsmm.py`; raw rows in `{stem}.json`.", "",
           f"Ceilings measured in this run: HBM copy {meta['hbm_gbs']:.0f} GB/s, "
           f"L2 read {meta['l2_gbs']:.0f} GB/s.", ""]
    index = {(r["impl"], r["op"], r["dtype"], r["bs"], r["density"], r["N"]): r for r in rows}
    for n in NS:
        for dt in meta.get("dtypes", common.DTYPES):
            dense = {op: sorted(r["ms"] for r in rows if (r["impl"], r["op"], r["dtype"], r["N"]) ==
                                ("dense", op, dt, n)) for op in OPS}
            label = "compute bound" if n > SMALL_N else "memory bound"
            if not any((r["dtype"], r["N"]) == (dt, n) for r in rows):
                out += [f"## N = {n} ({label}), {dt}", "", "Not reached in this run.", ""]
                continue
            eager = n <= SMALL_N  # host time matters here: an eager column (µs per call, back to back)
            head = " | ".join(f"{op} ours | {op} ours eager µs | {op} bsr" if eager else f"{op} ours | {op} bsr"
                              for op in OPS)
            dense_eager = {op: sorted(1000 * r["eager_ms"] for r in rows if "eager_ms" in r and
                                      (r["impl"], r["op"], r["dtype"], r["N"]) == ("dense", op, dt, n)) for op in OPS}
            eager_text = ("; eager µs: " + ", ".join(f"{op} {dense_eager[op][0]:.1f}-{dense_eager[op][-1]:.1f}"
                                                     for op in OPS if dense_eager[op])) if eager else ""
            out += [f"## N = {n} ({label}), {dt}", "",
                    "dense ms (per problem, measured beside ours; median [min-max]): " + ", ".join(
                        f"{op} {statistics.median(dense[op]):.4f} [{dense[op][0]:.4f}-{dense[op][-1]:.4f}]"
                        for op in OPS if dense[op]) + eager_text, "",
                    f"| bs | density | {head} |", "|" + "---|" * (2 + (3 if eager else 2) * len(OPS))]
            for bs in BLOCK_SIZES:
                for d in DENSITIES:
                    cells = []
                    for op in OPS:
                        for impl in IMPLS:
                            r = index.get((impl, op, dt, bs, d, n))
                            if r is None:
                                cells.append("–")  # not reached (a run cut short)
                            elif "ms" not in r:
                                cells.append("err")
                            else:
                                mark = ("" if r.get("ok") else "!") + ("~" if r.get("spread", 0) > 0.1 else "")
                                hbm = f" ({r['hbm_frac']:.2f} hbm)" if n <= SMALL_N else ""
                                cells.append(f"{r['frac_of_dense']:.2f}{hbm}{mark}")
                            if eager and impl == "blocksparse":
                                cells.append(f"{1000 * r['eager_ms']:.1f}" if r and "eager_ms" in r else "–")
                    out.append(f"| {bs} | {d} | " + " | ".join(cells) + " |")
            out.append("")
    out += ["`!` marks a result outside the dtype's tolerance against float64 (none expected); `err` a "
            "call that raised (the row's `error`); `–` a problem the run did not reach; `~` one "
            f"whose interleaved timings spread by more than 10% (the median is shown; {meta.get('rounds', 5)} "
            "rounds, twice as many for a problem where any implementation spread so in the first ones, "
            "where the row records `rounds`).", ""]
    return "\n".join(out)


def agreement(rows_a, rows_b):
    """Per row of ours / PyTorch BSR present in both runs: the relative difference of
    ``frac_of_dense``; returns (largest, its row key, all differences)."""
    def key(r):
        return (r["impl"], r["op"], r["dtype"], r["bs"], r["density"], r["N"])

    b = {key(r): r for r in rows_b if "frac_of_dense" in r and r["impl"] != "dense"}
    diffs = {}
    for r in rows_a:
        if "frac_of_dense" in r and r["impl"] != "dense" and key(r) in b:
            diffs[key(r)] = abs(r["frac_of_dense"] - b[key(r)]["frac_of_dense"]) / b[key(r)]["frac_of_dense"]
    worst = max(diffs, key=diffs.get) if diffs else None
    return (diffs[worst] if worst else float("nan")), worst, diffs


def merge(parts):
    """One run's file from parts timed in separate calls (``--dtypes`` / ``--tokens`` subsets): the
    rows of all, the first part's meta with every part's dtypes and ceilings.  Parts must not share
    a (dtype, N): each problem's rows come from one call."""
    meta = {k: v for k, v in parts[0].items() if k != "rows"}
    seen, rows = {}, []
    for i, part in enumerate(parts):
        cells = {(r["dtype"], r["N"]) for r in part["rows"]}
        shared = sorted(cells & set(seen))
        if shared:
            raise ValueError(f"--merge: part {i} repeats (dtype, N) {shared[0]} of part {seen[shared[0]]}; "
                             "expected parts timing disjoint dtypes or token counts")
        seen.update({c: i for c in cells})
        rows += part["rows"]
    dtypes = {dt for part in parts for dt in part.get("dtypes", common.DTYPES)}
    meta.update(dtypes=[dt for dt in common.DTYPES if dt in dtypes],
                hbm_gbs=min(p["hbm_gbs"] for p in parts), l2_gbs=min(p["l2_gbs"] for p in parts),
                parts=[{k: p[k] for k in ("date", "dtypes", "hbm_gbs", "l2_gbs") if k in p} for p in parts])
    return dict(meta, rows=rows)


def save_run(out, stem, meta, rows):
    """Write ``stem``.json (meta and rows) and ``stem``.md (the table) into ``out``."""
    with open(os.path.join(out, stem + ".json"), "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    with open(os.path.join(out, stem + ".md"), "w") as f:
        f.write(markdown(meta, rows, stem))


def write_agreement(out, rows_a, rows_b):
    """Write ``bsmm-h200-agreement.json`` (largest disagreement, rows over 5%) into ``out``."""
    worst, where, diffs = agreement(rows_a, rows_b)
    summary = dict(largest_rel_diff=worst, row=where, rows_compared=len(diffs),
                   over_5_percent=sorted([list(k) + [v] for k, v in diffs.items() if v > 0.05],
                                         key=lambda x: -x[-1]))
    with open(os.path.join(out, "bsmm-h200-agreement.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"runs compared: largest frac_of_dense disagreement {worst:.1%} at {where}; "
          f"{len(summary['over_5_percent'])} of {len(diffs)} rows over 5%")


def main():
    global NS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--dtypes", default=",".join(common.DTYPES), help="comma-separated subset of bf16,fp16,fp32")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per problem")
    ap.add_argument("--tokens", default=",".join(map(str, NS)),
                    help="comma-separated token counts N (of 8192,64); a subset writes bsmm-h200-N<n>.*")
    ap.add_argument("--runs", type=int, default=1, help="full runs; with 2 the second is written as "
                    "bsmm-h200-run2.* and the largest disagreement of frac_of_dense is reported")
    ap.add_argument("--run", type=int, default=1, help="number of the first run (2: written as bsmm-h200-run2.*), "
                    "for runs made in separate sessions")
    ap.add_argument("--agree", nargs=2, metavar="JSON", help="no timing: compare two runs' JSON files and "
                    "write bsmm-h200-agreement.json into --out")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="no timing: join parts of one run timed in "
                    "separate calls (disjoint --dtypes / --tokens) into bsmm-h200[-runN].* in --out")
    args = ap.parse_args()
    if args.merge:
        parts = []
        for path in args.merge:
            with open(path) as f:
                parts.append(json.load(f))
        try:
            run = merge(parts)
        except ValueError as exc:
            ap.error(str(exc))
        rows = run.pop("rows")
        os.makedirs(args.out, exist_ok=True)
        save_run(args.out, "bsmm-h200" if args.run == 1 else f"bsmm-h200-run{args.run}", run, rows)
        print(f"merged {len(parts)} parts: {len(rows)} rows -> {args.out}")
        return
    if args.agree:
        runs = []
        for path in args.agree:
            with open(path) as f:
                runs.append(json.load(f)["rows"])
        write_agreement(args.out, *runs)
        return
    tokens = tuple(int(n) for n in args.tokens.split(",") if n)
    if not tokens or set(tokens) - set(NS):
        ap.error(f"--tokens must be a subset of {','.join(map(str, NS))}; got {args.tokens!r}")
    subset = "" if set(tokens) == set(NS) else "-N" + "-".join(map(str, tokens))
    NS = tokens
    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    unknown = set(dtypes) - set(common.DTYPES)
    if unknown or not dtypes:
        ap.error(f"--dtypes must be a subset of {','.join(common.DTYPES)}; got {args.dtypes!r}")
    subset += "" if set(dtypes) == set(common.DTYPES) else "-" + "-".join(dtypes)
    t0 = time.time()
    common.warm_in_workers(_warm, list(problems(dtypes)), args.workers)
    os.makedirs(args.out, exist_ok=True)
    import triton
    runs = []
    for run in range(args.run, args.run + args.runs):
        hbm, l2 = common.hbm_bandwidth_gbs(), common.l2_bandwidth_gbs()
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    date=time.strftime("%Y-%m-%d"), hbm_gbs=hbm, l2_gbs=l2, C=C, K=K, dtypes=dtypes,
                    rounds=args.rounds, run=run)
        base = f"bsmm-{common.gpu_tag()}"  # bsmm-h200 on the H200
        stem = (base if run == 1 else f"{base}-run{run}") + subset

        def save(rows, meta=meta, stem=stem):
            save_run(args.out, stem, meta, rows)

        rows = measure(hbm, save, dtypes, args.rounds)
        runs.append(rows)
        bad = [r for r in rows if r["impl"] != "dense" and not r.get("ok")]
        print(markdown(meta, rows))
        print(f"run {run}: {len(rows)} rows, {len(bad)} failed or inaccurate; {time.time() - t0:.0f}s")
        for r in bad:
            print("  BAD", json.dumps(r))
    if len(runs) > 1:
        write_agreement(args.out, runs[0], runs[1])


if __name__ == "__main__":
    main()
