"""The ``(C, N)`` layer-norm backward on a GPU: the table's one-launch tile against the split
backward (:mod:`blocksparse.ops.norms.split_bwd`), interleaved in one run; with ``--forward`` the
forward: the table's chunked tile against the split forward (:mod:`blocksparse.ops.norms.split_fwd`),
a few tiles of it swept.

    python bench/norms_split.py --out bench/results/raw     # about 40 s
    python bench/norms_split.py --out bench/results/raw --forward   # about 90 s
    python bench/norms_split.py --out /tmp/smoke --cpu [--forward]  # one tiny case through Triton's interpreter

For N in {4096, 8192, 16384} tokens x C in {1024, 4096, 8192} features, bfloat16 and float32: both
backwards through the PyTorch launcher (Triton's JIT), each checked against float64 (``dx``, ``dg``,
``db``: the largest relative error), then timed in CUDA graphs (``do_bench_cudagraph``).  ``hbm`` =
the backward's bytes (``x``, ``dy``, ``dx``: ``3e`` an element) / time over the device-to-device copy
bandwidth measured in the same run.  Writes ``norms-split-bwd-<gpu>.json``.  The forward
(``--forward``): the chunked tile (``old``), the launcher's choice (``new``) and every tile of
:data:`FWD_TILES` (``y``, ``mean``, ``rstd`` checked; ``hbm`` counts ``x`` and ``y``, ``2e`` an
element), into ``norms-split-fwd-<gpu>.json``; ``best`` names the fastest split tile of each row.
"""
import argparse
import json
import os
import sys
import time

CPU = "--cpu" in sys.argv
if CPU:  # before triton is imported: the kernels through the interpreter on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

import common  # noqa: E402
from blocksparse.ops.norms.configs import SplitConfig, layer_norm_config, split_backward_config  # noqa: E402
from blocksparse.ops.norms.configs import split_forward_config  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.testing import rel_error  # noqa: E402
from blocksparse.torch._norms.launch import layer_norm_bwd, layer_norm_fwd  # noqa: E402

EPS = 1e-5
#: Split-forward tiles swept per element size: (BN, R, num_warps, programs_per_sm); slices of up to
#: 2048 features, halved down to 256 until the grid holds programs_per_sm programs a SM.
FWD_TILES = {2: [(128, 16, 4, 4), (128, 16, 4, 8), (128, 16, 4, 2), (128, 8, 4, 4), (128, 16, 8, 4), (256, 8, 4, 4),
                 (256, 16, 8, 4), (64, 16, 4, 4)],
             4: [(64, 16, 4, 4), (64, 16, 4, 8), (64, 8, 4, 4), (128, 8, 4, 4), (128, 16, 8, 4), (32, 32, 4, 4)]}


def _time_ms(call):
    if CPU:  # one call: a smoke run
        start = time.perf_counter()
        call()
        return (time.perf_counter() - start) * 1e3
    return do_bench_cudagraph(call, rep=50)


def case(dtype, n, c, hbm):
    device = "cpu" if CPU else "cuda"
    x = (torch.randn(c, n, device=device) * 2 + 1).to(dtype)
    dy = torch.randn(c, n, device=device).to(dtype)
    g, b = torch.randn(c, device=device), torch.randn(c, device=device)
    _, mean, rstd = layer_norm_fwd(x, g, b, axis=0, epsilon=EPS, relu=False, segments=1)
    want = ref.layer_norm_grad(dy.double(), x.double(), g.double(), b.double(), axis=0, segments=1, epsilon=EPS,
                               xp=torch)
    old = layer_norm_config(0, c, x.element_size(), backward=True)
    row = dict(dtype=str(dtype).removeprefix("torch."), N=n, C=c, old_tile=[old.BN, old.BC],
               split=split_backward_config(0, c, x.element_size()) is not None)
    for name, cfg in (("old", old), ("new", None)):  # None: the launcher's choice (the split backward)
        call = lambda: layer_norm_bwd(dy, x, g, b, mean, rstd, axis=0, relu=False, segments=1, cfg=cfg)  # noqa: E731
        row[f"{name}_err"] = max(rel_error(got, w) for got, w in zip(call(), want))
        row[f"{name}_ms"] = ms = _time_ms(call)
        row[f"{name}_hbm"] = hbm and 3 * n * c * x.element_size() / ms / 1e6 / hbm
    return row


def forward_case(dtype, n, c, hbm):
    device = "cpu" if CPU else "cuda"
    x = (torch.randn(c, n, device=device) * 2 + 1).to(dtype)
    g, b = torch.randn(c, device=device), torch.randn(c, device=device)
    xs = x.double().t()
    mean = xs.mean(1)
    rstd = 1 / torch.sqrt(xs.var(1, unbiased=False) + EPS)
    want = (((xs - mean[:, None]) * rstd[:, None]) * g.double() + b.double()).t(), mean, rstd
    size = x.element_size()
    old = layer_norm_config(0, c, size)
    row = dict(dtype=str(dtype).removeprefix("torch."), N=n, C=c, old_tile=[old.BN, old.BC],
               split=split_forward_config(0, n, c, size) is not None)
    tiles = [("old", old), ("new", None)] + [
        (f"split_{bn}_{r}_{w}_{pps}", SplitConfig(BN=bn, R=r, num_warps=w, FS=2048, MIN_FS=256, programs_per_sm=pps))
        for bn, r, w, pps in (FWD_TILES[size][:1] if CPU else FWD_TILES[size])]
    for name, cfg in tiles:
        call = lambda: layer_norm_fwd(x, g, b, axis=0, epsilon=EPS, relu=False, segments=1, cfg=cfg)  # noqa: E731
        got = call()
        row[f"{name}_err"] = max(rel_error(got[0], want[0]), rel_error(got[1][0], want[1]),
                                 rel_error(got[2][0], want[2]))
        row[f"{name}_ms"] = ms = _time_ms(call)
        row[f"{name}_hbm"] = hbm and 2 * n * c * size / ms / 1e6 / hbm
    splits = [k[:-3] for k in row if k.startswith("split_") and k.endswith("_ms")]
    row["best"] = min(splits, key=lambda k: row[f"{k}_ms"])
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/raw")
    ap.add_argument("--cpu", action="store_true", help="one tiny float32 case through Triton's interpreter")
    ap.add_argument("--forward", action="store_true", help="the forward: the chunked tile against split ones")
    args = ap.parse_args()
    hbm = None if CPU else common.hbm_bandwidth_gbs()
    cases = [(torch.float32, 16, 2048 if args.forward else 1024)] if CPU else [
        (dtype, n, c) for dtype in (torch.bfloat16, torch.float32) for n in (4096, 8192, 16384) for c in (1024, 4096, 8192)]
    rows = []
    for dtype, n, c in cases:
        rows.append((forward_case if args.forward else case)(dtype, n, c, hbm))
        print(json.dumps(rows[-1]), flush=True)
    device = "cpu" if CPU else torch.cuda.get_device_name()
    gpu = "cpu" if CPU else "h200" if "H200" in device else "h100"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"norms-split-{'fwd' if args.forward else 'bwd'}-{gpu}.json"), "w") as f:
        json.dump(dict(device=device, hbm_gbs=hbm, rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
