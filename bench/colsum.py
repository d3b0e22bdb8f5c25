"""The layers' bias gradient, column sums of dy: ``dy.sum(0)`` against other formulations (a row of
ones times dy through cuBLAS, ``mv``, two-stage float32 sums), GPU time in CUDA graphs over rotating
copies (3 interleaved rounds, median), each with its relative error against float64.

    python bench/colsum.py          # on a GPU, about 10 s; writes $OUT/colsum.json (default: .)

Behind :func:`blocksparse.torch._reduce.column_sums` and the native op's ``column_sums``
(``results/raw/colsum-h200.json``)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import torch  # noqa: E402

import common  # noqa: E402

rows = []
for dtype in (torch.bfloat16, torch.float32):
    for n, k in ((8192, 1024), (8192, 4096), (8192, 8192), (64, 4096), (8192, 384), (4096, 1024)):
        dys = [torch.randn(n, k, device="cuda").to(dtype) for _ in range(max(2, min(16, 240 * 2**20 // (n * k * 2))))]
        ones = torch.ones(1, n, device="cuda", dtype=dtype)
        ref = dys[0].double().sum(0)
        err = lambda t: float((t.double().reshape(-1) - ref).abs().max() / ref.abs().max())
        g = 64 if n % 64 == 0 and n >= 4096 else 1
        fns = {"sum": lambda d: d.sum(0), "sum32": lambda d: d.sum(0, dtype=torch.float32),
               "mm": lambda d: ones @ d, "mv": lambda d: torch.mv(d.t(), ones.reshape(-1)),
               "two_stage": lambda d: d.view(g, n // g, k).sum(1, dtype=torch.float32).sum(0),
               "two_stage_b": lambda d: d.view(n // g, g, k).sum(0, dtype=torch.float32).sum(0),
               "t_sum": lambda d: d.t().sum(1)}
        timers = {name: common.GraphTimer(lambda f=f: [(lambda d=d: f(d)) for d in dys]) for name, f in fns.items()}
        times = {name: [] for name in fns}
        for _ in range(3):
            for name, t in timers.items():
                times[name].append(t.median_ms(10) * 1e3)
        row = dict(n=n, k=k, dtype=str(dtype))
        for name, f in fns.items():
            row[name + "_us"] = round(sorted(times[name])[1], 2)
            row[name + "_err"] = err(f(dys[0]))
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "colsum.json"), "w"), indent=1)
