#!/usr/bin/env python3
"""Verify the ahead-of-time layer-norm and LSTM-gate kernels on a GPU through the C the TensorFlow
ops call (``src/ops/norms.h``), in one run.

    python scripts/verify_norms_aot.py --out DIR [--archs sm_90] [--dtypes bf16,fp32] [--quick]
                                       [--jobs N] [--dry-run]

Compiles the norms and LSTM families' specs for the archs and dtypes, builds them with the kernel
runtime into a kernel library (system C compiler), loads it with ctypes and, for every case (both
layouts, relu, segments, one-chunk and chunked tiles, ``(C, N)`` token counts with and without 16
alignment; merged and four gates, with and without a bias), runs the forward and the backward on
PyTorch CUDA tensors through ``bsk_layer_norm_run`` / ``bsk_lstm_gates_run`` -- spec selection,
workspace, partial-row sums and all -- into NaN-filled outputs, and compares every output with the
float64 reference (``blocksparse.testing.norms``) at the dtype's tolerance.  A failing case is
recorded and the run goes on.  Needs torch, triton and a C compiler; no TensorFlow.  Writes
``DIR/norms-aot-verify.json`` and ``DIR/norms-aot-verify.md`` (also after a failure part way);
exits 1 if any check failed.  On an H200: about 3 minutes for sm_90 and the three dtypes (most of
it compiling), under a minute with ``--quick --dtypes bf16``.

``--dry-run`` (any machine, no GPU): compiles, builds and loads everything, and checks that the C
selects a kernel for every case; launches nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from blocksparse.aot import build_sources, parse_archs, parse_filters  # noqa: E402
from blocksparse.aot.native import KERNELS_LIBRARY, build_kernel_library  # noqa: E402
from blocksparse.ops.norms.capi import DTYPES, LayerNormCall, LstmGatesCall, NormsRuntime  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.testing.numerics import rel_error, tolerance  # noqa: E402

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}

#: (tokens, features, axis, segments, relu): one-chunk tiles, segments, a chunked segment per
#: layout, (C, N) with N not a multiple of 16, a partial last token tile.
LAYER_NORM_CASES = [
    (4096, 1024, 1, 1, False), (1000, 1024, 1, 4, True), (64, 40000 // 16 * 16 * 2, 1, 2, False),
    (4096, 512, 0, 1, True), (1001, 256, 0, 2, False), (512, 4096, 0, 1, False), (3, 48, 1, 1, True),
]
QUICK_LAYER_NORM = [LAYER_NORM_CASES[i] for i in (0, 1, 3, 4)]
#: (tokens, K, merged, bias)
LSTM_CASES = [(4096, 1024, True, True), (1000, 256, False, True), (777, 48, True, False), (64, 16, False, False)]
QUICK_LSTM = LSTM_CASES[:2]


def _build(out, archs, dtypes, jobs):
    filters = parse_filters(dtypes, None, "norms,lstm")
    source, manifest = build_sources(archs, out, jobs=jobs, **filters)
    build_kernel_library(source, out / KERNELS_LIBRARY, jobs=jobs)
    return NormsRuntime(out / KERNELS_LIBRARY), manifest


def _check(name, out, want, dtype):
    err = rel_error(out, want)
    return {"output": name, "rel_error": None if not np.isfinite(err) else float(err),
            "ok": bool(np.isfinite(err) and err <= tolerance(TORCH_DTYPES[dtype]))}


def _layer_norm_case(torch, rt, dtype, case, arch, dry_run, rng):
    n, c, axis, segments, relu = case
    call = LayerNormCall(dtype=DTYPES[dtype], axis=axis, relu=relu, segments=segments, n_tokens=n, features=c,
                         epsilon=1e-6)
    specs = [rt.select(call, backward, arch) for backward in (False, True)]
    if min(specs) < 0 or dry_run:
        return {"selected": [rt.specs[s]["name"] if s >= 0 else None for s in specs], "checks": []}
    x, g, b, dy = ref.draw_layer_norm(rng, n, c, axis)
    td = getattr(torch, TORCH_DTYPES[dtype])
    dev = [torch.tensor(a, dtype=td, device="cuda") for a in (x, dy)]
    gb = [torch.tensor(a, dtype=torch.float32, device="cuda") for a in (g, b)]
    xq, dyq = (t.double().cpu().numpy() for t in dev)     # the reference sees the rounded inputs
    y_ref = ref.layer_norm(xq, g, b, axis, segments, relu=relu)
    dyq = ref.relu_safe(dyq, y_ref) if relu else dyq
    dev[1] = torch.tensor(dyq, dtype=td, device="cuda")
    nan = float("nan")
    y = torch.full_like(dev[0], nan)
    stats = [torch.full((segments, n), nan, device="cuda") for _ in range(2)]
    call.x, call.g, call.b, call.y = dev[0].data_ptr(), gb[0].data_ptr(), gb[1].data_ptr(), y.data_ptr()
    call.mean, call.rstd = stats[0].data_ptr(), stats[1].data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    rt.run(call, False, stream)
    dx, dg, db = torch.full_like(dev[0], nan), torch.full((c,), nan, device="cuda"), torch.full((c,), nan, device="cuda")
    call.dy, call.dx, call.dg, call.db = dev[1].data_ptr(), dx.data_ptr(), dg.data_ptr(), db.data_ptr()
    workspace = torch.empty(max(1, rt.workspace(call, stream)) // 4 + 1, device="cuda")
    call.workspace = workspace.data_ptr()
    rt.run(call, True, stream)
    torch.cuda.synchronize()
    want = ref.layer_norm_grad(dyq, xq, g, b, axis, segments, relu=relu)
    got = [t.double().cpu().numpy() for t in (y, dx, dg, db)]
    checks = [_check(k, o, w, dtype) for k, o, w in zip(("y", "dx", "dg", "db"), got, (y_ref, *want))]
    return {"selected": [rt.specs[s]["name"] for s in specs], "checks": checks}


def _lstm_case(torch, rt, dtype, case, arch, dry_run, rng):
    n, k, merged, has_bias = case
    call = LstmGatesCall(dtype=DTYPES[dtype], merged=merged, n_tokens=n, features=k, forget_bias=1.0,
                         bias=1 if has_bias else 0)  # a placeholder address: selection reads only whether
    specs = [rt.select(call, backward, arch) for backward in (False, True)]
    if min(specs) < 0 or dry_run:
        return {"selected": [rt.specs[s]["name"] if s >= 0 else None for s in specs], "checks": []}
    c, h, bias, dc_next, dh_next = ref.draw_lstm_gates(rng, n, k)
    td = getattr(torch, TORCH_DTYPES[dtype])
    dev = {name: torch.tensor(a, dtype=td, device="cuda") for name, a in
           (("c", c), ("h", h), ("dc_next", dc_next), ("dh_next", dh_next))}
    gates = [dev["h"]] if merged else [dev["h"][:, g * k:(g + 1) * k].contiguous() for g in range(4)]
    bias_t = torch.tensor(bias, dtype=torch.float32, device="cuda") if has_bias else None
    q = {name: t.double().cpu().numpy() for name, t in dev.items()}
    nan = float("nan")
    outs = {name: torch.full((n, k), nan, dtype=td, device="cuda") for name in ("c_next", "h_next", "dc")}
    dgates = [torch.full_like(t, nan) for t in gates]
    dbias = torch.full((4 * k,), nan, device="cuda")
    call.c, call.bias = dev["c"].data_ptr(), bias_t.data_ptr() if has_bias else 0
    call.i, call.j, call.f, call.o = [t.data_ptr() for t in gates] * (4 if merged else 1)
    call.c_next, call.h_next = outs["c_next"].data_ptr(), outs["h_next"].data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    rt.run(call, False, stream)
    call.dc_next, call.dh_next, call.dc = dev["dc_next"].data_ptr(), dev["dh_next"].data_ptr(), outs["dc"].data_ptr()
    call.di, call.dj, call.df, call.d_o = [t.data_ptr() for t in dgates] * (4 if merged else 1)
    call.dbias = dbias.data_ptr() if has_bias else 0
    workspace = torch.empty(max(1, rt.workspace(call, stream)) // 4 + 1, device="cuda")
    call.workspace = workspace.data_ptr()
    rt.run(call, True, stream)
    torch.cuda.synchronize()
    b = bias if has_bias else None
    want_fwd = ref.lstm_gates(q["c"], q["h"], bias=b)
    want_bwd = ref.lstm_gates_grad(q["dc_next"], q["dh_next"], q["c"], q["h"], bias=b)
    dg = torch.cat(dgates, 1) if not merged else dgates[0]
    checks = [_check(name, t.double().cpu().numpy(), w, dtype) for name, t, w in
              (("c_next", outs["c_next"], want_fwd[0]), ("h_next", outs["h_next"], want_fwd[1]),
               ("dc", outs["dc"], want_bwd[0]), ("dgates", dg, want_bwd[1]))]
    if has_bias:
        checks.append(_check("dbias", dbias.double().cpu().numpy(), want_bwd[2], dtype))
    return {"selected": [rt.specs[s]["name"] for s in specs], "checks": checks}


def _markdown(result):
    lines = ["# Norms / LSTM AOT kernels through the TensorFlow ops' C", "",
             f"- GPU: {result['gpu'] or 'none (dry run)'}; archs {', '.join(result['archs'])}; "
             f"{result['kernels']} kernels compiled in {result['build_s']:.0f} s", ""]
    lines += ["| op | dtype | case | kernels | result | worst rel. error |", "|---|---|---|---|---|---|"]
    for r in result["cases"]:
        errors = [c["rel_error"] for c in r.get("checks", []) if c["rel_error"] is not None]
        worst = f"{max(errors):.2e}" if errors else ""
        lines.append(f"| {r['op']} | {r['dtype']} | {r['case']} | {' / '.join(map(str, r.get('selected', [])))} | "
                     f"{r['status']} | {worst} |")
    return "\n".join(lines) + "\n"


def _write(out, result):
    (out / "norms-aot-verify.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "norms-aot-verify.md").write_text(_markdown(result))


def main(argv=None):
    os.environ.pop("TRITON_INTERPRET", None)   # ahead-of-time compilation needs Triton's compiler
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where the results go")
    parser.add_argument("--archs", help="GPU architectures (default: this GPU's; dry run: sm_90)")
    parser.add_argument("--dtypes", default="fp16,bf16,fp32", help="e.g. bf16,fp32")
    parser.add_argument("--quick", action="store_true", help="a few cases (a smoke run)")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the CPUs)")
    parser.add_argument("--dry-run", action="store_true", help="build, load and select only (no GPU)")
    args = parser.parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("verify_norms_aot: no CUDA GPU; use --dry-run to build and load only", file=sys.stderr)
        return 2
    gpu_arch = None if args.dry_run else 10 * torch.cuda.get_device_capability()[0] + \
        torch.cuda.get_device_capability()[1]
    archs = parse_archs(args.archs or (f"sm_{gpu_arch}" if gpu_arch else "sm_90"))
    arch = gpu_arch or max(archs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rt, manifest = _build(Path(tempfile.mkdtemp(prefix="norms-aot-")), archs, args.dtypes, args.jobs)
    result = {"dry_run": args.dry_run, "gpu": None if args.dry_run else torch.cuda.get_device_name(),
              "archs": manifest["archs"], "kernels": len(manifest["specializations"]),
              "build_s": time.perf_counter() - start, "cases": []}
    rng = np.random.default_rng(0)
    work = [("layer_norm", _layer_norm_case, c) for c in (QUICK_LAYER_NORM if args.quick else LAYER_NORM_CASES)]
    work += [("lstm_gates", _lstm_case, c) for c in (QUICK_LSTM if args.quick else LSTM_CASES)]
    for dtype in args.dtypes.split(","):
        for op, run, case in work:
            record = {"op": op, "dtype": dtype, "case": str(case)}
            try:
                record.update(run(torch, rt, dtype, case, arch, args.dry_run, rng))
                selected = None not in record["selected"]
                record["status"] = ("no kernel selected" if not selected else "selected" if args.dry_run else
                                    "pass" if all(c["ok"] for c in record["checks"]) else "FAIL")
            except Exception as exc:   # record it and go on with the other cases
                record.update(status="FAIL", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
            result["cases"].append(record)
            _write(out, result)
            print(f"{op:10s} {dtype} {case}: {record['status']}", flush=True)
    _write(out, result)
    failed = [r for r in result["cases"] if r["status"] not in ("pass", "selected")]
    print(f"verify_norms_aot: {len(result['cases']) - len(failed)} of {len(result['cases'])} cases passed -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
