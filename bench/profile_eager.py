"""Where an eager training step of a block-sparse layer spends its time, on a GPU: the PyTorch
profiler over a few forward + backward steps of ``BlocksparseLinear`` and of ``nn.Linear`` (same
shape), printing the host-side ops by self time and every synchronising call it saw.

    python bench/profile_eager.py [--tokens 8192] [--features 1024] [--block-size 32]
    python bench/profile_eager.py --breakdown --out DIR    # the step taken apart, timed

Prints two tables (about 20 s on an H200).  ``bench/latency.py`` measures; this one explains.
``--breakdown`` times the parts of one training step of ``BlocksparseLinear`` (forward, each
product called directly, the step without autograd, the step through autograd, and the same step
of an ``autograd.Function`` around dense ``torch`` matmuls) with ``bench/latency.py``'s timers and
writes ``eager-breakdown-NxC.{json,md}``.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from blocksparse.testing.matmul import random_layout  # noqa: E402
from blocksparse.torch import BlocksparseLinear  # noqa: E402

SYNC_WORDS = ("synchronize", "Synchronize", "Memcpy", "memcpy", "item", "EventQuery", "cudaStreamWait")


def step(layer, x, dy):
    return torch.autograd.grad(layer(x), (x, *layer.parameters()), dy)


def report(name, layer, x, dy, steps):
    for _ in range(10):
        step(layer, x, dy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(layer, x, dy)
        torch.cuda.synchronize()
    events = prof.key_averages()
    print(f"\n## {name}: {steps} steps\n")
    print(events.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
    syncs = [e for e in events if any(w in e.key for w in SYNC_WORDS)]
    print("synchronising calls:", ", ".join(f"{e.key} x{e.count}" for e in syncs) or "none")


def _spread(values):
    return (max(values) - min(values)) / min(values) if min(values) > 0 else float("nan")


def breakdown(n, c, bs, density, out, rounds=7):
    """Eager / graph / host microseconds of the parts of one training step (see the module doc)."""
    import json
    import statistics

    from latency import Timer
    from blocksparse.torch._matmul import products
    layout = random_layout(np.random.default_rng(0), c // bs, c // bs, density, cover=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a smoke run
    factory = dict(device=device, dtype=torch.bfloat16)
    layer = BlocksparseLinear(layout, bs, impl="kernels" if device.type == "cuda" else "auto", **factory)
    x = torch.randn(n, c, **factory).requires_grad_()
    dy = torch.randn(n, c, **factory)
    w, h, xd = layer.weight, layer.bsmm._handle, x.detach()
    wd = torch.randn(c, c, **factory).requires_grad_()
    inputs = (x, *layer.parameters())

    class DenseFn(torch.autograd.Function):  # the same autograd structure around cuBLAS
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a @ b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g @ b.t(), a.t() @ g

    class PlainFn(DenseFn):  # that structure around our products (no bias, no once_differentiable)
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return products.fprop(a, b, h, 1, "ieee")

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return products.bprop(g, b, h, 1, "ieee"), products.updat(a, g, h, 1, "ieee", b.dtype)

    def manual():
        products.fprop(xd, w.detach(), h, 1, "ieee")
        products.bprop(dy, w.detach(), h, 1, "ieee")
        products.updat(xd, dy, h, 1, "ieee", w.dtype)
        dy.sum(0)

    def single_thread(fn):  # backward on the calling thread instead of autograd's CUDA worker
        def run():
            torch.autograd.set_multithreading_enabled(False)
            try:
                fn()
            finally:
                torch.autograd.set_multithreading_enabled(True)
        return run

    def python_path(fn):  # the Python autograd.Function instead of the native op (a putenv a call extra)
        def run():
            os.environ["BLOCKSPARSE_TORCH_NATIVE"] = "off"
            try:
                fn()
            finally:
                del os.environ["BLOCKSPARSE_TORCH_NATIVE"]
        return run

    dense = torch.nn.Linear(c, c, **factory)
    auto = BlocksparseLinear(layout, bs, **factory)  # the dispatch's choice (layer.plan() says which)
    auto.load_state_dict(layer.state_dict())
    step = lambda: torch.autograd.grad(layer(x), inputs, dy)  # noqa: E731
    auto_step = lambda: torch.autograd.grad(auto(x), (x, *auto.parameters()), dy)  # noqa: E731
    dense_fn = lambda: torch.autograd.grad(DenseFn.apply(x, wd), (x, wd), dy)  # noqa: E731
    linear_step = lambda: torch.autograd.grad(dense(x), (x, *dense.parameters()), dy)  # noqa: E731
    parts = {
        "layer(x), grad enabled": lambda: layer(x),
        "nn.Linear(x), grad enabled": lambda: dense(x),
        "fprop alone": lambda: products.fprop(xd, w.detach(), h, 1, "ieee"),
        "bprop alone": lambda: products.bprop(dy, w.detach(), h, 1, "ieee"),
        "updat alone": lambda: products.updat(xd, dy, h, 1, "ieee", w.dtype),
        "fprop+bprop+updat+bias grad, no autograd": manual,
        "autograd.grad(layer(x))": step,
        "autograd.grad(layer(x)), Python autograd.Function": python_path(step),
        "autograd.grad(layer(x)), backward on the calling thread": single_thread(step),
        f"autograd.grad(layer(x)), impl='auto' ({auto.plan(n).impl})": auto_step,
        "autograd.grad(bsmm(x, W))": lambda: torch.autograd.grad(layer.bsmm(x, w), (x, w), dy),
        "autograd.grad(plain Function over our products)":
            lambda: torch.autograd.grad(PlainFn.apply(x, w), (x, w), dy),
        "autograd.grad(DenseFn(x, W)) (cuBLAS)": dense_fn,
        "autograd.grad(DenseFn(x, W)), backward on the calling thread": single_thread(dense_fn),
        "autograd.grad(nn.Linear)": linear_step,
        "autograd.grad(nn.Linear), backward on the calling thread": single_thread(linear_step),
    }
    timer = Timer(device, 50, 1) if device.type == "cuda" else Timer(device, 2, 1)
    for fn in parts.values():
        for _ in range(5):
            fn()
    if timer.gpu:
        torch.cuda.synchronize()
    samples = {name: {"eager_us": [], "host_us": []} for name in parts}
    for _ in range(rounds):  # interleaved: a slow moment of the host touches every part alike
        for name, fn in parts.items():
            samples[name]["eager_us"].append(timer.eager_us(fn))
            samples[name]["host_us"].append(timer.host_us(fn))
    rows = []
    for name, fn in parts.items():
        rows.append(dict(part=name, eager_us=statistics.median(samples[name]["eager_us"]),
                         graph_us=timer.graph_us(fn), host_us=statistics.median(samples[name]["host_us"]),
                         spread=_spread(samples[name]["eager_us"])))
        print(json.dumps(rows[-1]), flush=True)
    trace = timeline(python_path(step), device)  # the Python path: the products are called from Python
    print(json.dumps(trace), flush=True)
    meta = dict(device=torch.cuda.get_device_name() if timer.gpu else "CPU (smoke run)", torch=torch.__version__, N=n, C=c, block_size=bs,
                density=density, dtype="bfloat16", paths=sorted({f"{k[0]}:{p.path}" for k, p in
                                                                 _plan_state(h).plans.items()}))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"eager-breakdown-{n}x{c}.json"), "w") as f:
        json.dump(dict(meta, rows=rows, timeline=trace), f, indent=1)
    lines = [f"# One eager training step taken apart ({meta['device']})", "",
             f"BlocksparseLinear {n} x {c}, bs{bs}, d={density}, bf16 (`impl='kernels'` unless named); plans "
             f"{', '.join(meta['paths'])}. µs per call: eager (what a loop sees), graph (GPU time), host (Python "
             f"time, GPU kept busy); eager and host are medians of {rounds} interleaved rounds (spread: of eager).",
             "", "| part | eager | graph | host | spread |", "|---|---|---|---|---|"]
    lines += [f"| {r['part']} | {r['eager_us']:.1f} | {r['graph_us']:.1f} | {r['host_us']:.1f} | "
              f"{r['spread']:.0%} |" for r in rows]
    lines += ["", "Inside one `autograd.grad(layer(x))` step of the Python path, host µs from its start (median of "
              f"{trace['steps']} steps; the GPU kept busy):", "", "| event | µs |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in trace["events"].items()]
    with open(os.path.join(out, f"eager-breakdown-{n}x{c}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def timeline(step, device, steps=200):
    """When each part of one training step starts and ends, host µs from the step's start: the
    products and the bias gradient timed where autograd calls them (wrapped for the run)."""
    import statistics
    import time

    from blocksparse.torch._matmul import ops, products

    clock, marks = time.perf_counter_ns, []

    def wrap(module, name):
        inner, raw = getattr(module, name), vars(module)[name]  # raw: a staticmethod stays one

        def timed(*args, **kwargs):
            marks.append((name + " start", clock()))
            out = inner(*args, **kwargs)
            marks.append((name + " end", clock()))
            return out
        setattr(module, name, timed)
        return lambda: setattr(module, name, raw)

    restore = [wrap(products, "fprop"), wrap(products, "bprop"), wrap(products, "updat"), wrap(ops, "_bias_grad"),
               wrap(ops.MatmulFunction, "backward")]
    samples = {}
    try:
        for i in range(steps + 10):
            if device.type == "cuda" and i % 20 == 0:
                torch.cuda.synchronize()
                torch.cuda._sleep(50_000_000)  # keep the GPU busy: host time only
            marks.clear()
            t0 = clock()
            marks.append(("step start", t0))
            step()
            marks.append(("step end", clock()))
            if i >= 10:
                for name, t in marks:
                    samples.setdefault(name, []).append((t - t0) / 1000)
    finally:
        for undo in restore:
            undo()
    events = {k: statistics.median(v) for k, v in samples.items()}
    return dict(steps=steps, events=dict(sorted(events.items(), key=lambda kv: kv[1])))


def _plan_state(handle):
    from blocksparse.torch._matmul import plan
    return plan.state(handle)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7, help="--breakdown: interleaved rounds (median)")
    ap.add_argument("--breakdown", action="store_true", help="time the parts of a step (see the module doc)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    if args.breakdown:
        return breakdown(args.tokens, args.features, args.block_size, args.density, args.out, args.rounds)
    n, c, bs = args.tokens, args.features, args.block_size
    layout = random_layout(np.random.default_rng(0), c // bs, c // bs, args.density, cover=True)
    factory = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(n, c, **factory).requires_grad_()
    dy = torch.randn(n, c, **factory)
    report("BlocksparseLinear", BlocksparseLinear(layout, bs, **factory), x, dy, args.steps)
    report("nn.Linear", torch.nn.Linear(c, c, **factory), x, dy, args.steps)


if __name__ == "__main__":
    main()
