"""The pixelfly discussion's two MLPs: PixelflyLinear (auto and each implementation) vs nn.Linear.

    python bench/pixelfly.py --out bench/results                 # GPU, about 4 minutes on an H200
    python bench/pixelfly.py --quick --cpu --out /tmp/pixelfly   # smoke run: tiny, kernels interpreted
    python bench/pixelfly.py --mlps small                        # one of the two MLPs

Exactly the discussion's setup (and the anchors' measurement of ``nn.Linear``): layers
[(384, 1536), (1536, 384)] with block 48, butterfly 64, and [(2048, 8192), (8192, 4096)] with
block 256, butterfly 64 (all factors, no low-rank term, with bias), input ``[16, 512, D]``; one
step is ``mlp(x).sum().backward()``; 5 warm-up steps, then 100 timed between two synchronisations,
in rounds that interleave the variants (``--rounds``, default 5; the small MLP, whose steps are
host-bound and noisy, ``--small-rounds``, default 25), the median reported (with the spread,
(max - min) / min); the ratio to ``nn.Linear`` is the median of the rounds' own ratios (each round
divides by the ``nn.Linear`` time of that round, so a slow moment of the host cancels); float32 (TF32 off) and bfloat16 (parameters and input).  Variants: ``nn.Linear``;
``PixelflyLinear`` with ``impl="auto"`` (the dispatch cost model: each layer's plan is recorded) and
forced to ``kernels``, ``portable`` and ``dense``.

Every variant is first checked against float64 (its layers' dense matrices, ``torch.empty``
NaN-poisoned); a wrong or failing variant is recorded and skipped, and results are written after
each one.  Writes ``pixelfly-<device>.json`` and ``.md`` into ``--out``: seconds per 100 steps and
the ratio to ``nn.Linear`` of the same run.  Goals: the small MLP within 5% of ``nn.Linear``, the
large one at least 2x faster in bfloat16.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MLPS = {"small": ([(384, 1536), (1536, 384)], 48, 64), "large": ([(2048, 8192), (8192, 4096)], 256, 64)}
VARIANTS = ("nn.Linear", "auto", "kernels", "portable", "dense")
SHAPE = (16, 512)


def build(variant, layers, block, butterfly, device, dtype):
    import torch

    from blocksparse.torch import PixelflyLinear

    if variant == "nn.Linear":
        mods = [torch.nn.Linear(i, o) for i, o in layers]
    else:
        mods = [PixelflyLinear(i, o, block, butterfly, impl=variant) for i, o in layers]
    return torch.nn.Sequential(*mods).to(device, dtype)


def dense_matrices(mlp):
    """float64 ``(in, out)`` matrices and biases of the MLP's layers."""
    import torch

    out = []
    for m in mlp:
        if isinstance(m, torch.nn.Linear):
            out.append((m.weight.detach().double().t(), m.bias.detach().double()))
        else:  # from the layout core, independent of the implementations under test
            dense = torch.from_numpy(m.layout.dense(m.weight.detach().double().cpu().numpy()))
            out.append((dense.to(m.weight.device), m.bias.detach().double()))
    return out


def check(mlp, x, dtype):
    """Relative errors of y and dx of one step against float64."""
    import torch

    from blocksparse.testing import rel_error
    from blocksparse.testing.poison import poisoned_empty

    xg = x.detach().clone().requires_grad_()
    with poisoned_empty():
        y = mlp(xg)
        y.sum().backward()
    ref = x.detach().double().reshape(-1, x.shape[-1])
    mats = dense_matrices(mlp)
    for w, b in mats:
        ref = ref @ w + b
    g = torch.ones_like(ref)
    for w, _ in reversed(mats):
        g = g @ w.t()
    mlp.zero_grad(set_to_none=True)
    return {"y": rel_error(y.reshape(ref.shape), ref), "dx": rel_error(xg.grad.reshape(g.shape), g)}


def timed(mlp, x, iters, sync):
    def step():
        mlp(x).sum().backward()

    for _ in range(5):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    return time.perf_counter() - t0


def run(args):
    import torch

    from blocksparse.testing import tolerance

    device = "cpu" if args.cpu else "cuda"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = False
    scale = 16 if args.quick else 1
    iters = 2 if args.quick else args.iters
    rounds = 1 if args.quick else args.rounds
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "created": datetime.date.today().isoformat(), "iters": iters, "input": [*SHAPE, "D"], "rows": []}
    shape = (2, 8) if args.quick else SHAPE
    for name in args.mlps.split(","):
        layers, block, butterfly = MLPS[name]
        layers = [(i // scale, o // scale) for i, o in layers]
        block, butterfly = block // scale, max(2, butterfly // scale)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(*shape, layers[0][0], device=device, dtype=dtype, requires_grad=True)
            ready = []  # (row, mlp) of the variants that passed their check
            for variant in VARIANTS:
                row = {"mlp": name, "layers": layers, "block_size": block, "butterfly_size": butterfly,
                       "dtype": str(dtype).replace("torch.", ""), "impl": variant}
                try:
                    torch.manual_seed(0)
                    mlp = build(variant, layers, block, butterfly, device, dtype)
                    with _interpreted(variant, device):
                        errs = check(mlp, x, dtype)
                    row["rel_error"] = errs
                    if max(errs.values()) > 4 * tolerance(dtype):
                        raise AssertionError(f"wrong results: {errs}")
                    if variant != "nn.Linear":
                        row["plans"] = [str(m.plan(shape[0] * shape[1], dtype, device)) for m in mlp]
                    ready.append((row, mlp))
                except Exception as exc:  # a failing variant must not stop the others
                    traceback.print_exc()
                    row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                result["rows"].append(row)
            times = {id(row): [] for row, _ in ready}
            # interleaved: a slow moment of the host hits every variant
            for _ in range(rounds if name != "small" or args.quick else args.small_rounds):
                for row, mlp in ready:
                    try:
                        with _interpreted(row["impl"], device):
                            times[id(row)].append(timed(mlp, x, iters, sync))
                    except Exception as exc:
                        traceback.print_exc()
                        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            base = next((times[id(row)] for row, _ in ready if row["impl"] == "nn.Linear"), None)
            for row, _ in ready:
                t = sorted(times[id(row)])
                if t and "error" not in row:
                    row["seconds"], row["spread"], row["rounds"] = t[len(t) // 2], (t[-1] - t[0]) / t[0], len(t)
                    if base and len(base) == len(times[id(row)]):
                        row["ratio_to_linear"] = statistics.median(a / b for a, b in zip(times[id(row)], base))
                print(json.dumps(row), flush=True)
            write(result, args.out, device)
            ready = None
            if device == "cuda":
                torch.cuda.empty_cache()


class _interpreted:
    """On the CPU the forced ``kernels`` variant runs through Triton's interpreter (smoke runs)."""

    def __init__(self, variant, device):
        self.on = variant == "kernels" and device == "cpu"

    def __enter__(self):
        if self.on:
            self.saved = os.environ.get("BLOCKSPARSE_BACKEND")
            os.environ["BLOCKSPARSE_BACKEND"] = "triton"

    def __exit__(self, *exc):
        if self.on:
            if self.saved is None:
                os.environ.pop("BLOCKSPARSE_BACKEND")
            else:
                os.environ["BLOCKSPARSE_BACKEND"] = self.saved


def markdown(result):
    lines = [f"# Pixelfly MLPs: PixelflyLinear vs nn.Linear ({result['device']}, {result['created']})", "",
             f"Input {result['input']}, `mlp(x).sum().backward()`, {result['iters']} steps; seconds (median of "
             "interleaved rounds, spread = (max - min) / min) and the ratio to nn.Linear: the median of "
             "each round's ratio to the nn.Linear time of that round (< 1: faster).", "",
             "| MLP | dtype | impl | seconds | spread | / nn.Linear | plans |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        secs = f"{r['seconds']:.3f}" if "seconds" in r else f"failed: {r.get('error', '')[:60]}"
        ratio = f"{r['ratio_to_linear']:.2f}" if r.get("ratio_to_linear") else ""
        plans = "; ".join(p.split(":")[0] for p in r.get("plans", []))
        spread = f"{r['spread']:.0%}" if "spread" in r else ""
        lines.append(f"| {r['mlp']} | {r['dtype']} | {r['impl']} | {secs} | {spread} | {ratio} | {plans} |")
    return "\n".join(lines) + "\n"


def write(result, out, device):
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"pixelfly-{'h200' if 'H200' in result['device'] else device}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps (smoke run)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (with --quick: kernels interpreted)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median reported)")
    ap.add_argument("--mlps", default=",".join(MLPS), choices=[",".join(MLPS), *MLPS],
                    help="which MLPs (default: both)")
    ap.add_argument("--small-rounds", type=int, default=25, help="rounds for the small (host-bound) MLP")
    args = ap.parse_args()
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    run(args)


if __name__ == "__main__":
    main()
