"""Per-call latency of block-sparse layers as users call them -- eager and in CUDA graphs, forward and
forward + backward -- against the dense layers they replace, in one run.

    python bench/latency.py --out DIR [--quick] [--dtypes bf16,fp32]   # a GPU machine
    python bench/latency.py --out DIR --quick --cpu                    # smoke run: CPU, interpreter

Ours is measured twice: through the kernel library (``BLOCKSPARSE_KERNELS`` or the installed one;
ahead-of-time kernels, one ctypes call per launch) and through Triton's JIT (``BLOCKSPARSE_KERNELS=jit``
for the same layers, plans rebuilt).  Dense: ``x @ W`` (forward) and ``nn.Linear`` (forward and
forward + backward).  Shapes: the table of the eager-latency issue (N x C, block size, density;
C = K) and the pixelfly MLPs (Linear, GELU, Linear on input [16, 512, D]; blocks of 48 and 256 are not
supported: 16 / 32 and 128 instead), bf16 (and float32 for the table).

Per (case, implementation, mode), after a correctness check against float64 (NaN-poisoned outputs):

* ``eager_us``: CUDA events around R back-to-back calls, divided by R: what a training loop sees, the
  larger of host and GPU time.
* ``graph_us``: the same R calls captured in one CUDA graph and replayed: GPU time alone.
* ``host_us``: the Python time of R calls while the GPU is kept busy by a sleep kernel queued first
  (``torch.cuda._sleep``), so no call waits for the GPU: host time alone.  ``eager - graph`` is
  reported too.
* ``launches``: kernels one call of ours starts (products, zero fills, casts, weight transposes).

Each metric is the median of 5 rounds (3 with ``--quick``) that interleave the implementations of a
case -- dense and ours, through the kernel library and the JIT -- so a slow spell of the host (a
bare view took 4.6 µs on the H200's host) hits them alike; switching between the two paths rebuilds
ours' plans and forgets the layers' native records.

Expected duration on an H200: about 2 minutes (Triton's JIT compiles included; ~40 s with
``--quick``).  Writes ``latency.json`` (rows written after every case: partial results survive) and
``latency.md`` into ``--out``.  Every case and measurement that fails is recorded and the run goes on.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

#: The eager-latency issue's table: (N tokens, C = K features, block size, density).
TABLE = ((64, 1024, 32, 0.25), (64, 4096, 32, 0.25), (8192, 1024, 32, 0.25), (8192, 384, 16, 0.5),
         (64, 4096, 128, 0.25))
#: Pixelfly MLPs: (name, features in / hidden / out, block sizes, tokens = 16 * 512).
MLPS = (("pixelfly-small", (384, 1536, 384), (16, 32)), ("pixelfly-large", (2048, 8192, 4096), (128,)))
MLP_TOKENS = 16 * 512
MLP_DENSITY = 0.25
#: Goals of the issue, checked in the summary.
HOST_GOAL_US = 30.0
RATIO_GOAL = 1.2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--quick", action="store_true", help="a few cases, few repeats (smoke run)")
    ap.add_argument("--cpu", action="store_true", help="CPU tensors, Triton's interpreter, tiny shapes, "
                                                      "host timers only (checks the script, measures nothing)")
    ap.add_argument("--dtypes", default="bf16,fp32", help="bf16 for everything, fp32 for the table")
    return ap.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.cpu:
    os.environ["TRITON_INTERPRET"] = "1"       # before any kernel is imported
    os.environ["BLOCKSPARSE_BACKEND"] = "triton"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from blocksparse import build_info  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul  # noqa: E402
from blocksparse.torch._matmul import plan as _plan  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# --------------------------------------------------------------------------- timers


class Timer:
    """The three measurements of one callable; on the CPU (``--cpu``) only host time."""

    def __init__(self, device, calls, repeats):
        self.device, self.calls, self.repeats = device, calls, repeats
        self.gpu = device.type == "cuda"
        self._sleep_cycles = self._calibrate() if self.gpu else 0

    def _calibrate(self):
        """Cycles of ``torch.cuda._sleep`` per millisecond."""
        cycles = 10_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / max(start.elapsed_time(end), 1e-3)

    def eager_us(self, fn):
        if not self.gpu:
            return self.host_us(fn)
        times = []
        for _ in range(self.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / self.calls)
        return statistics.median(times)

    def graph_us(self, fn):
        if not self.gpu:
            return math.nan
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm the stream's allocator pool before capture
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(self.calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / self.calls)
        del graph
        return statistics.median(times)

    def host_us(self, fn):
        """Python time per call; on a GPU with a sleep kernel queued first, long enough that no
        call waits for the device (the queue never fills: a few hundred launches)."""
        times = []
        for _ in range(self.repeats):
            if self.gpu:
                torch.cuda.synchronize()
                torch.cuda._sleep(int(self._sleep_cycles * max(20.0, self.calls * 0.5)))
            start = time.perf_counter()
            for _ in range(self.calls):
                fn()
            times.append((time.perf_counter() - start) * 1e6 / self.calls)
            if self.gpu:
                torch.cuda.synchronize()
        return statistics.median(times)


# --------------------------------------------------------------------------- cases


def _tensor(rng, shape, dtype, device, scale=1.0):
    return (torch.from_numpy(rng.standard_normal(shape) * scale)).to(device=device, dtype=dtype)


class LinearCase:
    """One layer ``(N, C) -> (N, C)``: ours (BlocksparseLinear, BlocksparseMatMul), dense
    (nn.Linear, x @ W)."""

    def __init__(self, n, c, bs, density, dtype, device, seed):
        rng = np.random.default_rng(seed)
        self.name = f"{n} x {c}, bs{bs}, d={density}"
        self.key = dict(kind="linear", N=n, C=c, bs=bs, density=density)
        self.layout = random_layout(rng, c // bs, c // bs, density, cover=True)
        self.ours = BlocksparseLinear(self.layout, block_size=bs, device=device, dtype=dtype)
        self.bsmm = self.ours.bsmm
        self.dense = torch.nn.Linear(c, c, device=device, dtype=dtype)
        self.w_dense = _tensor(rng, (c, c), dtype, device, 1 / math.sqrt(c))
        self.x = _tensor(rng, (n, c), dtype, device).requires_grad_()
        self.dy = _tensor(rng, (n, c), dtype, device)

    def modules(self):
        return [self.ours]

    def fwd(self, impl):
        x, ours = self.x, self.ours
        if impl == "dense-matmul":
            w = self.w_dense
            return lambda: x @ w
        if impl == "dense-linear":
            return lambda: self.dense(x)
        if impl == "ours-matmul":
            w = ours.weight
            return lambda: self.bsmm(x, w)
        return lambda: ours(x)

    def fwdbwd(self, impl):
        layer = self.dense if impl == "dense-linear" else self.ours
        inputs = (self.x, *layer.parameters())
        dy = self.dy
        return lambda: torch.autograd.grad(layer(self.x), inputs, dy)

    def check(self):
        """Relative errors of ours (y, dx, dW) against float64."""
        lay, w = self.ours.layout, self.ours.weight
        with poisoned_empty():
            y = self.ours(self.x)
            dx, dw, _ = torch.autograd.grad(y, (self.x, w, self.ours.bias), self.dy)
        x, dy = self.x.detach().double().cpu().numpy(), self.dy.double().cpu().numpy()
        dense = lay.dense(w.detach().double().cpu().numpy())
        refs = (x @ dense + self.ours.bias.detach().double().cpu().numpy(), dy @ dense.T, lay.pack(x.T @ dy))
        return {name: rel_error(got, ref) for name, got, ref in zip(("y", "dx", "dw"), (y, dx, dw), refs)}


class MlpCase:
    """Linear, GELU, Linear on input [16, 512, D]: ours (BlocksparseLinear) vs nn.Linear."""

    def __init__(self, name, dims, bs, dtype, device, seed, tokens=MLP_TOKENS):
        rng = np.random.default_rng(seed)
        d_in, hidden, d_out = dims
        self.name = f"{name} {d_in}-{hidden}-{d_out}, bs{bs}, d={MLP_DENSITY}"
        self.key = dict(kind="mlp", N=tokens, C=d_in, H=hidden, K=d_out, bs=bs, density=MLP_DENSITY)
        lay1 = random_layout(rng, d_in // bs, hidden // bs, MLP_DENSITY, cover=True)
        lay2 = random_layout(rng, hidden // bs, d_out // bs, MLP_DENSITY, cover=True)
        factory = dict(device=device, dtype=dtype)
        self.ours = torch.nn.Sequential(BlocksparseLinear(lay1, bs, **factory), torch.nn.GELU(),
                                        BlocksparseLinear(lay2, bs, **factory))
        self.dense = torch.nn.Sequential(torch.nn.Linear(d_in, hidden, **factory), torch.nn.GELU(),
                                         torch.nn.Linear(hidden, d_out, **factory))
        batch = (16, tokens // 16)
        self.x = _tensor(rng, (*batch, d_in), dtype, device).requires_grad_()
        self.dy = _tensor(rng, (*batch, d_out), dtype, device)

    def modules(self):
        return [self.ours[0], self.ours[2]]

    def fwd(self, impl):
        layer = self.dense if impl.startswith("dense") else self.ours
        return lambda: layer(self.x)

    def fwdbwd(self, impl):
        layer = self.dense if impl.startswith("dense") else self.ours
        inputs = (self.x, *layer.parameters())
        return lambda: torch.autograd.grad(layer(self.x), inputs, self.dy)

    def check(self):
        """Relative error of ours against the same MLP in float64 (dense weights from the blocks)."""
        with poisoned_empty():
            y = self.ours(self.x)
        h = self.x.detach().double().cpu().numpy().reshape(-1, self.key["C"])
        for i, layer in enumerate(self.modules()):
            w = layer.layout.dense(layer.weight.detach().double().cpu().numpy())
            h = h @ w + layer.bias.detach().double().cpu().numpy()
            if i == 0:
                h = torch.nn.functional.gelu(torch.from_numpy(h)).numpy()
        return {"y": rel_error(y.reshape(h.shape), h)}


def cases(args, device):
    quick, cpu = args.quick, args.cpu
    dtypes = args.dtypes.split(",")
    if cpu:  # shapes the interpreter gets through in seconds
        yield LinearCase(4, 64, 32, 0.5, torch.float32, device, 0)
        yield MlpCase("pixelfly-tiny", (32, 64, 32), 16, torch.float32, device, 1, tokens=32)
        return
    table = TABLE[:1] if quick else TABLE
    for dt in dtypes:
        for i, (n, c, bs, d) in enumerate(table):
            yield LinearCase(n, c, bs, d, DTYPES[dt], device, seed=i)
    if "bf16" in dtypes:
        for name, dims, sizes in MLPS[:1] if quick else MLPS:
            for bs in sizes[:1] if quick else sizes:
                yield MlpCase(name, dims, bs, torch.bfloat16, device, seed=bs)


# --------------------------------------------------------------------------- measuring


def use_path(path, case):
    """Make ours launch through the kernel library (``aot``) or Triton's JIT: rebuild its plans and
    forget the layers' native records (the eager fast path would otherwise keep the other path's)."""
    if path == "jit":
        os.environ["BLOCKSPARSE_KERNELS"] = "jit"
    elif SAVED_KERNELS is None:
        os.environ.pop("BLOCKSPARSE_KERNELS", None)
    else:
        os.environ["BLOCKSPARSE_KERNELS"] = SAVED_KERNELS
    for layer in case.modules():
        _plan.state(layer.bsmm._handle).plans.clear()
        layer._dispatch._native.clear()
        layer._dispatch._fast.clear()


def plans_of(case):
    """The paths and launches per call of ours' plans (after a fwd+bwd)."""
    plans = [p for layer in case.modules() for p in _plan.state(layer.bsmm._handle).plans.values()]
    return {"paths": sorted({f"{p.kind}:{p.path}" for p in plans}), "launches": sum(p.launches for p in plans)}


def sample(case, impl, timer, into):
    """One round of ``impl``'s measurements, appended to ``into`` (metric -> samples); errors recorded."""
    for mode, make in (("fwd", case.fwd), ("fwdbwd", case.fwdbwd)):
        if mode == "fwdbwd" and impl not in ("ours", "dense-linear"):
            continue
        try:
            fn = make(impl)
            with torch.no_grad() if mode == "fwd" else _nothing():
                for _ in range(3):
                    fn()
                if timer.gpu:
                    torch.cuda.synchronize()
                for metric in ("eager", "graph", "host"):
                    into.setdefault(f"{mode}_{metric}_us", []).append(getattr(timer, f"{metric}_us")(fn))
        except Exception as exc:  # recorded, never hidden; the run goes on
            into[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"[:400]
            if timer.gpu:
                torch.cuda.synchronize()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_case(case, timer, paths, dtype, rounds):
    """Every implementation of ``case`` measured in ``rounds`` interleaved rounds (so a slow spell
    of the host hits them alike), the median of each metric reported."""
    slots = [(impl, "-") for impl in (("dense-matmul", "dense-linear") if isinstance(case, LinearCase)
                                      else ("dense-linear",))]
    extra, rows = {}, []
    for path in paths:
        use_path(path, case)
        try:
            errors = case.check()
        except Exception as exc:
            rows.append(dict(case.key, case=case.name, impl="ours", path=path, error=repr(exc)[:400]))
            continue
        ok = all(e < 2 * tolerance(dtype) for e in errors.values())
        for impl in ("ours", "ours-matmul") if isinstance(case, LinearCase) else ("ours",):
            slots.append((impl, path))
            extra[(impl, path)] = dict(rel_err=errors, ok=ok, **plans_of(case))
    samples = {slot: {} for slot in slots}
    current = paths[-1]  # the path the checks left set
    for _ in range(rounds):
        for impl, path in slots:
            if path not in ("-", current):
                use_path(path, case)
                current = path
            sample(case, impl, timer, samples[(impl, path)])
    for impl, path in slots:
        row = dict(case.key, case=case.name, impl=impl, path=path, dtype=str(dtype).replace("torch.", ""),
                   rounds=rounds)
        for key, values in samples[(impl, path)].items():
            row[key] = values if key.endswith("_error") else statistics.median(values)
        for mode in ("fwd", "fwdbwd"):
            if f"{mode}_eager_us" in row:
                row[f"{mode}_overhead_us"] = row[f"{mode}_eager_us"] - row[f"{mode}_graph_us"]
        row.update(extra.get((impl, path), {}))
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- report


def _fmt(value):
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


def summary(rows):
    """The issue's goals, checked on the rows of the kernel-library path."""
    lines = []
    ours = [r for r in rows if r["impl"] == "ours" and r.get("path") == "aot" and "fwd_host_us" in r]
    index = {(r["case"], r["dtype"], r["impl"], r.get("path")): r for r in rows}
    layers = [r for r in ours if r.get("kind") != "mlp"]  # an MLP's forward is two layers and a GELU
    if layers:
        worst = max(layers, key=lambda r: r["fwd_host_us"])
        dense = [index[(r["case"], r["dtype"], "dense-linear", "-")].get("fwd_host_us", math.nan) for r in layers
                 if (r["case"], r["dtype"], "dense-linear", "-") in index]
        floor = f"; nn.Linear's forward in the same run: {min(dense):.1f}-{max(dense):.1f} µs" if dense else ""
        lines.append(f"- host time per layer forward (ours, kernel library): at most {worst['fwd_host_us']:.1f} µs "
                     f"({worst['case']}, {worst['dtype']}); goal <= {HOST_GOAL_US:.0f} µs: "
                     f"{'met' if worst['fwd_host_us'] <= HOST_GOAL_US else 'NOT met'}{floor}")
    for r in ours:
        dense = index.get((r["case"], r["dtype"], "dense-linear", "-"), {})
        if "fwdbwd_eager_us" not in r or "fwdbwd_eager_us" not in dense:
            continue
        ratio = r["fwdbwd_eager_us"] / dense["fwdbwd_eager_us"]
        faster_kernels = r.get("fwdbwd_graph_us", math.inf) < dense.get("fwdbwd_graph_us", 0)
        goal = ratio <= 1.0 if (r["N"], r.get("C"), r["bs"]) == (8192, 1024, 32) else ratio <= RATIO_GOAL
        if faster_kernels or (r["N"], r.get("C"), r["bs"]) == (8192, 1024, 32):
            lines.append(f"- {r['case']} {r['dtype']}: fwd+bwd eager {ratio:.2f}x nn.Linear "
                         f"({'met' if goal else 'NOT met'})")
    return lines


def markdown(meta, rows):
    out = [f"# Per-call latency on {meta['device']}", "",
           f"torch {meta['torch']}, triton {meta['triton']}; {meta['date']}; kernel library: "
           f"{meta['kernels']}.  Produced by `bench/latency.py` (method in its docstring); raw rows "
           "in `latency.json`.  µs per call: eager = what a loop sees, graph = GPU time (CUDA graph), "
           "host = Python time with the GPU kept busy; `launches` = kernels per fwd+bwd of ours.", ""]
    out += ["| case | dtype | impl | path | fwd eager | fwd graph | fwd host | fwd+bwd eager | fwd+bwd graph | "
            "fwd+bwd host | launches | ok |", "|" + "---|" * 12]
    for r in rows:
        ok = "" if "ok" not in r else ("yes" if r["ok"] else "NO")
        error = " (" + (r.get("error") or r.get("fwd_error") or r.get("fwdbwd_error") or "") + ")"
        out.append(f"| {r['case']} | {r.get('dtype', '')} | {r['impl']} | {r.get('path', '')} | "
                   f"{_fmt(r.get('fwd_eager_us'))} | {_fmt(r.get('fwd_graph_us'))} | {_fmt(r.get('fwd_host_us'))} | "
                   f"{_fmt(r.get('fwdbwd_eager_us'))} | {_fmt(r.get('fwdbwd_graph_us'))} | "
                   f"{_fmt(r.get('fwdbwd_host_us'))} | {r.get('launches', '')} | "
                   f"{ok}{error if error != ' ()' else ''} |")
    out += ["", "Goals (the eager-latency issue):", "", *summary(rows), ""]
    return "\n".join(out)


SAVED_KERNELS = os.environ.get("BLOCKSPARSE_KERNELS")


def _where(path):
    """``path`` relative to the repository when inside it (results name no machine's folders)."""
    if path and os.path.isabs(path) and path.startswith(os.path.dirname(HERE) + os.sep):
        return os.path.relpath(path, os.path.dirname(HERE))
    return path


def main(args):
    t0 = time.time()
    device = torch.device("cpu" if args.cpu else "cuda")
    if not args.cpu and not torch.cuda.is_available():
        print("latency: no CUDA GPU; --cpu runs the smoke test", file=sys.stderr)
        return 2
    kernels = build_info()["kernels"]
    paths = ("aot", "jit") if kernels["launch"] == "aot" and not args.cpu else ("jit",)
    calls, rounds = (2, 1) if args.cpu else (20, 3) if args.quick else (50, 5)
    timer = Timer(device, calls, 1)
    import triton

    meta = dict(device=torch.cuda.get_device_name() if timer.gpu else "CPU (smoke run)", torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"), calls=calls, rounds=rounds,
                kernels=_where(kernels.get("library")) or f"none ({kernels.get('reason', '')})", paths=paths)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for case in cases(args, device):
        dtype, first = case.x.dtype, len(rows)
        try:
            rows += run_case(case, timer, paths, dtype, rounds)
        except Exception as exc:
            rows.append(dict(case.key, case=case.name, impl="?", error=f"{type(exc).__name__}: {exc}"[:400]))
            traceback.print_exc()
        for r in rows[first:]:
            print(json.dumps(r), flush=True)
        with open(os.path.join(args.out, "latency.json"), "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
        with open(os.path.join(args.out, "latency.md"), "w") as f:
            f.write(markdown(meta, rows))
        del case
        if timer.gpu:
            torch.cuda.empty_cache()
    print(markdown(meta, rows))
    bad = [r for r in rows if "error" in r or r.get("ok") is False or any(k.endswith("_error") for k in r)]
    print(f"{len(rows)} rows, {len(bad)} failed or inaccurate; {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
