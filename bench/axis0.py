"""The two activation layouts side by side: each product of ``BlocksparseMatMul`` alone, and its
training step, on ``(N, C)`` (``feature_axis=1``) and ``(C, N)`` (``feature_axis=0``) activations.

    python bench/axis0.py --out DIR            # a GPU machine, about 15 s with the kernel library
    python bench/axis0.py --markdown FILE ...  # the table of earlier JSON runs (labelled by file name)

Per problem and layout: fprop, bprop and updat through their plans (``products.*``: the kernel
library where it serves, else the JIT), then ``autograd.grad`` of the product through the native op
and through the Python ``autograd.Function`` (``BLOCKSPARSE_TORCH_NATIVE=off``); CUDA events around
10 calls, the median of 3 repeats, µs.  Each row records the plans that ran.  Problems: bf16 at
8192 x 4096 (blocks of 32, d = 0.5) and 8192 x 1024 (32, 0.25); float32 (TF32 off) at 8192 x 4096,
d = 0.25, blocks of 32, 64 and 128.  Writes ``axis0.json`` and ``axis0.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBLEMS = (("bfloat16", 8192, 4096, 32, 0.5), ("bfloat16", 8192, 1024, 32, 0.25),
            ("float32", 8192, 4096, 32, 0.25), ("float32", 8192, 4096, 64, 0.25),
            ("float32", 8192, 4096, 128, 0.25))
COLUMNS = ("fprop", "bprop", "updat", "step_native", "step_python")


def _timeit(torch, fn, reps=10):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps * 1e3)
    return round(sorted(times)[1], 1)


def measure():
    import numpy as np
    import torch

    from blocksparse.testing.matmul import random_layout
    from blocksparse.torch import BlocksparseMatMul
    from blocksparse.torch._matmul import plan as _plan
    from blocksparse.torch._matmul import products

    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(3)
    rows = []
    for dtype_name, n, c, bs, d in PROBLEMS:
        dtype = getattr(torch, dtype_name)
        lay = random_layout(rng, c // bs, c // bs, d, cover=True)
        for axis in (1, 0):
            bsmm = BlocksparseMatMul(lay, bs, feature_axis=axis)
            h = bsmm._handle
            shape = (n, c) if axis == 1 else (c, n)
            w = torch.randn(bsmm.w_shape, device="cuda", dtype=dtype, requires_grad=True)
            x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn(shape, device="cuda", dtype=dtype)
            xd, wd = x.detach(), w.detach()
            row = dict(dtype=dtype_name, n=n, c=c, bs=bs, d=d, axis=axis,
                       fprop=_timeit(torch, lambda: products.fprop(xd, wd, h, axis, "ieee")),
                       bprop=_timeit(torch, lambda: products.bprop(dy, wd, h, axis, "ieee")),
                       updat=_timeit(torch, lambda: products.updat(xd, dy, h, axis, "ieee", dtype)),
                       step_native=_timeit(torch, lambda: torch.autograd.grad(bsmm(x, w), (x, w), dy)))
            os.environ["BLOCKSPARSE_TORCH_NATIVE"] = "off"
            try:
                row["step_python"] = _timeit(torch, lambda: torch.autograd.grad(bsmm(x, w), (x, w), dy))
            finally:
                del os.environ["BLOCKSPARSE_TORCH_NATIVE"]
            row["plans"] = sorted({(p.kind, p.path, str(p.config), p.split, p.max_segment is not None)
                                   for p in _plan.state(h).plans.values()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def markdown(runs):
    """The table of ``runs`` (``[(label, rows)]``): per problem and product, µs on ``(N, C)`` and
    ``(C, N)`` in each run and their ratio."""
    out = ["# The two activation layouts: (N, C) and (C, N) (NVIDIA H200)", "",
           "Produced by `bench/axis0.py` (method in its docstring); µs per call, CUDA events, the median of "
           "3 repeats of 10 calls; `C/N` = (C, N) time over (N, C) time (< 1: (C, N) faster).", ""]
    for label, rows in runs:
        out += [f"## {label}", "", "| dtype | N x C, bs, d | product | (N, C) µs | (C, N) µs | C/N |", "|---|---|---|---|---|---|"]
        by = {(r["dtype"], r["n"], r["c"], r["bs"], r["d"], r["axis"]): r for r in rows}
        for (dtype, n, c, bs, d, axis), r in by.items():
            if axis != 1 or (dtype, n, c, bs, d, 0) not in by:
                continue
            t = by[(dtype, n, c, bs, d, 0)]
            for col in COLUMNS:
                if col in r and col in t:
                    out.append(f"| {dtype} | {n} x {c}, {bs}, {d} | {col} | {r[col]} | {t[col]} | {t[col] / r[col]:.2f} |")
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--markdown", nargs="+", metavar="LABEL=FILE",
                    help="write the table of these JSON runs to --out/axis0.md instead of measuring")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.markdown:
        runs = [(spec.split("=", 1)[0], json.load(open(spec.split("=", 1)[1]))) for spec in args.markdown]
    else:
        rows = measure()
        with open(os.path.join(args.out, "axis0.json"), "w") as f:
            json.dump(rows, f, indent=1)
        runs = [("this run", rows)]
    with open(os.path.join(args.out, "axis0.md"), "w") as f:
        f.write(markdown(runs))


if __name__ == "__main__":
    main()
