"""Tile sweep of the layer-norm kernels on a GPU: every variant checked against float64, then timed.

The numbers behind ``blocksparse/ops/norms/configs.py``; run it where the table is in doubt:

    python bench/tune_norms.py --out bench/results/raw      # 2-3 minutes on an H200 (~60 kernels compile)
    python bench/tune_norms.py --out /tmp/cpu --cpu         # two variants on tiny shapes (interpreter)

For bfloat16 activations of 8192 tokens x 1024 and x 8192 features, both layouts: the forward over
tokens x features per tile (``BN`` x ``BC``) and warps; the backward over the same and the
persistent programs per SM.  Each variant is timed in a CUDA graph over rotating input copies
(inputs from HBM); ``hbm_frac`` is the bytes that must move (forward 2, backward 3 per element)
per time over the copy bandwidth measured in this run.  The table's own choice is marked
``table``.  Writes ``tune-norms-h200.json`` (all rows, the best per case printed).
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import sys
import time

CPU = "--cpu" in sys.argv
if CPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import common  # noqa: E402
from blocksparse.ops.norms.configs import NormConfig, layer_norm_config  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch._norms import launch  # noqa: E402

SHAPES = ((16, 40),) if CPU else ((8192, 1024), (8192, 8192))


def variants(axis, c, backward):
    """Tile configurations to try (the table's first)."""
    table = layer_norm_config(axis, c, 2, backward)
    yield table
    if CPU:
        yield NormConfig(BN=4, BC=16, num_warps=4, programs_per_sm=1)
        return
    row = 1 << (c - 1).bit_length()
    if axis == 1:
        tiles = [(bn, min(row, 16384)) for bn in (1, 2, 4, 8, 16, 32) if 2048 <= bn * min(row, 16384) <= 32768]
        warps, programs = (8, 16), (1, 2, 4)
    else:
        tiles = [(bn, bc) for bn in (8, 16, 32, 64) for bc in (128, 256)]
        warps, programs = (4, 8), (1, 2)
    for (bn, bc), w, pps in itertools.product(tiles, warps, programs if backward else (2,)):
        cfg = NormConfig(BN=bn, BC=bc, num_warps=w, programs_per_sm=pps)
        if cfg != table:
            yield cfg


def run(axis, n, c, backward, cfg, tensors, check):
    x, g, b, dy = tensors
    kw = dict(axis=axis, relu=False, segments=1)
    y, mean, rstd = launch.layer_norm_fwd(x, g, b, epsilon=1e-5, cfg=None if backward else cfg, **kw)
    if not backward:
        return (y,) if check else None
    out = launch.layer_norm_bwd(dy, x, g, b, mean, rstd, cfg=cfg, **kw)
    return out if check else None


def sweep(hbm, save):
    device = "cpu" if CPU else "cuda"
    rows = []
    for (n, c), axis, backward in itertools.product(SHAPES, (1, 0), (False, True)):
        gen = torch.Generator(device=device).manual_seed(n + c)
        shape = (n, c) if axis == 1 else (c, n)
        tensors = (torch.randn(shape, device=device, generator=gen).bfloat16(),
                   torch.randn(c, device=device, generator=gen).bfloat16(),
                   torch.randn(c, device=device, generator=gen).bfloat16(),
                   torch.randn(shape, device=device, generator=gen).bfloat16())
        x64, g64, b64, dy64 = (t.double() for t in tensors)
        refs = (ref.layer_norm_grad(dy64, x64, g64, b64, axis=axis, epsilon=1e-5, xp=torch) if backward
                else (ref.layer_norm(x64, g64, b64, axis=axis, epsilon=1e-5, xp=torch),))
        nbytes = (3 if backward else 2) * n * c * 2
        for i, cfg in enumerate(variants(axis, c, backward)):
            row = dict(N=n, C=c, axis=axis, kernel="bwd" if backward else "fwd", table=i == 0, **vars(cfg))
            try:
                with common.poisoned_empty():
                    out = run(axis, n, c, backward, cfg, tensors, True)
                row["rel_err"] = max(common.rel_err(got, want) for got, want in zip(out, refs))
                row["ok"] = row["rel_err"] <= common.tolerance(torch.bfloat16)
                if CPU:
                    row["ms"] = float("nan")
                else:
                    copies = max(2, math.ceil(4 * 60 * 2**20 / (2 * nbytes)))
                    row["ms"] = common.time_rotating_ms(lambda: [
                        functools.partial(run, axis, n, c, backward, cfg, tuple(t.clone() for t in tensors), False)
                        for _ in range(copies)])
                    row["hbm_frac"] = nbytes / row["ms"] / 1e6 / hbm
            except Exception as exc:  # recorded; the sweep goes on
                row["error"] = repr(exc)[:300]
                if not CPU:
                    torch.cuda.synchronize()
            rows.append(row)
            print(json.dumps(row), flush=True)
        save(rows)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/raw")
    ap.add_argument("--cpu", action="store_true", help="tiny shapes through Triton's interpreter")
    args = ap.parse_args()
    t0 = time.time()
    hbm = None if CPU else common.hbm_bandwidth_gbs()
    meta = dict(device="CPU" if CPU else torch.cuda.get_device_name(), torch=torch.__version__,
                date=time.strftime("%Y-%m-%d"), hbm_gbs=hbm)
    rows = sweep(hbm, common.result_writer(args.out, "tune-norms-h200", meta))
    for key, group in itertools.groupby(rows, key=lambda r: (r["N"], r["C"], r["axis"], r["kernel"])):
        group = [r for r in group if r.get("ok")]
        table = next((r for r in group if r["table"]), None)
        best = min(group, key=lambda r: r["ms"], default=None)
        if best is not None and table is not None:
            print(key, "table", table.get("hbm_frac"), "best", best.get("hbm_frac"),
                  {k: best[k] for k in ("BN", "BC", "num_warps", "programs_per_sm")})
    bad = [r for r in rows if not r.get("ok")]
    print(f"{len(rows)} variants, {len(bad)} failed or inaccurate; {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
