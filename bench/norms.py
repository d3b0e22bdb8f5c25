"""Layer norm and fused LSTM gates on a GPU: ours vs PyTorch, as a fraction of HBM bandwidth.

    python bench/norms.py --out bench/results            # the full run: about 8 minutes on an H200
    python bench/norms.py --out /tmp/smoke --quick       # one shape per dtype: under a minute
    python bench/norms.py --out /tmp/cpu --quick --cpu   # tiny shapes through Triton's interpreter

``--dtypes``, ``--axes`` (layer-norm layouts), ``--tokens`` and ``--ops`` run parts (about 4 minutes a dtype).

Of the full run's time, ~20 s compile our kernels (in ``--workers`` processes, first) and ~30 s
the ``torch.compile`` baseline (``--no-compile`` skips it); ``--ops layer_norm`` runs one family.

One run, for tokens N in {4096, 8192, 16384} x features C (layer norm) or cell size K (LSTM) in
{1024, 4096, 8192}, bfloat16 and float32, forward and forward + backward:

* ``layer_norm`` on (N, C) activations, without and with the fused relu, and on (C, N) activations
  (``axis=0``); baseline ``torch.nn.functional.layer_norm`` (+ ``torch.relu``; for (C, N) on the
  transposed view, as a PyTorch user would write it);
* ``lstm_gates`` (``fused_lstm_gates`` on one merged (N, 4K) gate tensor with a bias); baselines
  the unfused op sequence in eager PyTorch and, unless ``--no-compile``, the same sequence through
  ``torch.compile(dynamic=True)`` (compiled once per dtype and mode: most of the run's extra time).

Every case is first checked against float64 (the formulas of ``blocksparse.testing``, on the GPU):
outputs and, for forward + backward, every gradient, with fresh outputs NaN-poisoned.  Then each
callable is timed in a CUDA graph over rotating input copies (together 4x the L2), so inputs come
from HBM and host launch costs are excluded.  ``hbm_frac`` = the bytes the op must move (below) /
time, over the device-to-device copy bandwidth measured in the same run (read + write counted);
``speedup`` = baseline time / our time (> 1: we are faster).

Bytes that must move per element (e = element size): layer norm forward 2e (x, y), forward +
backward 5e (+ x, dy, dx); LSTM gates per cell element forward 7e (c, 4 gates, c_next, h_next),
forward + backward 19e (+ c, 4 gates, 2 output gradients, dc, 4 gate gradients).

A failing case is recorded with its error and the run goes on; results are written after every
case (``norms-<gpu>.json`` and ``norms-<gpu>.md`` in ``--out``: ``norms-h200`` on an H200).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

CPU = "--cpu" in sys.argv
if CPU:  # before torch / triton are imported: kernels through the interpreter on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("BLOCKSPARSE_BACKEND", "triton")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch import fused_lstm_gates, layer_norm  # noqa: E402

TOKENS = (4096, 8192, 16384)
FEATURES = (1024, 4096, 8192)
DTYPES = ("bf16", "fp32")
MODES = ("fwd", "fwd+bwd")
LN_VARIANTS = ((1, False), (1, True), (0, False))  # (axis, relu)
EPS = 1e-5
FORGET_BIAS = 1.0


def _leaf(t):
    return t.detach().clone().requires_grad_(t.requires_grad)


class LayerNormCase:
    """One layer-norm problem: inputs, callables of each implementation, float64 checks."""

    impls = ("blocksparse", "torch")

    def __init__(self, n, c, dtype, axis, relu, device):
        self.n, self.c, self.axis, self.relu = n, c, axis, relu
        g = torch.Generator(device=device).manual_seed(n + c + axis)
        shape = (n, c) if axis == 1 else (c, n)
        x = (2 * torch.randn(shape, device=device, generator=g) + 0.5).to(dtype).requires_grad_()
        gain = (1 + 0.5 * torch.randn(c, device=device, generator=g)).to(dtype).requires_grad_()
        bias = (0.5 * torch.randn(c, device=device, generator=g)).to(dtype).requires_grad_()
        dy = torch.randn(shape, device=device, generator=g).to(dtype)
        self.ref_kw = dict(axis=axis, epsilon=EPS, relu=relu, xp=torch)
        self.y_ref = ref.layer_norm(*(t.detach().double() for t in (x, gain, bias)), **self.ref_kw)
        if relu:  # where |y| ~ 0 the relu masks of float32 and float64 may differ: no gradient there
            dy = ref.relu_safe(dy.double(), self.y_ref).to(dtype)
        self.tensors = (x, gain, bias, dy)
        self.label = dict(op="layer_norm", N=n, C=c, axis=axis, relu=relu)

    def operands(self, copy):
        return tuple(_leaf(t) for t in self.tensors) if copy else self.tensors

    def forward(self, impl, x, g, b):
        if impl == "blocksparse":
            return layer_norm(x, g, b, axis=self.axis, epsilon=EPS, relu=self.relu)
        xt = x if self.axis == 1 else x.t()
        y = F.layer_norm(xt, (self.c,), g, b, EPS)
        y = torch.relu(y) if self.relu else y
        return y if self.axis == 1 else y.t()

    def call(self, impl, mode, tensors):
        x, g, b, dy = tensors
        if mode == "fwd":
            return lambda: self.forward(impl, x, g, b)
        return lambda: torch.autograd.grad(self.forward(impl, x, g, b), (x, g, b), dy)

    def errors(self, impl, mode, out):
        """Relative errors of ``out`` (what :meth:`call` returned) against float64."""
        if mode == "fwd":
            return {"y": common.rel_err(out, self.y_ref)}
        x, g, b, dy = (t.detach().double() for t in self.tensors)
        refs = ref.layer_norm_grad(dy, x, g, b, **self.ref_kw)
        return {name: common.rel_err(got, want) for name, got, want in zip(("dx", "dg", "db"), out, refs)}

    def bytes(self, mode):
        return (2 if mode == "fwd" else 5) * self.n * self.c * self.tensors[0].element_size()


def lstm_unfused(c, h, bias):
    """The fused op written as a PyTorch user would, op by op."""
    i, j, f, o = (h + bias).chunk(4, dim=1)
    c_next = torch.sigmoid(f + FORGET_BIAS) * c + torch.sigmoid(i) * torch.tanh(j)
    return c_next, torch.sigmoid(o) * torch.tanh(c_next)


class LstmCase:
    """One LSTM-gates problem (merged gates with a bias)."""

    def __init__(self, n, k, dtype, device, compiled):
        self.n, self.k = n, k
        self.impls = ("blocksparse", "torch") + (("torch.compile",) if compiled else ())
        self.compiled = compiled
        g = torch.Generator(device=device).manual_seed(n + k)

        def rand(*shape, scale=1.0):
            return (scale * torch.randn(*shape, device=device, generator=g)).to(dtype)

        self.tensors = (rand(n, k).requires_grad_(), rand(n, 4 * k, scale=1.5).requires_grad_(),
                        rand(4 * k, scale=0.5).requires_grad_(), rand(n, k), rand(n, k))
        self.label = dict(op="lstm_gates", N=n, C=k, axis=1, relu=False)

    def operands(self, copy):
        return tuple(_leaf(t) for t in self.tensors) if copy else self.tensors

    def forward(self, impl, c, h, bias):
        if impl == "blocksparse":
            return fused_lstm_gates(c, h, bias=bias, forget_bias=FORGET_BIAS)
        return (self.compiled if impl == "torch.compile" else lstm_unfused)(c, h, bias)

    def call(self, impl, mode, tensors):
        c, h, bias, dcn, dhn = tensors
        if mode == "fwd":
            return lambda: self.forward(impl, c, h, bias)
        return lambda: torch.autograd.grad(self.forward(impl, c, h, bias), (c, h, bias), (dcn, dhn))

    def errors(self, impl, mode, out):
        c, h, bias, dcn, dhn = (t.detach().double() for t in self.tensors)
        if mode == "fwd":
            refs, names = ref.lstm_gates(c, h, bias=bias, forget_bias=FORGET_BIAS, xp=torch), ("c_next", "h_next")
        else:
            refs = ref.lstm_gates_grad(dcn, dhn, c, h, bias=bias, forget_bias=FORGET_BIAS, xp=torch)
            names = ("dc", "dh", "dbias")
        return {name: common.rel_err(got, want) for name, got, want in zip(names, out, refs)}

    def bytes(self, mode):
        return (7 if mode == "fwd" else 19) * self.n * self.k * self.tensors[0].element_size()


def time_ms(case, impl, mode, reps):
    """Median ms per call: CUDA graph over rotating copies (CPU: wall clock of ``reps`` calls)."""
    if CPU:
        fn = case.call(impl, mode, case.operands(False))
        fn()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps * 1e3, "wall"
    per_set = sum(t.numel() * t.element_size() for t in case.tensors) + case.bytes(mode)
    copies = max(2, min(16, math.ceil(4 * 60 * 2**20 / per_set)))
    try:
        return common.time_rotating_ms(lambda: [case.call(impl, mode, case.operands(True)) for _ in range(copies)],
                                       replays=reps), "graph"
    except Exception:  # a call that cannot be captured: events, host launch costs included
        torch.cuda.synchronize()
        return common.time_ms(case.call(impl, mode, case.operands(False)), warmup=10, rep=50), "events"


def run_case(case, dtype, hbm_gbs, reps, rows, save):
    """Check then time every implementation and mode of one case; rows appended as they come."""
    for mode in MODES:
        timed = {}
        for impl in case.impls:
            row = dict(case.label, impl=impl, mode=mode, dtype=dtype)
            try:
                with common.poisoned_empty():
                    out = case.call(impl, mode, case.operands(False))()
                row["rel_err"] = case.errors(impl, mode, out)
                del out
                bound = common.tolerance(common.DTYPES[dtype])
                row["ok"] = all(e <= bound for e in row["rel_err"].values())
                row["ms"], row["timer"] = time_ms(case, impl, mode, reps)
                row["gbs"] = case.bytes(mode) / row["ms"] / 1e6
                if hbm_gbs:
                    row["hbm_frac"] = row["gbs"] / hbm_gbs
                timed[impl] = row["ms"]
            except Exception as exc:  # recorded, never hidden; the run goes on
                row["error"] = repr(exc)[:300]
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
        ours = next((r for r in rows[-len(case.impls):] if r["impl"] == "blocksparse"), {})
        if "ms" in ours:
            ours["speedup"] = {impl: ms / ours["ms"] for impl, ms in timed.items() if impl != "blocksparse"}
    save(rows)


def _warm(todo):
    """Worker: run our forward + backward once per kernel specialisation (few tokens, a multiple of
    16 like the timed sizes: the same specialisations), so Triton compiles in parallel first."""
    fails = []
    device, n = ("cpu", 16) if CPU else ("cuda", 64)
    for dtype, c in todo:
        try:
            cases = [LayerNormCase(n, c, common.DTYPES[dtype], axis, relu, device) for axis, relu in LN_VARIANTS]
            cases.append(LstmCase(n, c, common.DTYPES[dtype], device, None))
            for case in cases:
                for mode in MODES:
                    case.call("blocksparse", mode, case.operands(False))()
        except Exception as exc:
            fails.append((dtype, c, repr(exc)[:200]))
    return fails


def warm_up(quick, dtypes, tokens, workers):
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    todo = sorted({(dtype, c) for dtype, _, c in problems(quick, dtypes, tokens)})
    with ProcessPoolExecutor(min(workers, len(todo)), mp_context=mp.get_context("spawn")) as pool:
        return [f for part in pool.map(_warm, [todo[i::workers] for i in range(workers)]) for f in part]


def problems(quick, dtypes=DTYPES, tokens=TOKENS):
    tokens, features = ((tokens[0],), (FEATURES[0],)) if quick else (tokens, FEATURES)
    if CPU:
        tokens, features = (13,), (40,)
    for dtype in dtypes:
        for n in tokens:
            for c in features:
                yield dtype, n, c


def measure(args, hbm_gbs, save):
    device = "cpu" if CPU else "cuda"
    compiled = {}
    rows = []
    for dtype, n, c in problems(args.quick, args.dtypes, args.tokens):
        cases = []
        if "layer_norm" in args.ops:
            cases += [lambda axis=axis, relu=relu: LayerNormCase(n, c, common.DTYPES[dtype], axis, relu, device)
                      for axis, relu in LN_VARIANTS if axis in args.axes]
        if "lstm_gates" in args.ops:
            if not args.no_compile and dtype not in compiled:
                compiled[dtype] = torch.compile(lstm_unfused, dynamic=True)
            cases.append(lambda: LstmCase(n, c, common.DTYPES[dtype], device, compiled.get(dtype)))
        for make in cases:
            try:
                case = make()
            except Exception as exc:
                rows.append(dict(op="setup", N=n, C=c, dtype=dtype, error=repr(exc)[:300]))
                continue
            run_case(case, dtype, hbm_gbs, args.reps, rows, save)
            del case
            if not CPU:
                torch.cuda.empty_cache()
    return rows


def markdown(meta, rows):
    """Per op, variant and dtype: our time, the fraction of HBM bandwidth, and the speedups."""
    out = [f"# Layer norm and LSTM gates on {meta['device']}", "",
           f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; HBM copy bandwidth measured in "
           f"this run: {meta['hbm_gbs'] or float('nan'):.0f} GB/s.  `hbm` = bytes that must move / time over that "
           "bandwidth; `x torch` = PyTorch's time / ours (> 1: faster).  Produced by `bench/norms.py`; raw rows "
           f"(with every relative error against float64) in `{meta['stem']}.json`."
           + (f"  Our launches: {meta['launches']}." if meta.get("launches") else ""), ""]
    index = {(r["op"], r["axis"], r["relu"], r["impl"], r["mode"], r["dtype"], r["N"], r["C"]): r
             for r in rows if "impl" in r}
    groups = sorted({(r["op"], r["axis"], r["relu"], r["dtype"]) for r in rows if "impl" in r},
                    key=lambda k: (k[0], -k[1], k[2], k[3]))
    for op, axis, relu, dtype in groups:
        title = "layer_norm" + (" + relu" if relu else "") + (" (N, C)" if axis else " (C, N)") \
            if op == "layer_norm" else "lstm_gates (merged gates, bias)"
        baselines = ("torch",) + (("torch.compile",) if op == "lstm_gates" else ())
        head = [f"{m} {c}" for m in MODES for c in ("ms", "hbm", *[f"x {b}" for b in baselines], "torch hbm")]
        out += [f"## {title}, {dtype}", "", "| N | C | " + " | ".join(head) + " |", "|---" * (2 + len(head)) + "|"]
        shapes = sorted({(k[6], k[7]) for k in index if k[:3] == (op, axis, relu) and k[5] == dtype})
        for n, c in shapes:
            cells = []
            for mode in MODES:
                ours = index.get((op, axis, relu, "blocksparse", mode, dtype, n, c), {})
                base = index.get((op, axis, relu, "torch", mode, dtype, n, c), {})
                mark = "" if ours.get("ok") else " !"
                cells += [f"{ours['ms']:.4f}{mark}" if "ms" in ours else "err", _frac(ours.get("hbm_frac"))]
                cells += [f"{ours['speedup'][b]:.2f}" if b in ours.get("speedup", {}) else "-" for b in baselines]
                cells.append(_frac(base.get("hbm_frac")))
            out.append(f"| {n} | {c} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["`!` marks a result outside the dtype's tolerance against float64 (none expected).", ""]
    if meta.get("note"):
        out += [meta["note"], ""]
    return "\n".join(out)


def _frac(value):
    return "-" if value is None else f"{value:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--quick", action="store_true", help="one shape per dtype (a smoke run)")
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU through Triton's interpreter")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline of the LSTM gates")
    ap.add_argument("--reps", type=int, default=None, help="graph replays per timing (default 20; CPU 1)")
    ap.add_argument("--workers", type=int, default=6, help="processes compiling the kernels before the run")
    ap.add_argument("--ops", nargs="+", choices=("layer_norm", "lstm_gates"), default=("layer_norm", "lstm_gates"))
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DTYPES)
    ap.add_argument("--axes", nargs="+", type=int, choices=(1, 0), default=(1, 0), help="layer-norm layouts")
    ap.add_argument("--tokens", nargs="+", type=int, default=TOKENS, help="token counts N")
    args = ap.parse_args()
    args.reps = args.reps or (1 if CPU else 20)
    args.no_compile = args.no_compile or CPU  # inductor's CPU code needs a C++ toolchain: not a GPU check
    t0 = time.time()
    import triton
    for fail in warm_up(args.quick, args.dtypes, args.tokens, args.workers):
        print("  WARM-UP FAILED", *fail, flush=True)
    print(f"kernels compiled in {time.time() - t0:.0f}s", flush=True)
    hbm = None if CPU else common.hbm_bandwidth_gbs()
    meta = dict(device="CPU (Triton interpreter)" if CPU else torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"), hbm_gbs=hbm, quick=args.quick,
                launches=None if CPU else common.launch_source())
    meta["stem"] = f"norms-{common.gpu_tag()}"
    save = common.result_writer(args.out, meta["stem"], meta, markdown)
    rows = measure(args, hbm, save)
    save(rows)
    bad = [r for r in rows if r.get("impl") == "blocksparse" and not (r.get("ok") and "ms" in r)]
    errors = [r for r in rows if "error" in r]
    print(markdown(meta, rows))
    print(f"{len(rows)} rows; ours failed or inaccurate: {len(bad)}; errors: {len(errors)}; {time.time() - t0:.0f}s")
    for r in bad + [r for r in errors if r not in bad]:
        print("  BAD", json.dumps(r))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
