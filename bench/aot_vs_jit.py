"""Ahead-of-time kernels vs the same kernels through Triton's JIT, on bsmm.py's problems (GPU).

    python bench/aot_vs_jit.py --out bench/results               # H200: ~4 min (+ ~3 min build)
    python bench/aot_vs_jit.py --out /tmp/aot --quick             # bf16, bs 32 / 64, d 0.25: ~1 min
    python bench/aot_vs_jit.py --out /tmp/smoke --quick --cpu     # anywhere: tiny sizes, interpreter
    python bench/aot_vs_jit.py --out DIR --dtypes fp32 --block-sizes 32   # a subset -> aot-vs-jit-h200-fp32-32.*

For C = K = 4096, N = 8192 and N = 64 (``bench/bsmm.py``'s problems: densities 0.1 / 0.25 / 0.5,
block sizes 16-128, bf16 / fp16 / fp32) and each product, the PyTorch plan of the call is built
against the kernel library (the spec, tile, split and tables an eager call gets: the few-token
specs for N = 64), and its launch runs two ways on the same buffers:

* ``aot``  the compiled spec through the kernel library's generated launcher (``bsk_launch``; the
  launch the PyTorch plans and, through ``src/ops/matmul.c``, the TensorFlow ops make);
* ``jit``  the same kernel, tile, grid and arguments through Triton's JIT.

The JIT kernels are compiled first in ``--workers`` processes. Every row is first checked: both
outputs (NaN-poisoned buffers) against float64, and against each other. Then the two are timed
interleaved in ``--rounds`` rounds (rotated order each round) and the medians kept; ``aot_over_jit``
= aot ms / jit ms (1.03: the compiled kernel 3% slower). N = 8192 calls are timed with events around
each call, N = 64 calls in a CUDA graph over operand copies that overflow the L2 (weights from
device memory), as in bsmm.py. A failing row is recorded and the run goes on; results are written
after every problem.

The kernel library: ``--kernels PATH``, else ``BLOCKSPARSE_KERNELS`` / the installed one, else one
built now for this GPU's arch and the problems' dtypes and block sizes (a few minutes; say
``--build-dir`` to keep it).  ``--cpu``: Triton's interpreter on tiny sizes, with a small library
built for sm_90 -- the plans and their packed launches are made, and the ``aot`` column runs the
JIT (no GPU to launch on): a smoke run of the script, no timing worth reading.
Writes ``aot-vs-jit-h200.{json,md}`` (``aot-vs-jit-cpu.*`` with ``--cpu``) into ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "--cpu" in sys.argv:  # before Triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import common  # noqa: E402

from blocksparse.ops.matmul import configs  # noqa: E402

OPS = ("fprop", "bprop", "updat")
FULL = dict(C=4096, ns=(8192, 64), densities=(0.1, 0.25, 0.5), block_sizes=(16, 32, 64, 128),
            dtypes=("bf16", "fp16", "fp32"))
QUICK = dict(FULL, densities=(0.25,), block_sizes=(32, 64), dtypes=("bf16",))
CPU = dict(C=128, ns=(64, 16), densities=(0.5,), block_sizes=(32,), dtypes=("bf16",))
#: the issue's bar: compiled kernels within 3% of the JIT ones
LIMIT = 1.03


def kernel_library(args, archs, sizes):
    """The kernel library to time, and how it was found."""
    from blocksparse.aot.abi import KernelLibrary
    from blocksparse.torch import _launch

    if args.kernels:
        return KernelLibrary(args.kernels), args.kernels
    if not args.cpu:
        found = _launch.library()
        if found is not None:
            return found, found.path
    import subprocess

    from blocksparse.aot.native import KERNELS_LIBRARY

    # a process of its own: compiling ahead of time needs Triton without its interpreter
    work = args.build_dir or tempfile.mkdtemp(prefix="blocksparse-bench-")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "blocksparse.aot", "--out", work, "--library", "--families", "matmul",
               "--archs", ",".join(f"sm_{a}" for a in archs), "--dtypes", ",".join(sizes["dtypes"]),
               "--block-sizes", ",".join(map(str, sizes["block_sizes"]))]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    path = os.path.join(work, KERNELS_LIBRARY)
    print(f"built {path} in {time.perf_counter() - start:.0f} s", flush=True)
    return KernelLibrary(path), str(path)


class Row:
    """One product of one problem: its plan against the kernel library, and the two runners."""

    def __init__(self, problem, op, kernels, info, cpu):
        from blocksparse.torch._launch import JitLaunch
        from blocksparse.torch._matmul import plan as plans

        self.p, self.op = problem, op
        p = problem
        a, b = {"fprop": (p.x, p.w), "bprop": (p.dy, p.w), "updat": (p.x, p.dy)}[op]
        dw_dtype = p.dtype if op == "updat" else None
        self.plan = plans._build(plans.LayoutState(p.layout), op, a, b, 1, "ieee", dw_dtype, True,
                                 target=(kernels, info))
        if self.plan.path != "aot":
            raise RuntimeError(f"no compiled spec serves this call: {self.plan.runner.reason}")
        self.spec = kernels.specs[self.plan.runner.spec_index]
        self.runners = {"aot": JitLaunch(self.plan.runner.launch) if cpu else self.plan.runner,
                        "jit": JitLaunch(self.plan.runner.launch)}
        self.inputs = (a, b.transpose(1, 2).contiguous() if self.plan.pretranspose else b)

    def tensors(self, copy=False):
        """(input, weight or dy, output buffer) of one launch, NaN-poisoned; a split finished in
        the kernel also gets the stream's zeroed scratch (operands 4 and 5, as a plan passes it)."""
        from blocksparse.torch import _scratch

        a, b = (t.clone() for t in self.inputs) if copy else self.inputs
        out = torch.full(self.plan.out_shape, float("nan"), dtype=self.plan.out_dtype, device=a.device)
        if self.plan.scratch is None:
            return a, b, out
        return (a, b, out, a, *_scratch.scratch(a.device, *self.plan.scratch))

    def result(self, name):
        """The product by runner ``name``, in the caller's dtype."""
        tensors = self.tensors()
        self.runners[name](tensors)
        out = tensors[2]
        return out if self.plan.cast_to is None else out.to(self.plan.cast_to)

    def describe(self):
        plan, spec = self.plan, self.spec
        return dict(spec=spec["name"], max_tokens=spec.get("max_tokens", 0), atomic=spec["atomic"],
                    ticket=spec.get("ticket", False),
                    split=plan.split, max_segment=plan.max_segment, config=dataclasses.asdict(plan.config))


class Timer:
    """Times one runner on fresh buffers: events around calls for many tokens, a CUDA graph over
    operand copies for few (``bench/bsmm.py``'s timers); wall clock on the CPU."""

    def __init__(self, row, name, cpu):
        runner = row.runners[name]
        self.cpu, self.graph = cpu, None
        tensors = row.tensors()
        self.fn = lambda: runner(tensors)  # noqa: E731
        if not cpu and row.p.N <= configs.SMALL_N:
            per_set = sum(t.numel() * t.element_size() for t in tensors)
            copies = max(2, min(64, -(-4 * 60 * 2**20 // per_set)))
            sets = [row.tensors(copy=True) for _ in range(copies)]
            self.graph = common.GraphTimer(lambda: [(lambda t=t: runner(t)) for t in sets])

    def ms(self, first=False):
        if self.graph is not None:
            return self.graph.median_ms(replays=10)
        if self.cpu:
            start = time.perf_counter()
            self.fn()
            return (time.perf_counter() - start) * 1e3
        return common.time_ms(self.fn, warmup=100 if first else 10, rep=25)


def interleaved(timers, rounds):
    """Median ms of each timer over ``rounds`` rounds, each timing every timer once in an order
    rotated per round (a clock change shifts both alike)."""
    names = list(timers)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timers[name].ms(first=r == 0))
    return {name: statistics.median(t) for name, t in times.items()}


def check(row):
    """Accuracy of both runners against float64 and each other; raises nothing."""
    ref = row.p.ref(row.op)
    outs = {name: row.result(name) for name in row.runners}
    tol = common.tolerance(row.p.dtype)
    errors = {f"rel_err_{name}": common.rel_err(out, ref) for name, out in outs.items()}
    ok = all(e == e and e < tol for e in errors.values())
    return dict(errors, bitwise_equal=bool(torch.equal(outs["aot"], outs["jit"])), ok=bool(ok))


def _problem(c, n, dt, bs, d, device):
    return common.Problem(c, c, n, bs, d, common.DTYPES[dt], seed=1000 * bs + int(100 * d), device=device)


def _warm(chunk):
    """Worker: compile each row's JIT kernel once (Triton's disk cache); return failures."""
    from blocksparse.aot.abi import KernelLibrary
    from blocksparse.torch._launch import DeviceInfo

    fails = []
    for path, arch, sms, c, device, (n, dt, bs, d) in chunk:
        try:
            problem = _problem(c, n, dt, bs, d, device)
            for op in OPS:
                Row(problem, op, KernelLibrary(path), DeviceInfo(arch, sms), device == "cpu").result("jit")
        except Exception as exc:
            fails.append(((n, dt, bs, d), repr(exc)[:200]))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return fails


def measure(c, problems, kernels, info, rounds, cpu, save):
    rows = []
    for n, dt, bs, d in problems:
        device = "cpu" if cpu else "cuda"
        try:
            problem = _problem(c, n, dt, bs, d, device)
        except Exception as exc:
            rows.append(dict(N=n, dtype=dt, bs=bs, density=d, error=f"{type(exc).__name__}: {exc}"[:300]))
            continue
        for op in OPS:
            record = dict(N=n, dtype=dt, bs=bs, density=round(problem.density, 3), op=op)
            try:
                row = Row(problem, op, kernels, info, cpu)
                record.update(row.describe())
                record.update(check(row))
                if record["ok"]:
                    ms = interleaved({name: Timer(row, name, cpu) for name in row.runners}, rounds)
                    record.update(aot_ms=ms["aot"], jit_ms=ms["jit"], aot_over_jit=ms["aot"] / ms["jit"])
            except Exception as exc:  # a failing case is a result; the run goes on
                record["error"] = f"{type(exc).__name__}: {exc}"[:300]
                if not cpu:
                    torch.cuda.synchronize()
            rows.append(record)
            print(_line(record), flush=True)
        save(rows)
    return rows


def _line(r):
    if "error" in r:
        return f"  {r.get('op', ''):5} {r['dtype']} bs{r['bs']} N={r['N']} d={r['density']}: ERROR {r['error']}"
    timing = f"{r['aot_over_jit']:.3f}" if "aot_over_jit" in r else "inaccurate"
    return f"  {r['op']:5} {r['dtype']} bs{r['bs']:<3} N={r['N']:<5} d={r['density']:<5} {r['spec']:48} {timing}"


def summary(rows):
    timed = [r for r in rows if "aot_over_jit" in r]
    ratios = [r["aot_over_jit"] for r in timed]
    worst = max(timed, key=lambda r: r["aot_over_jit"], default=None)
    return dict(rows=len(rows), timed=len(timed), failed=len(rows) - len(timed),
                median_ratio=statistics.median(ratios) if ratios else None,
                geomean_ratio=statistics.geometric_mean(ratios) if ratios else None,
                worst_ratio=worst["aot_over_jit"] if worst else None,
                worst_row=None if worst is None else {k: worst[k] for k in ("op", "dtype", "bs", "N", "density",
                                                                            "spec")},
                within_limit=sum(r <= LIMIT for r in ratios), limit=LIMIT)


def markdown(meta, rows):
    s = summary(rows)
    lines = [f"# Compiled kernels vs the same kernels through Triton's JIT ({meta['device']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; kernel library {meta['library']}; "
             f"C = K = {meta['C']}; {meta['rounds']} interleaved rounds, medians. `aot/jit` = compiled ms / JIT ms "
             f"of the same launch (spec, tile, grid, arguments); N <= {configs.SMALL_N}: CUDA-graph timing over "
             "operand copies (weights from device memory), else events per call.", ""]
    if meta.get("cpu"):
        lines += ["**CPU smoke run**: Triton's interpreter, the `aot` column ran the JIT; the times mean nothing.", ""]
    if s["timed"]:
        lines += [f"{s['timed']} of {s['rows']} rows timed; aot/jit median {s['median_ratio']:.3f}, geometric mean "
                  f"{s['geomean_ratio']:.3f}, worst {s['worst_ratio']:.3f} ({s['worst_row']}); "
                  f"{s['within_limit']} within {LIMIT:.2f}.", ""]
    lines += ["| op | dtype | bs | N | density | spec | split / segment | aot ms | jit ms | aot/jit | equal | ok |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r.get('op', '')} | {r['dtype']} | {r['bs']} | {r['N']} | {r['density']} | "
                         f"error: {r['error'][:120]} | | | | | | no |")
            continue
        part = r["max_segment"] if r["op"] != "updat" else r["split"]
        timing = (f"{r['aot_ms']:.4f} | {r['jit_ms']:.4f} | {r['aot_over_jit']:.3f}" if "aot_ms" in r
                  else "| | ")
        lines.append(f"| {r['op']} | {r['dtype']} | {r['bs']} | {r['N']} | {r['density']} | {r['spec']} | "
                     f"{part if part is not None else '-'} | {timing} | {r['bitwise_equal']} | {r['ok']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="bf16, block sizes 32 / 64, density 0.25")
    ap.add_argument("--cpu", action="store_true", help="Triton's interpreter, tiny sizes (a smoke run)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per row")
    ap.add_argument("--kernels", help="kernel library to time (default: BLOCKSPARSE_KERNELS, installed, or built)")
    ap.add_argument("--build-dir", help="where to build the kernel library when none is found")
    ap.add_argument("--workers", type=int, default=8, help="processes compiling the JIT kernels first")
    ap.add_argument("--dtypes", help="comma-separated subset of the dtypes (writes aot-vs-jit-h200-<subset>.*)")
    ap.add_argument("--block-sizes", help="comma-separated subset of the block sizes (as --dtypes)")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        ap.error("no CUDA GPU: use --cpu for a smoke run")
    sizes = CPU if args.cpu else QUICK if args.quick else FULL
    subset = []
    for key, given, cast in (("dtypes", args.dtypes, str), ("block_sizes", args.block_sizes, int)):
        if given:
            chosen = tuple(cast(v) for v in given.split(",") if v)
            if not chosen or set(chosen) - set(sizes[key]):
                ap.error(f"--{key.replace('_', '-')} must be a subset of {','.join(map(str, sizes[key]))}; "
                         f"got {given!r}")
            sizes = dict(sizes, **{key: chosen})
            subset.append("-".join(map(str, chosen)))
    from blocksparse.torch._launch import DeviceInfo, device_info

    info = DeviceInfo(90, 132) if args.cpu else device_info(torch.cuda.current_device())
    kernels, where = kernel_library(args, (info.arch,), sizes)
    import triton

    meta = dict(device="cpu (interpreter)" if args.cpu else torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"), library=os.path.basename(where),
                C=sizes["C"], rounds=1 if args.cpu else args.rounds, cpu=args.cpu, arch=info.arch, sizes=sizes)
    stem = ("aot-vs-jit-cpu" if args.cpu else "aot-vs-jit-h200") + "".join(f"-{part}" for part in subset)
    save = common.result_writer(args.out, stem, meta, markdown)
    problems = [(n, dt, bs, d) for dt in sizes["dtypes"] for n in sizes["ns"] for bs in sizes["block_sizes"]
                for d in sizes["densities"]]
    start = time.time()
    todo = [(where, info.arch, info.sms, sizes["C"], "cpu" if args.cpu else "cuda", p) for p in problems]
    if args.cpu:  # the interpreter compiles nothing: once in this process, to run the code
        for fail in _warm(todo):
            print("  WARM FAIL", *fail, flush=True)
    elif args.workers > 0:
        common.warm_in_workers(_warm, todo, args.workers)
    rows = measure(sizes["C"], problems, kernels, info, meta["rounds"], args.cpu, save)
    save(rows)
    s = summary(rows)
    print(markdown(meta, rows))
    print(f"{s['timed']} of {s['rows']} rows timed, worst aot/jit {s['worst_ratio']}, "
          f"{time.time() - start:.0f} s -> {args.out}/{stem}.md")
    return 0 if s["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
