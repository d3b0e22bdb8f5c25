"""Block-sparse training on several GPUs of one host: DDP and FSDP2 (NCCL) against one GPU.

Two parts, each a ``torchrun``-style job started by this script (``blocksparse.testing.distributed``):

* **equivalence** -- a small block-sparse MLP trained 20 steps (float32, exact products) on one
  GPU with the whole batch, and on 2 GPUs with DDP and with FSDP2 (``fully_shard``: the block
  weights sharded over the ranks) with half the batch each: the loss curves must agree within
  float tolerance;
* **scaling** -- a large block-sparse MLP (bf16, C = 8192 -> 32768 -> 8192, bs 128, density 0.25)
  timed per training step on 1 GPU and on 2 GPUs with the same per-GPU batch (DDP): throughput
  scaling = 2 * t(1 GPU) / t(2 GPUs) (goal >= 1.8).

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``).  Usage::

    python bench/multigpu.py --out DIR [--gpus 2] [--quick]

Writes ``DIR/multigpu-h200.json`` and ``.md``.  About 2 minutes on two H200s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _model(sizes, bs, density, dtype, seed):
    import numpy as np
    import torch

    from blocksparse.testing.matmul import random_layout
    from blocksparse.torch import BlocksparseLinear

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    layers = []
    for i, (c, k) in enumerate(zip(sizes[:-1], sizes[1:])):
        layout = random_layout(rng, c // bs, k // bs, density, cover=True)
        layers.append(BlocksparseLinear(layout, block_size=bs, device="cuda", dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(torch.nn.GELU())
    return torch.nn.Sequential(*layers)


def _worker(part, mode, out, quick):
    """One rank: train and write this rank's results (rank 0) to ``out``."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    if part == "equivalence":
        sizes, bs, density, dtype, steps, batch = (512, 1024, 512), 64, 0.3, torch.float32, 20, 64
    else:
        sizes, bs, density, dtype = (8192, 32768, 8192), 128, 0.25, torch.bfloat16
        steps, batch = (5 if quick else 30), 16384 * world  # the same batch per GPU at any world
    model = _model(sizes, bs, density, dtype, seed=0)
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if hasattr(layer, "weight"):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(batch, sizes[0], device="cuda", generator=g, dtype=dtype)
    y = torch.randn(batch, sizes[-1], device="cuda", generator=g, dtype=dtype)
    xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
    losses, times = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(xs).float(), ys.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    if rank == 0:
        warm = times[2:] or times
        Path(out).write_text(json.dumps({"losses": losses, "step_s": sorted(warm)[len(warm) // 2]}))
    dist.destroy_process_group()


def _job(part, mode, gpus, tmp, quick):
    from blocksparse.testing.distributed import run_workers

    out = Path(tmp) / f"{part}-{mode}-{gpus}.json"
    run_workers(Path(__file__), ["--worker", part, mode, out] + (["--quick"] if quick else []),
                world_size=gpus, timeout=500, env=ENV)
    return json.loads(out.read_text())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(*args.worker, args.quick)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"gpus": args.gpus, "env": ENV}
    one = _job("equivalence", "single", 1, out, args.quick)
    rows = []
    for mode in ("ddp", "fsdp"):
        many = _job("equivalence", mode, args.gpus, out, args.quick)
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(many["losses"], one["losses"]))
        result[f"equivalence_{mode}"] = {"losses_1gpu": one["losses"], "losses": many["losses"],
                                         "max_rel_diff": diff}
        rows.append(f"| {mode} loss curve vs 1 GPU (20 steps, fp32) | max rel. diff {diff:.1e} |")
    t1 = _job("scaling", "single", 1, out, args.quick)["step_s"]
    tn = _job("scaling", "ddp", args.gpus, out, args.quick)["step_s"]
    result["scaling"] = {"step_s_1gpu": t1, f"step_s_{args.gpus}gpu": tn,
                         "throughput_scaling": args.gpus * t1 / tn}
    rows.append(f"| DDP throughput scaling 1 -> {args.gpus} GPUs (bf16, 8192-32768-8192 bs128 d0.25) | "
                f"{args.gpus * t1 / tn:.2f}x ({t1 * 1e3:.1f} ms -> {tn * 1e3:.1f} ms per step) |")
    (out / "multigpu-h200.json").write_text(json.dumps(result, indent=1))
    table = "| check | result |\n|---|---|\n" + "\n".join(rows) + "\n"
    (out / "multigpu-h200.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
