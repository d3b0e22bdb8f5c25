"""Where an eager training step of a block-sparse layer spends its time, on a GPU: the PyTorch
profiler over a few forward + backward steps of ``BlocksparseLinear`` and of ``nn.Linear`` (same
shape), printing the host-side ops by self time and every synchronising call it saw.

    python bench/profile_eager.py [--tokens 8192] [--features 1024] [--block-size 32]

Prints two tables (about 20 s on an H200).  ``bench/latency.py`` measures; this one explains.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    n, c, bs = args.tokens, args.features, args.block_size
    layout = random_layout(np.random.default_rng(0), c // bs, c // bs, args.density, cover=True)
    factory = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(n, c, **factory).requires_grad_()
    dy = torch.randn(n, c, **factory)
    report("BlocksparseLinear", BlocksparseLinear(layout, bs, **factory), x, dy, args.steps)
    report("nn.Linear", torch.nn.Linear(c, c, **factory), x, dy, args.steps)


if __name__ == "__main__":
    main()
