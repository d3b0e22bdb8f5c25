#!/usr/bin/env python3
"""Verify the ahead-of-time transformer kernels on a GPU through the C the TensorFlow ops call
(``src/ops/transformer.h``), in one run.

    python scripts/verify_transformer_aot.py --out DIR [--archs sm_90] [--dtypes bf16,fp32]
                                             [--block-sizes 32,64] [--quick] [--jobs N] [--dry-run]

Compiles the transformer family's specs for the archs, dtypes and block sizes, builds them with the
kernel runtime into a kernel library (system C compiler), loads it with ctypes and, for every case
(block sizes 16 to 128; head dimensions 16 to 256, 48, 80 and 144 among them, so one to four head
slices; 2-D layouts shared by every head and per-head ones, rectangular, with empty query rows;
in-block masks and the autoregressive rule), runs ``nt``, ``nn``, ``tn``, the softmax and its
gradient on PyTorch CUDA tensors through ``bsk_transformer_run`` -- spec selection, grids, tables
and all -- into NaN-filled outputs, and compares every output with the float64 reference
(``blocksparse.testing.attention``) of the same rounded inputs at the dtype's tolerance.  The
tables are those the PyTorch launcher passes (``blocksparse.torch._transformer.state``).  A
failing case is recorded and the run goes on.  Needs torch, triton and a C compiler; no
TensorFlow.  Writes ``DIR/transformer-aot-verify.json`` and ``DIR/transformer-aot-verify.md`` (also
after a failure part way); exits 1 if any check failed.

``--dry-run`` (any machine, no GPU): compiles, builds and loads everything, and checks that the C
selects a kernel for every call of every case (and refuses a call past the grid's 65535 rows);
launches nothing.
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
from blocksparse.aot.abi import KernelError  # noqa: E402
from blocksparse.aot.native import KERNELS_LIBRARY, build_kernel_library  # noqa: E402
from blocksparse.ops.transformer.capi import DTYPES, PRODUCTS, TransformerCall, TransformerRuntime  # noqa: E402
from blocksparse.ops.transformer.lut import AttentionLayout  # noqa: E402
from blocksparse.testing import attention as ref  # noqa: E402
from blocksparse.testing.numerics import rel_error, tolerance  # noqa: E402

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
SCALE = 0.3

#: (block size, heads, shared 2-D layout, QB, KB, head_dim, empty query rows, masked, autoregress_at_key)
CASES = [
    (16, 4, False, 8, 8, 16, 0, False, None),
    (16, 3, True, 6, 9, 48, 1, True, None),
    (32, 4, True, 8, 8, 64, 0, False, 0),
    (32, 2, False, 5, 7, 80, 1, True, 7),
    (32, 8, False, 4, 4, 256, 0, False, None),
    (64, 4, False, 6, 6, 128, 0, True, 0),
    (64, 3, True, 4, 6, 144, 1, False, None),
    (64, 2, False, 3, 3, 48, 0, True, 100),
    (128, 2, False, 4, 4, 80, 0, True, 40),
    (128, 3, True, 3, 5, 256, 1, False, 0),
    (128, 2, True, 2, 2, 16, 0, False, None),
]
QUICK = [CASES[i] for i in (1, 3, 5, 8)]
BATCH = 3


def _build(out, archs, dtypes, block_sizes, jobs):
    filters = parse_filters(dtypes, block_sizes, "transformer")
    source, manifest = build_sources(archs, out, jobs=jobs, **filters)
    build_kernel_library(source, out / KERNELS_LIBRARY, jobs=jobs)
    return TransformerRuntime(out / KERNELS_LIBRARY), manifest


def _layout(case, rng):
    bs, heads, shared, qb, kb, _, empty, masked, _ = case
    mask = ref.random_layout(rng, 1 if shared else heads, qb, kb, 0.5, empty_rows=empty)
    lay = AttentionLayout(mask[0] if shared else mask, bs, heads=heads)
    masks = lay.block_masks(lambda shape, *_: rng.random(shape) < 0.7) if masked else None
    return lay, masks


def _calls(case, lay, masks, dtype):
    """The five calls of a case by product (buffers unset)."""
    head_dim, ar = case[5], case[8]
    common = dict(dtype=DTYPES[dtype], block_size=lay.block_size, batch=BATCH, heads=lay.heads,
                  lut_heads=lay.lut_heads, blocks=lay.blocks, q_blocks=lay.QB, k_blocks=lay.KB, scale=SCALE)
    calls = {p: TransformerCall(product=PRODUCTS[p], features=lay.heads * head_dim, **common)
             for p in ("nt", "nn", "tn")}
    calls["softmax"] = TransformerCall(product=PRODUCTS["softmax"], masked=masks is not None,
                                       autoregress=ar is not None, ar_key=ar or 0, **common)
    calls["softmax_grad"] = TransformerCall(product=PRODUCTS["softmax_grad"], **common)
    return calls


def _check(name, out, want, dtype):
    err = rel_error(out, want)
    return {"output": name, "rel_error": float(err), "ok": bool(err <= tolerance(TORCH_DTYPES[dtype]))}


def _run_case(torch, rt, dtype, case, arch, dry_run, rng):
    lay, masks = _layout(case, rng)
    calls = _calls(case, lay, masks, dtype)
    specs = {p: rt.select(c, arch) for p, c in calls.items()}
    selected = [rt.specs[s]["name"] if s >= 0 else None for s in specs.values()]
    if min(specs.values()) < 0 or dry_run:
        return {"selected": selected, "checks": []}
    from blocksparse.torch._transformer import state

    td = getattr(torch, TORCH_DTYPES[dtype])
    tables = state.state(state.handle(lay, masks)).tables(torch.device("cuda"))
    features = lay.heads * case[5]

    def draw(shape, factor=1.0):
        return (torch.randn(shape, dtype=torch.float64, device="cuda") * factor).to(td)

    q, k, v = draw((BATCH, lay.ctx_q, features)), draw((BATCH, lay.ctx_k, features)), draw((BATCH, lay.ctx_k, features))
    packed = (BATCH, lay.heads, lay.blocks, lay.block_size, lay.block_size)
    w, scores, dy = draw(packed, 0.2), draw(packed, 3.0), draw(packed)
    inputs = {"nt": (q, k), "nn": (w, v), "tn": (w, q), "softmax": (scores, None)}
    outs = {"nt": packed, "nn": (BATCH, lay.ctx_q, features), "tn": (BATCH, lay.ctx_k, features),
            "softmax": packed, "softmax_grad": packed}
    got = {}
    stream = torch.cuda.current_stream().cuda_stream
    for product, call in calls.items():
        a, b = inputs[product] if product != "softmax_grad" else (dy, got["softmax"])
        out = torch.full(outs[product], float("nan"), dtype=td, device="cuda")
        call.a, call.b, call.out = a.data_ptr(), 0 if b is None else b.data_ptr(), out.data_ptr()
        for name in ("coords", "row_offsets", "col_offsets", "col_blocks", "mask_index", "mask_bits"):
            setattr(call, name, getattr(tables, name).data_ptr())
        rt.run(call, stream)
        got[product] = out
    torch.cuda.synchronize()
    f64 = {name: t.double().cpu().numpy() for name, t in
           {"q": q, "k": k, "v": v, "w": w, "scores": scores, "dy": dy, "y": got["softmax"]}.items()}
    want = {"nt": ref.nt(lay, f64["q"], f64["k"]), "nn": ref.nn(lay, f64["w"], f64["v"]),
            "tn": ref.tn(lay, f64["w"], f64["q"]),
            "softmax": ref.softmax(lay, f64["scores"], SCALE, masks, case[8]),
            "softmax_grad": ref.softmax_grad(lay, f64["dy"], f64["y"], SCALE)}
    checks = [_check(p, got[p].double().cpu().numpy(), want[p], dtype) for p in calls]
    return {"selected": selected, "checks": checks}


def _rows_limit(rt):
    """A call past the grid's 65535 (batch * heads) rows is refused before any launch, as PyTorch's."""
    call = TransformerCall(product=PRODUCTS["nt"], dtype=DTYPES["bf16"], block_size=64, batch=20000, heads=4,
                           lut_heads=1, blocks=1, q_blocks=1, k_blocks=1, features=256, a=16, b=16, out=16, coords=16)
    try:
        rt.run(call)
    except KernelError as exc:
        return {"selected": [], "checks": [{"output": "refused", "rel_error": None,
                                            "ok": exc.status == 1 and "split the batch" in str(exc)}]}
    return {"selected": [], "checks": [{"output": "refused", "rel_error": None, "ok": False}]}


def _markdown(result):
    lines = ["# Transformer AOT kernels through the TensorFlow ops' C", "",
             f"- GPU: {result['gpu'] or 'none (dry run)'}; archs {', '.join(result['archs'])}; "
             f"{result['kernels']} kernels compiled and built in {result['build_s']:.0f} s; "
             f"whole run {result.get('total_s', 0):.0f} s", "",
             "Case: (block size, heads, shared layout, QB, KB, head_dim, empty rows, masked, autoregress_at_key).", ""]
    lines += ["| dtype | case | kernels (nt / nn / tn / softmax / grad) | result | worst rel. error |",
              "|---|---|---|---|---|"]
    for r in result["cases"]:
        errors = [c["rel_error"] for c in r.get("checks", []) if c["rel_error"] is not None]
        worst = f"{max(errors):.2e}" if errors else ""
        lines.append(f"| {r['dtype']} | {r['case']} | {' / '.join(map(str, r.get('selected', [])))} | "
                     f"{r['status']} | {worst} |")
    return "\n".join(lines) + "\n"


def _write(out, result):
    (out / "transformer-aot-verify.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "transformer-aot-verify.md").write_text(_markdown(result))


def main(argv=None):
    os.environ.pop("TRITON_INTERPRET", None)   # ahead-of-time compilation needs Triton's compiler
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where the results go")
    parser.add_argument("--archs", help="GPU architectures (default: this GPU's; dry run: sm_90)")
    parser.add_argument("--dtypes", default="fp16,bf16,fp32", help="e.g. bf16,fp32")
    parser.add_argument("--block-sizes", help="only these block sizes, e.g. 32,64 (default: all)")
    parser.add_argument("--quick", action="store_true", help="a few cases (a smoke run)")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the CPUs)")
    parser.add_argument("--dry-run", action="store_true", help="build, load and select only (no GPU)")
    args = parser.parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("verify_transformer_aot: no CUDA GPU; use --dry-run to build and load only", file=sys.stderr)
        return 2
    gpu_arch = None if args.dry_run else 10 * torch.cuda.get_device_capability()[0] + \
        torch.cuda.get_device_capability()[1]
    archs = parse_archs(args.archs or (f"sm_{gpu_arch}" if gpu_arch else "sm_90"))
    arch = gpu_arch or max(archs.cubins or archs.ptx)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rt, manifest = _build(Path(tempfile.mkdtemp(prefix="transformer-aot-")), archs, args.dtypes, args.block_sizes,
                          args.jobs)
    result = {"dry_run": args.dry_run, "gpu": None if args.dry_run else torch.cuda.get_device_name(),
              "archs": manifest["archs"] + manifest["ptx"], "kernels": len(manifest["specializations"]),
              "build_s": time.perf_counter() - start, "cases": []}
    sizes = {int(b) for b in args.block_sizes.split(",")} if args.block_sizes else None
    cases = [c for c in (QUICK if args.quick else CASES) if sizes is None or c[0] in sizes]
    work = [(dtype, case) for dtype in args.dtypes.split(",") for case in cases] + [("bf16", "rows-limit")]
    for seed, (dtype, case) in enumerate(work):
        record = {"dtype": dtype, "case": str(case)}
        try:
            if case == "rows-limit":
                record.update(_rows_limit(rt))
            else:
                torch.manual_seed(seed)
                record.update(_run_case(torch, rt, dtype, case, arch, args.dry_run, np.random.default_rng(seed)))
            selected = None not in record["selected"]
            record["status"] = ("no kernel selected" if not selected else
                                "selected" if args.dry_run and not record["checks"] else
                                "pass" if all(c["ok"] for c in record["checks"]) else "FAIL")
        except Exception as exc:   # record it and go on with the other cases
            record.update(status="FAIL", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
        result["cases"].append(record)
        result["total_s"] = time.perf_counter() - start
        _write(out, result)
        print(f"{dtype} {case}: {record['status']}", flush=True)
    failed = [r for r in result["cases"] if r["status"] not in ("pass", "selected")]
    print(f"verify_transformer_aot: {len(result['cases']) - len(failed)} of {len(result['cases'])} cases passed in "
          f"{result['total_s']:.0f} s -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
