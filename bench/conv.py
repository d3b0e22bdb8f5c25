"""Block-sparse convolution benchmark: ours vs the dense convolution with the block-masked filter.

    python bench/conv.py --out bench/results                 (H200: about 2 minutes)
    python bench/conv.py --out /tmp/conv --quick             (GPU, one shape: ~15 s)
    python bench/conv.py --out /tmp/conv --quick --cpu       (tiny sizes on the CPU: checks the script)

PyTorch, NCHW activations of ResNet-like 2-D layers (N = 32; 56x56x256, 28x28x512, 14x14x1024
channels; 3x3 and 1x1 filters; stride 1 and 2), ``C = K`` split into blocks of 32 / 64 / 128
channels at densities 0.25 and 0.5.  Layouts: "balanced" (every output block column holds the same
number of input blocks: one grouped convolution), and "random" (each block present with
probability ``density``, every row and column covered: several grouped convolutions and an output
shuffle) for the 3x3 stride-1 shapes.  bf16 everywhere, fp32 (cuDNN's default TF32 for both
sides) at block size 64 on the 3x3 stride-1 shapes.  60 rows.

* ``blocksparse``  ``blocksparse.torch.BlocksparseConv`` called as a user does (public API, auto
                   path: the grouped cuDNN path for all these layouts), channels-last input.
* ``dense``        ``F.conv2d`` with the dense filter that is zero outside the blocks (cuDNN),
                   NCHW and channels-last, timed once per shape; the faster of the two is the
                   baseline (its format is reported).

``fwd`` times the output; ``fwd+bwd`` the output and the gradients of the input and the filter;
``gather_ms`` the grouped path's input-channel gathers alone (part of ``fwd``).
Every configuration is first checked against float64 on two images (outputs NaN-poisoned; y, dx,
dF within the dtype's tolerance); a failed check or an exception marks the row and the run goes
on.  ``speedup`` = baseline ms / ours ms (> 1: ours is faster).  Medians of
``triton.testing.do_bench`` (L2 flushed between calls); on the CPU, medians of wall time.
Writes ``conv-<tag>.json`` (after every case, so a partial run keeps its rows) and
``conv-<tag>.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.torch import BlocksparseConv  # noqa: E402
from blocksparse.torch._conv import compute  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: name (H x W x C, filter, stride) -> (N, H = W, C = K, R = S, stride)
SHAPES = {
    "56x56x256-3x3": (32, 56, 256, 3, 1), "56x56x256-1x1": (32, 56, 256, 1, 1),
    "56x56x256-3x3-s2": (32, 56, 256, 3, 2),
    "28x28x512-3x3": (32, 28, 512, 3, 1), "28x28x512-1x1": (32, 28, 512, 1, 1),
    "14x14x1024-3x3": (32, 14, 1024, 3, 1), "14x14x1024-1x1": (32, 14, 1024, 1, 1),
    "14x14x1024-1x1-s2": (32, 14, 1024, 1, 2),
}
CPU_SHAPES = {"8x8x64-3x3": (2, 8, 64, 3, 1), "8x8x64-1x1-s2": (2, 8, 64, 1, 2)}
BLOCKS, CPU_BLOCKS = (32, 64, 128), (16, 32)
DENSITIES = (0.25, 0.5)
CHECK_N = 2


def layout(kind, CB, density, seed):
    """``(CB, CB)`` 0/1 block mask: "balanced" (round(density * CB) blocks per column) or "random"."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return random_layout(rng, CB, CB, density, cover=True)
    mask = np.zeros((CB, CB), dtype=int)
    for k in range(CB):
        mask[rng.choice(CB, max(1, round(density * CB)), replace=False), k] = 1
    return mask


def bck_of(mask, bs):
    """BCK of a block mask, blocks listed column by column (so outputs come out in order)."""
    return [(range(c * bs, (c + 1) * bs), range(k * bs, (k + 1) * bs))
            for k in range(mask.shape[1]) for c in np.flatnonzero(mask[:, k])]


def only(names, only_names):
    """``names`` (a dict or tuple) cut to the comma-separated ``only_names`` (None: all), in that order;
    an unknown name raises ``ValueError``."""
    if not only_names:
        return names
    wanted = only_names.split(",")
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise ValueError(f"unknown names {unknown}; expected some of {list(names)}")
    return {n: names[n] for n in wanted} if isinstance(names, dict) else tuple(wanted)


def cases(quick, cpu, only_shapes=None, only_dtypes=None):
    """``(dtype, shape, block size, density, layout kind)`` of every row (``only_*``: comma-separated
    names to keep)."""
    if cpu:
        shapes, blocks, dtypes = CPU_SHAPES, CPU_BLOCKS, ("fp32",)
    else:
        shapes, blocks, dtypes = SHAPES, BLOCKS, tuple(DTYPES)
    shapes, dtypes = only(shapes, only_shapes), only(dtypes, only_dtypes)
    if quick:
        shapes = ["8x8x64-3x3"] if cpu else ["28x28x512-3x3"]
        return [(dtypes[0], shapes[0], blocks[1], 0.25, "balanced")]
    out = []
    for dt in dtypes:
        for shape in shapes:
            for bs in blocks:
                if dt == "fp32" and not cpu and (bs != 64 or not shape.endswith("-3x3")):
                    continue
                for density in DENSITIES:
                    out.append((dt, shape, bs, density, "balanced"))
                    if shape.endswith("-3x3") and bs == 64 and dt == "bf16":
                        out.append((dt, shape, bs, density, "random"))
    return out


class Case:
    def __init__(self, dt, shape, bs, density, kind, device, seed):
        N, HW, C, RS, stride = (CPU_SHAPES if device == "cpu" else SHAPES)[shape]
        self.dtype, self.stride, self.pad = DTYPES[dt], stride, RS // 2
        self.mask, self.bs = layout(kind, C // bs, density, seed), bs
        self.op = BlocksparseConv(bck_of(self.mask, bs), (RS, RS), (HW, HW), strides=stride)
        g = torch.Generator(device="cpu").manual_seed(seed)
        f = torch.randn(self.op.f_shape(), generator=g) / (C * density * RS * RS) ** 0.5
        self.F = f.to(device, self.dtype).requires_grad_()
        x = torch.randn(N, C, HW, HW, generator=g)
        self.x = x.to(device, self.dtype).to(memory_format=torch.channels_last).requires_grad_()
        self.dy = torch.randn(self.op.o_shape(N), generator=g).to(device, self.dtype)
        self.dy = self.dy.to(memory_format=torch.channels_last)
        self.density = self.op.density
        self.path = compute.choose(self.op.spec, self.x)

    def dense_filter(self, F_value, dtype):
        """``(K, C, R, S)`` dense filter, zero outside the blocks (built from the mask, not the library)."""
        C, bs = self.mask.shape[0] * self.bs, self.bs
        w = torch.zeros(C, C, *F_value.shape[-2:], dtype=dtype, device=F_value.device)
        for b, (k, c) in enumerate((k, c) for k in range(self.mask.shape[1]) for c in np.flatnonzero(self.mask[:, k])):
            w[k * bs:(k + 1) * bs, c * bs:(c + 1) * bs] = F_value[b].to(dtype)
        return w

    def check(self):
        """Max relative error of y, dx, dF on ``CHECK_N`` images against float64: the public call and
        every path that can run the layout."""
        x = self.x[:CHECK_N].detach().contiguous(memory_format=torch.channels_last).requires_grad_()
        dy = self.dy[:CHECK_N]
        x64 = x.detach().double().requires_grad_()
        F64 = self.F.detach().double().requires_grad_()
        y64 = F.conv2d(x64, self.dense_filter(F64, torch.float64), stride=self.stride, padding=self.pad)
        refs = [y64.detach(), *torch.autograd.grad(y64, [x64, F64], dy.double())]
        worst = 0.0
        paths = ("public", "dense", "grouped") + (("matmul",) if self.op.spec.pointwise is not None else ())
        for path in paths:
            with poisoned_empty():
                if path == "public":
                    y = self.op(self.F, x)
                else:
                    y = compute.convolve(x, self.F.reshape(-1), None, self.op.spec, self.op._tables, path=path)
                got = [y, *torch.autograd.grad(y, [x, self.F], dy)]
            errs = [rel_error(g, r) for g, r in zip(got, refs)]
            worst = max(worst, *errs)
            # float32 convolutions use TF32 where PyTorch allows it for cuDNN (its default), ours and the baseline alike
            bound = tolerance(self.dtype, tf32=self.dtype == torch.float32 and torch.backends.cudnn.allow_tf32)
            if max(errs) > bound:
                raise AssertionError(f"{path} path: relative errors y/dx/dF {errs} > {bound}")
        return worst

    def gather(self):
        """The grouped path's input gathers alone (None when it has none)."""
        buckets = [(b, t) for b, t in zip(self.op.spec.grouped.buckets, self.op._tables.on(self.x.device).inputs)
                   if b.input_span is None]
        if self.path == "matmul" or not buckets:
            return None
        x = self.x.detach()
        return lambda: [compute._channels(x, index) for _, index in buckets]

    def ours(self, backward):
        def run():
            y = self.op(self.F, self.x)
            if backward:
                torch.autograd.grad(y, [self.x, self.F], self.dy)
        return run


def dense_runs(case, channels_last, backward):
    W = case.dense_filter(case.F.detach(), case.dtype).requires_grad_()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = case.x.detach().contiguous(memory_format=fmt).requires_grad_()
    W = W.detach().contiguous(memory_format=fmt).requires_grad_()
    dy = case.dy.contiguous(memory_format=fmt)

    def run():
        y = F.conv2d(x, W, stride=case.stride, padding=case.pad)
        if backward:
            torch.autograd.grad(y, [x, W], dy)
    return run


def timer(device):
    if device == "cuda":
        import triton
        return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")

    def cpu_ms(fn, reps=5):
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    return cpu_ms


def _geomean(values):
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def markdown(rows, meta):
    lines = [f"# Block-sparse convolution vs dense masked cuDNN ({meta['device']})", "",
             f"torch {meta['torch']}, {meta['when']}; shapes: N x C x H x W, C = K, NCHW tensors with "
             "channels-last data for ours; ms = median; speedup = dense baseline / ours (> 1: ours is faster); "
             "the baseline is the faster dense format.", ""]
    ok = [r for r in rows if "error" not in r]
    if ok:
        lines += ["Geometric mean speedup fwd / fwd+bwd, balanced layouts:", "",
                  "| dtype | bs | " + " | ".join(f"density {d}" for d in DENSITIES) + " |",
                  "|---|---|" + "---|" * len(DENSITIES)]
        for dt in DTYPES:
            for bs in sorted({r["bs"] for r in ok}):
                cells = []
                for d in DENSITIES:
                    sel = [r for r in ok if (r["dtype"], r["bs"], r["density"], r["layout"]) == (dt, bs, d, "balanced")]
                    gm = [_geomean([r[k] for r in sel]) for k in ("speedup_fwd", "speedup_fwdbwd")]
                    cells.append(f"{gm[0]:.2f} / {gm[1]:.2f} ({len(sel)})" if sel else "")
                if any(cells):
                    lines.append(f"| {dt} | {bs} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| dtype | shape | bs | density | layout | path | ours fwd / fwd+bwd ms (gather) | dense fwd / fwd+bwd "
              "ms (format) | speedup fwd / fwd+bwd | max rel err |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['dtype']} | {r['shape']} | {r['bs']} | {r['density']} | {r['layout']} |"
        if "error" in r:
            lines.append(f"{head} FAILED: {r['error'][:100]} | | | | |")
            continue
        gather = "" if r["gather_ms"] is None else f" ({r['gather_ms']:.3f})"
        lines.append(
            f"{head} {r['path']} | {r['ours_fwd_ms']:.3f} / {r['ours_fwdbwd_ms']:.3f}{gather} | "
            f"{r['dense_fwd_ms']:.3f} / {r['dense_fwdbwd_ms']:.3f} ({r['dense_format']}) | "
            f"{r['speedup_fwd']:.2f} / {r['speedup_fwdbwd']:.2f} | {r['max_rel_err']:.1e} |")
    return "\n".join(lines) + "\n"


def begin_run(doc, stem, argv, quick_help, cpu_help, install=None):
    """The command line of a convolution benchmark: ``(args, device, meta, json path)``; the output
    folder made, cuDNN's autotuner on for GPU runs.  ``install``: the help of an ``--install`` flag
    (None: no such flag)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    if install:
        parser.add_argument("--install", action="store_true", help=install)
    parser.add_argument("--out", required=True, help=f"folder for {stem}-<tag>.json / .md")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--cpu", action="store_true", help=cpu_help)
    parser.add_argument("--tag", default=None, help="file name tag (default: h200 / the GPU's name / cpu)")
    parser.add_argument("--shapes", default=None, help="comma-separated shape names: only these (a part of a run)")
    parser.add_argument("--dtypes", default=None, help="comma-separated dtypes: only these (a part of a run)")
    args = parser.parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda":
        if not torch.cuda.is_available():
            parser.error("no CUDA device: use --cpu for a CPU smoke run")
        torch.backends.cudnn.benchmark = True
        name = torch.cuda.get_device_name()
    else:
        name = "cpu"
    tag = args.tag or ("h200" if "H200" in name else "".join(ch for ch in name.lower() if ch.isalnum()) or "gpu")
    os.makedirs(args.out, exist_ok=True)
    from blocksparse._kernels import describe

    meta = {"device": name, "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M"),
            "kernels": describe()}
    return args, device, meta, os.path.join(args.out, f"{stem}-{tag}.json")


def run_rows(todo, measure, path_json, meta, dense_ms, device):
    """``todo``'s rows (dicts naming them), each completed by ``measure(seed, row)``; a row that
    raises records the error and the run goes on; the JSON is rewritten after every row."""
    rows = []
    for seed, row in enumerate(todo):
        try:
            row.update(measure(seed, row))
        except Exception as exc:  # keep going: the row says what failed
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(path_json, "w") as f:
            json.dump({"meta": meta, "dense_ms": dense_ms, "rows": rows}, f, indent=1)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None):
    args, device, meta, path_json = begin_run(__doc__, "conv", argv, "one shape and block size (a smoke run)",
                                          "tiny sizes on the CPU (checks the script)")
    ms = timer(device)
    dense_ms = {}
    started = time.time()

    def measure(seed, row):
        case = Case(row["dtype"], row["shape"], row["bs"], row["density"], row["layout"], device, seed)
        out = dict(density_actual=case.density, path=case.path, max_rel_err=case.check())
        key = f"{row['dtype']} {row['shape']}"
        if key not in dense_ms:  # the dense convolution's time does not depend on the mask
            dense_ms[key] = {f"{fmt} {what}": ms(dense_runs(case, fmt == "channels_last", what == "fwd+bwd"))
                             for fmt in ("NCHW", "channels_last") for what in ("fwd", "fwd+bwd")}
        t = dense_ms[key]
        fmt = min(("NCHW", "channels_last"), key=lambda f: t[f"{f} fwd"] + t[f"{f} fwd+bwd"])
        fwd, fwdbwd = t[f"{fmt} fwd"], t[f"{fmt} fwd+bwd"]
        out.update(dense_fwd_ms=fwd, dense_fwdbwd_ms=fwdbwd, dense_format=fmt,
                   ours_fwd_ms=ms(case.ours(False)), ours_fwdbwd_ms=ms(case.ours(True)))
        gather = case.gather()
        out["gather_ms"] = None if gather is None else ms(gather)
        out.update(speedup_fwd=fwd / out["ours_fwd_ms"], speedup_fwdbwd=fwdbwd / out["ours_fwdbwd_ms"])
        return out

    names = ("dtype", "shape", "bs", "density", "layout")
    rows = run_rows([dict(zip(names, c)) for c in cases(args.quick, args.cpu, args.shapes, args.dtypes)], measure, path_json, meta,
                    dense_ms, device)
    with open(path_json[:-len(".json")] + ".md", "w") as f:
        f.write(markdown(rows, meta))
    failed = sum("error" in r for r in rows)
    print(f"{len(rows)} rows, {failed} failed, {time.time() - started:.0f} s -> {path_json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
