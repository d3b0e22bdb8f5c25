"""Tile sweep of the layer-norm and LSTM-gate kernels on a GPU: every variant checked against
float64, then timed.

The numbers behind ``blocksparse/ops/norms/configs.py`` and ``blocksparse/ops/lstm/configs.py``;
run it where a table is in doubt (``python -m blocksparse.aot.resources`` first shows, without a
GPU, which tiles spill registers):

    python bench/tune_norms.py --out bench/results/raw      # about 5 minutes on an H200 (~300 variants)
    python bench/tune_norms.py --out /tmp/cpu --cpu         # a few variants on tiny shapes (interpreter)
    python bench/tune_norms.py --ops layer_norm --axes 0    # one family, one layout
    python bench/tune_norms.py --ops layer_norm --axes 0 --one-chunk   # (C, N) also whole segments a tile

For bfloat16 activations of 8192 tokens x 1024 and x 8192 features, both layouts: the forward and
the backward over tokens x features per tile (``BN`` x ``BC``), warps and programs per SM (0: one
program per token tile; else persistent programs, each loading its next tile while it works on
the current one).  Then the LSTM gates (merged gates with a bias) of 8192 tokens x 1024 and x 4096
cell features over their tile, warps and (backward) programs per SM.  Each variant is timed in a
CUDA graph over rotating input copies (inputs from HBM); ``hbm_frac`` is the bytes that must move
(layer norm forward 2, backward 3 per element; gates forward 7, backward 12 per cell element) per
time over the copy bandwidth measured in this run.  The table's own choice is marked ``table``.
Writes ``tune-norms-h200.json`` (all rows, the best per case printed).
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
ONE_CHUNK = "--one-chunk" in sys.argv
if CPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import common  # noqa: E402
from blocksparse.ops.lstm.configs import GatesConfig, lstm_gates_config  # noqa: E402
from blocksparse.ops.norms.configs import MEASURED, MEASURED_RELU, NormConfig, layer_norm_config  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch._lstm import launch as gates_launch  # noqa: E402
from blocksparse.torch._norms import launch  # noqa: E402

#: A swept tile enters ``configs.MEASURED`` (``--install``) when it is faster than the table's by this.
MARGIN = 1.03
SHAPES = ((16, 40),) if CPU else ((8192, 1024), (8192, 8192))
GATE_SHAPES = ((12, 24),) if CPU else ((8192, 1024), (8192, 4096))


def variants(axis, c, backward, element_size=2, relu=False):
    """Tile configurations to try (the table's first)."""
    table = layer_norm_config(axis, c, element_size, backward, relu)
    yield table
    if CPU:
        yield NormConfig(BN=4, BC=16, num_warps=4, programs_per_sm=1)
        return
    row = 1 << (c - 1).bit_length()
    if axis == 1:
        tiles = [(bn, min(row, 16384)) for bn in (1, 2, 4, 8, 16) if 1024 <= bn * min(row, 16384) <= 16384]
        warps = (4, 8, 16)
        programs = (1, 2, 4, 8) if backward else (0, 1, 2, 4, 8)
    else:
        tiles = [(bn, bc) for bn in (16, 32, 64) for bc in (128, 256, 512) if 2048 <= bn * bc <= 16384]
        warps = (4, 8)
        if ONE_CHUNK:  # whole segments of up to 4096 features a tile (x read once), a few tokens wide
            tiles += [(bn, row) for bn in (4, 8, 16, 32) if 512 < row <= 4096 and 4096 <= bn * row <= 32768]
            warps = (4, 8, 16, 32)
        programs = (1, 2) if backward else (0, 2)
    for (bn, bc), w, pps in itertools.product(tiles, warps, programs):
        if not 16 <= bn * bc // (w * 32) <= 64:  # over 64 elements a thread spill; under 16 idle
            continue
        if pps * w > 32:  # more warps than two thirds of a SM holds
            continue
        cfg = NormConfig(BN=bn, BC=bc, num_warps=w, programs_per_sm=pps)
        if cfg != table:
            yield cfg


def _time_and_check(row, fn, tensors, refs, nbytes, hbm, tol=None):
    """Check ``fn(*tensors)`` against float64 ``refs`` (fresh outputs NaN-poisoned), then time it
    over rotating copies of ``tensors``; fills ``row``."""
    try:
        with common.poisoned_empty():
            out = fn(*tensors)
        row["rel_err"] = max(common.rel_err(got, want) for got, want in zip(out, refs) if want is not None)
        row["ok"] = row["rel_err"] <= (common.tolerance(torch.bfloat16) if tol is None else tol)
        if CPU:
            row["ms"] = float("nan")
        else:
            copies = max(2, math.ceil(4 * 60 * 2**20 / (2 * nbytes)))
            row["ms"] = common.time_rotating_ms(lambda: [
                functools.partial(fn, *(t.clone() for t in tensors)) for _ in range(copies)])
            row["hbm_frac"] = nbytes / row["ms"] / 1e6 / hbm
    except Exception as exc:  # recorded; the sweep goes on
        row["error"] = repr(exc)[:300]
        if not CPU:
            torch.cuda.synchronize()
    print(json.dumps(row), flush=True)
    return row


def sweep_layer_norm(hbm, rows, save, axes=(1, 0), shapes=SHAPES, dtypes=("bf16",), relu=False,
                     kernels=("fwd", "bwd")):
    device = "cpu" if CPU else "cuda"
    kw = dict(relu=relu, segments=1)
    for dt, (n, c), axis, backward in itertools.product(dtypes, shapes, axes, [k == "bwd" for k in kernels]):
        dtype = common.DTYPES[dt]
        gen = torch.Generator(device=device).manual_seed(n + c)
        shape = (n, c) if axis == 1 else (c, n)
        x, g, b, dy = (torch.randn(shape, device=device, generator=gen).to(dtype),
                       torch.randn(c, device=device, generator=gen).to(dtype),
                       torch.randn(c, device=device, generator=gen).to(dtype),
                       torch.randn(shape, device=device, generator=gen).to(dtype))
        x64, g64, b64, dy64 = (t.double() for t in (x, g, b, dy))
        y64 = ref.layer_norm(x64, g64, b64, axis=axis, epsilon=1e-5, relu=relu, xp=torch)
        if relu:  # no gradient where the relu's mask may differ from float64's
            dy64 = ref.relu_safe(dy64, y64)
            dy = dy64.to(dtype)
        if backward:
            _, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=axis, epsilon=1e-5, **kw)
            tensors = (dy, x, g, b, mean, rstd)
            refs = ref.layer_norm_grad(dy64, x64, g64, b64, axis=axis, epsilon=1e-5, relu=relu, xp=torch)
        else:
            tensors = (x, g, b)
            refs = (y64,)
        size = x.element_size()
        if backward == (kernels[0] == "bwd") and axis == axes[0]:  # the ceiling: a plain copy of the same bytes
            row = dict(op="copy", dtype=dt, N=n, C=c, axis=axis, kernel="fwd", table=False)
            rows.append(_time_and_check(row, lambda x: (x.clone(),), (x,), (x64,), 2 * n * c * size, hbm))
        for i, cfg in enumerate(variants(axis, c, backward, size, relu)):
            if backward:
                fn = functools.partial(launch.layer_norm_bwd, axis=axis, cfg=cfg, **kw)
            else:
                fn = functools.partial(launch.layer_norm_fwd, axis=axis, epsilon=1e-5, cfg=cfg, **kw)
            row = dict(op="layer_norm", dtype=dt, N=n, C=c, axis=axis, kernel="bwd" if backward else "fwd",
                       relu=relu, table=i == 0, **vars(cfg))
            rows.append(_time_and_check(row, fn, tensors, refs, (3 if backward else 2) * n * c * size, hbm,
                                        common.tolerance(dtype)))
        save(rows)


def suggested_tiles(rows, current):
    """``current`` (the ``MEASURED`` table) updated from the layer-norm rows: per dtype, features,
    layout and kernel, at the largest token count swept, the fastest accurate variant where it beat
    the table's tile by more than ``MARGIN`` (else the table's tile, if it was a measured one)."""
    table, cases = dict(current), {}
    for r in rows:
        if r["op"] == "layer_norm" and r.get("ok"):
            key = (r["axis"], 1 << (r["C"] - 1).bit_length(), common.DTYPES[r["dtype"]].itemsize, r["kernel"] == "bwd")
            cases.setdefault(key, []).append(r)
    for key, group in cases.items():
        group = [r for r in group if r["N"] == max(v["N"] for v in group)]
        ruled = next((r for r in group if r["table"]), None)
        best = min(group, key=lambda r: r["ms"])
        if ruled is not None and best["ms"] * MARGIN < ruled["ms"]:
            table[key] = NormConfig(BN=best["BN"], BC=best["BC"], num_warps=best["num_warps"],
                                    programs_per_sm=best["programs_per_sm"])
    return table


def measured_source(table, name="MEASURED"):
    """The Python source of ``name = {...}`` (``MEASURED`` or ``MEASURED_RELU``), one entry a line."""
    lines = [f"    {key!r}: {cfg!r}," for key, cfg in sorted(table.items())]
    return f"{name} = {{\n" + "".join(line + "\n" for line in lines) + "}"


def gates_variants(k, backward):
    """LSTM gate tiles to try (the table's first)."""
    table = lstm_gates_config(k, backward)
    yield table
    if CPU:
        yield GatesConfig(BN=4, BK=16, num_warps=4, programs_per_sm=1)
        return
    # the backward holds seven tensors' tiles twice (the next one prefetched): 16 elements a thread of
    # each spill registers, so smaller tiles too
    tiles, bks = ((512, 1024, 2048), (128,)) if backward else ((2048, 4096), (128, 256))
    for tile, bk, w, pps in itertools.product(tiles, bks, (4, 8), (2, 4, 8) if backward else (4,)):
        cfg = GatesConfig(BN=tile // bk, BK=bk, num_warps=w, programs_per_sm=pps)
        if cfg != table:
            yield cfg


def sweep_gates(hbm, rows, save):
    device = "cpu" if CPU else "cuda"
    for (n, k), backward in itertools.product(GATE_SHAPES, (False, True)):
        gen = torch.Generator(device=device).manual_seed(n + k)
        c, h, bias, dcn, dhn = (torch.randn(shape, device=device, generator=gen).bfloat16()
                                for shape in ((n, k), (n, 4 * k), (4 * k,), (n, k), (n, k)))
        f64 = [t.double() for t in (c, h, bias, dcn, dhn)]
        if backward:
            tensors = (c, h, bias, dcn, dhn)
            refs = ref.lstm_gates_grad(f64[3], f64[4], f64[0], f64[1], bias=f64[2], xp=torch)
        else:
            tensors = (c, h, bias)
            refs = ref.lstm_gates(f64[0], f64[1], bias=f64[2], xp=torch)
        for i, cfg in enumerate(gates_variants(k, backward)):
            if backward:
                def fn(c, h, bias, dcn, dhn, cfg=cfg):
                    return gates_launch.lstm_gates_bwd(c, h.split(k, 1), bias, dcn, dhn, forget_bias=1.0,
                                                       merged=True, cfg=cfg)
            else:
                def fn(c, h, bias, cfg=cfg):
                    return gates_launch.lstm_gates_fwd(c, h.split(k, 1), bias, forget_bias=1.0, cfg=cfg)
            row = dict(op="lstm_gates", N=n, C=k, axis=1, kernel="bwd" if backward else "fwd", table=i == 0,
                       **vars(cfg))
            rows.append(_time_and_check(row, fn, tensors, refs, (12 if backward else 7) * n * k * 2, hbm))
        save(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/raw")
    ap.add_argument("--cpu", action="store_true", help="tiny shapes through Triton's interpreter")
    ap.add_argument("--ops", nargs="+", default=["layer_norm", "lstm_gates"], choices=["layer_norm", "lstm_gates"])
    ap.add_argument("--axes", nargs="+", type=int, default=[1, 0], choices=[1, 0], help="layer-norm layouts to sweep")
    ap.add_argument("--shapes", nargs="+", metavar="NxC", help="layer-norm shapes (tokens x features) instead "
                    "of 8192 x 1024 and 8192 x 8192")
    ap.add_argument("--dtypes", nargs="+", default=["bf16"], choices=sorted(common.DTYPES),
                    help="layer-norm activation dtypes (the LSTM gates: bf16)")
    ap.add_argument("--kernels", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"],
                    help="layer-norm directions to sweep")
    ap.add_argument("--relu", action="store_true", help="layer norm with the fused relu (its backward also "
                    "holds the bias to recompute the mask: more registers)")
    ap.add_argument("--one-chunk", action="store_true", help="(C, N): also tiles holding whole segments of up to "
                    "4096 features (x read once; 4-32 tokens wide, up to 32 warps)")
    ap.add_argument("--name", default="tune-norms-h200", help="output file name (without .json)")
    ap.add_argument("--install", action="store_true", help="write the layer-norm tiles that beat the table "
                    f"by {MARGIN}x into blocksparse/ops/norms/configs.py (MEASURED; a GPU run without failures)")
    args = ap.parse_args()
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    t0 = time.time()
    hbm = None if CPU else common.hbm_bandwidth_gbs()
    meta = dict(device="CPU" if CPU else torch.cuda.get_device_name(), torch=torch.__version__,
                date=time.strftime("%Y-%m-%d"), hbm_gbs=hbm)
    rows, save = [], common.result_writer(args.out, args.name, meta)
    if "layer_norm" in args.ops:
        sweep_layer_norm(hbm, rows, save, args.axes, shapes, args.dtypes, args.relu, args.kernels)
    if "lstm_gates" in args.ops:
        sweep_gates(hbm, rows, save)
    for key, group in itertools.groupby(rows, key=lambda r: (r["op"], r.get("dtype", "bf16"), r["N"], r["C"], r["axis"],
                                                             r["kernel"])):
        group = [r for r in group if r.get("ok")]
        table = next((r for r in group if r["table"]), None)
        best = min(group, key=lambda r: r["ms"], default=None)
        if best is not None and table is not None:
            print(key, "table", table.get("hbm_frac"), "best", best.get("hbm_frac"),
                  {k: best[k] for k in ("BN", "BC", "BK", "num_warps", "programs_per_sm") if k in best})
    bad = [r for r in rows if not r.get("ok")]
    print(f"{len(rows)} variants, {len(bad)} failed or inaccurate; {time.time() - t0:.0f}s")
    if args.install and "layer_norm" in args.ops:
        if bad or CPU:
            print("--install: not installed (a GPU run without failures only)")
            return 1
        name, current = ("MEASURED_RELU", MEASURED_RELU) if args.relu else ("MEASURED", MEASURED)
        source = measured_source(suggested_tiles(rows, current), name)
        common.install_literal(common.package_file("ops", "norms", "configs.py"), name, source)
        with open(os.path.join(args.out, args.name + "-measured.py"), "w") as f:
            f.write(source + "\n")
        print(f"--install: wrote {name} into blocksparse/ops/norms/configs.py:\n" + source)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
