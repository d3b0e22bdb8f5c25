"""Few-token layers: the plans' split rule against always splitting long reductions, and dense.

    python bench/few_tokens.py --out DIR            # a GPU machine, about 80 s with the kernel library
    python bench/few_tokens.py --out DIR --cpu      # smoke run: tiny, kernels interpreted

At few tokens a fprop / bprop program runs one output group's blocks in series; the plans can split
that run over several programs (float32 atomics into a zero-filled buffer, then a cast that adds
the bias), which saves GPU time but adds two launches and two torch ops of host time.  The plans
split only runs of ``SPLIT_MIN_RUN`` blocks or more (``blocksparse/torch/_matmul/plan.py``); this
script measures that rule (``rule``) against splitting every run (``split``: the thresholds set to
1, plans rebuilt) and ``nn.Linear`` (``dense``), per case, in the same rounds: ``BlocksparseLinear``
forward and forward + backward, eager / CUDA graph / host µs as ``bench/latency.py`` measures
them (its ``Timer``; medians of interleaved rounds), after a check against float64.  At the end:
the host time of the split's extra steps on their own (``torch.empty``, a float32 to bf16 ``.to()``,
``torch.add(out=)``, ``zero_()``, a bare view).  Writes ``few-tokens.json`` into ``--out``
(committed as ``results/raw/split-h200.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if "--cpu" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"       # before any kernel is imported
    os.environ["BLOCKSPARSE_BACKEND"] = "triton"

import latency  # noqa: E402  (its Timer and LinearCase; it puts the repository on the path)
import torch  # noqa: E402

from blocksparse.torch._matmul import plan as _plan  # noqa: E402

#: (N, C = K, block size, density, dtype): runs of 17-151 blocks.
CASES = ((64, 1024, 32, 0.25, torch.bfloat16), (64, 4096, 32, 0.25, torch.bfloat16),
         (64, 4096, 32, 0.5, torch.bfloat16), (64, 8192, 32, 0.5, torch.bfloat16),
         (64, 1024, 16, 0.5, torch.bfloat16), (64, 4096, 16, 0.5, torch.bfloat16),
         (64, 1024, 32, 0.25, torch.float32), (64, 4096, 32, 0.25, torch.float32),
         (64, 4096, 32, 0.5, torch.float32))
VARIANTS = ("rule", "split", "dense")
METRICS = ("fwd_eager", "fwd_graph", "fwd_host", "fb_eager", "fb_graph", "fb_host")


def _thresholds(variant, rule):
    _plan.SPLIT_MIN_RUN.update({False: 1, True: 1} if variant == "split" else rule)
    for state in _plan._states:  # plans are cached per call shape: rebuild them under the thresholds
        state.plans.clear()


def measure_case(spec, timer, rounds, device):
    """Rows of the three variants of one case (medians of ``rounds`` interleaved rounds)."""
    n, c, bs, d, dtype = spec
    rule = dict(_plan.SPLIT_MIN_RUN)
    cases, rows = {}, {}
    try:
        for variant in VARIANTS:
            _thresholds(variant, rule)
            case = cases[variant] = latency.LinearCase(n, c, bs, d, dtype, device, seed=7)
            row = rows[variant] = dict(n=n, c=c, bs=bs, d=d, dtype=str(dtype).split(".")[-1], variant=variant,
                                       longest_run=int(case.layout.sum(0).max()))
            impl = "dense-linear" if variant == "dense" else "ours"
            with torch.no_grad():  # plan every call kind the rounds make under this variant's thresholds:
                case.fwd(impl)()   # the layer keeps its records, whatever the thresholds are later
            case.fwdbwd(impl)()
            if variant != "dense":
                row["rel_err"] = {k: float(v) for k, v in case.check().items()}
                plans = [p for layer in case.modules() for p in _plan.state(layer.bsmm._handle).plans.values()]
                row["plans"] = sorted({f"{p.kind}: segments {p.max_segment}, {p.launches} launches" for p in plans})
        samples = {v: {m: [] for m in METRICS} for v in VARIANTS}
        for _ in range(rounds):
            for variant in VARIANTS:
                case, impl = cases[variant], "dense-linear" if variant == "dense" else "ours"
                fwd, fb = case.fwd(impl), case.fwdbwd(impl)
                with torch.no_grad():
                    for metric in ("eager", "graph", "host"):
                        samples[variant][f"fwd_{metric}"].append(getattr(timer, f"{metric}_us")(fwd))
                for metric in ("eager", "graph", "host"):
                    samples[variant][f"fb_{metric}"].append(getattr(timer, f"{metric}_us")(fb))
        for variant in VARIANTS:
            rows[variant].update({m: statistics.median(v) for m, v in samples[variant].items()})
    except Exception as exc:  # recorded, never hidden
        rows.setdefault("rule", dict(n=n, c=c, bs=bs, d=d))["error"] = f"{type(exc).__name__}: {exc}"[:400]
    finally:
        _thresholds("rule", rule)
    return list(rows.values())


def host_parts(timer, device):
    """Host µs of the steps a split adds, alone (64 x 4096 operands)."""
    out = torch.randn(64, 4096, device=device)
    y = torch.empty(64, 4096, device=device, dtype=torch.bfloat16)
    bias = torch.randn(4096, device=device, dtype=torch.bfloat16)
    parts = {"empty": lambda: torch.empty(64, 4096, device=device), "to_bf16": lambda: out.to(torch.bfloat16),
             "add_out": lambda: torch.add(out, bias, out=y), "zero_": lambda: out.zero_(),
             "view": lambda: out.view(-1)}
    return {name: timer.host_us(fn) for name, fn in parts.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU, kernels interpreted (smoke run)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.cpu else "cuda")
    cases = [(4, 64, 16, 0.5, torch.float32)] if args.cpu else CASES
    timer = latency.Timer(device, 2 if args.cpu else 50, 1)
    rounds = 1 if args.cpu else args.rounds
    os.makedirs(args.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name() if timer.gpu else "CPU (smoke run)", torch=torch.__version__,
                rounds=rounds, calls=timer.calls, rule=dict(_plan.SPLIT_MIN_RUN))
    rows = []
    for spec in cases:
        rows += measure_case(spec, timer, rounds, device)
        for r in rows[-len(VARIANTS):]:
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()
                              if k not in ("rel_err", "plans")}), flush=True)
        with open(os.path.join(args.out, "few-tokens.json"), "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
    meta["host_parts_us"] = host_parts(timer, device)
    print("host µs of a split's extra steps:", json.dumps({k: round(v, 1) for k, v in meta["host_parts_us"].items()}))
    with open(os.path.join(args.out, "few-tokens.json"), "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    bad = [r for r in rows if "error" in r or any(e > 2 * latency.tolerance(torch.bfloat16)
                                                   for e in r.get("rel_err", {}).values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
