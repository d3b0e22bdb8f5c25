"""GPU time per kernel in one bf16 training step of the large pixelfly MLP (``bench/pixelfly.py``'s
2048 -> 8192 -> 4096, block 256, butterfly 64, input [16, 512, 2048], ``impl="kernels"``) and of the
same MLP of ``nn.Linear``: ``torch.profiler`` over 10 steps after 5 warm-up steps.  The input
requires its gradient, as in ``pixelfly.py`` (the runs in ``results/raw/`` before 2026-12-04 did
not: they lack the first layer's bprop); the wall time of a step, outside the profiler, is
printed too.

    python bench/profile_pixelfly.py     # on a GPU, about 15 s; prints the tables, writes $OUT/prof-pixelfly.json

``results/raw/profile-pixelfly-large-bf16-h200.json`` holds two such runs (before and after the
native op's re-blocking copies moved 8-byte words)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from blocksparse.torch import PixelflyLinear  # noqa: E402



def mlp(kind):
    layers = [(2048, 8192), (8192, 4096)]
    if kind == "dense":
        mods = [torch.nn.Linear(i, o) for i, o in layers]
    else:
        mods = [PixelflyLinear(i, o, 256, 64, impl="kernels") for i, o in layers]
    return torch.nn.Sequential(*mods).cuda().bfloat16()


out = {}
for kind in ("sparse", "dense"):
    m = mlp(kind)
    x = torch.randn(16, 512, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(5):
        m(x).sum().backward()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        m(x).sum().backward()
    end.record()
    torch.cuda.synchronize()
    print(kind, "wall us/step", round(start.elapsed_time(end) * 1000 / 20, 1))
    steps = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            m(x).sum().backward()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0 and e.count >= steps:
            rows.append((e.key[:90], e.count // steps, t / steps))
    rows.sort(key=lambda r: -r[2])
    out[kind] = rows
    print(kind, "total us/step", round(sum(r[2] for r in rows), 1))
    for r in rows[:25]:
        print(f"   {r[2]:9.1f} us  x{r[1]}  {r[0]}")
    if kind == "sparse":
        for mod in m:
            print("   plan:", mod.plan() if hasattr(mod, "plan") else None)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "prof-pixelfly.json"), "w"), indent=1)
