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

import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from blocksparse.ops.norms.capi import DTYPES, LayerNormCall, LstmGatesCall, NormsRuntime  # noqa: E402
from blocksparse.testing import aot_verify  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.testing.aot_verify import TORCH_DTYPES, check  # noqa: E402

#: (tokens, features, axis, segments, relu): one-chunk tiles, segments, a chunked segment per
#: layout, (C, N) with N not a multiple of 16, a partial last token tile, the relu kernels' own
#: tiles (``configs.MEASURED_RELU``), (N, C) segments of other than a multiple of 16 features and
#: (C, N) with such a C (the unaligned specs and reduction); the (C, N) split backward (segments longer than its
#: one-chunk tiles: 512 x 4096, 4096 x 512 with the relu, two segments and a partial last token tile); the
#: (C, N) split forward (from 2^26 tokens x segment features: with the relu and two segments).
LAYER_NORM_CASES = [
    (4096, 1024, 1, 1, False), (1000, 1024, 1, 4, True), (64, 40000 // 16 * 16 * 2, 1, 2, False),
    (4096, 512, 0, 1, True), (1001, 256, 0, 2, False), (512, 4096, 0, 1, False), (3, 48, 1, 1, True),
    (1001, 4096, 1, 1, True), (999, 8192, 1, 1, True), (1000, 96, 1, 4, True), (777, 1000, 0, 1, False),
    (4112, 2048, 0, 2, True), (16384, 4096, 0, 1, False), (8192, 16384, 0, 2, True),
]
QUICK_LAYER_NORM = [LAYER_NORM_CASES[i] for i in (0, 1, 3, 4)]
#: (tokens, K, merged, bias: None, "fp32" or "own" -- the activations' dtype, read as it is)
LSTM_CASES = [(4096, 1024, True, "fp32"), (1000, 256, False, "fp32"), (777, 48, True, None), (64, 16, False, None),
              (1000, 256, True, "own"), (64, 48, False, "own")]
QUICK_LSTM = LSTM_CASES[:2]


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
    checks = [check(k, o, w, dtype) for k, o, w in zip(("y", "dx", "dg", "db"), got, (y_ref, *want))]
    return {"selected": [rt.specs[s]["name"] for s in specs], "checks": checks}


def _lstm_case(torch, rt, dtype, case, arch, dry_run, rng):
    n, k, merged, bias_dtype = case
    has_bias, own = bias_dtype is not None, bias_dtype == "own" and dtype != "fp32"
    call = LstmGatesCall(dtype=DTYPES[dtype], merged=merged, n_tokens=n, features=k, forget_bias=1.0,
                         bias=1 if has_bias else 0, params=own)  # a placeholder address: selection reads only whether
    specs = [rt.select(call, backward, arch) for backward in (False, True)]
    if min(specs) < 0 or dry_run:
        return {"selected": [rt.specs[s]["name"] if s >= 0 else None for s in specs], "checks": []}
    c, h, bias, dc_next, dh_next = ref.draw_lstm_gates(rng, n, k)
    td = getattr(torch, TORCH_DTYPES[dtype])
    dev = {name: torch.tensor(a, dtype=td, device="cuda") for name, a in
           (("c", c), ("h", h), ("dc_next", dc_next), ("dh_next", dh_next))}
    gates = [dev["h"]] if merged else [dev["h"][:, g * k:(g + 1) * k].contiguous() for g in range(4)]
    bias_t = torch.tensor(bias, dtype=td if own else torch.float32, device="cuda") if has_bias else None
    if own:  # the reference sees the rounded bias
        bias = bias_t.double().cpu().numpy()
    q = {name: t.double().cpu().numpy() for name, t in dev.items()}
    nan = float("nan")
    outs = {name: torch.full((n, k), nan, dtype=td, device="cuda") for name in ("c_next", "h_next", "dc")}
    dgates = [torch.full_like(t, nan) for t in gates]
    dbias = torch.full((4 * k,), nan, dtype=td if own else torch.float32, device="cuda")
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
    checks = [check(name, t.double().cpu().numpy(), w, dtype) for name, t, w in
              (("c_next", outs["c_next"], want_fwd[0]), ("h_next", outs["h_next"], want_fwd[1]),
               ("dc", outs["dc"], want_bwd[0]), ("dgates", dg, want_bwd[1]))]
    if has_bias:
        checks.append(check("dbias", dbias.double().cpu().numpy(), want_bwd[2], dtype))
    return {"selected": [rt.specs[s]["name"] for s in specs], "checks": checks}


def main(argv=None):
    args = aot_verify.parser(__doc__).parse_args(argv)
    run = aot_verify.Run(args, "verify_norms_aot", "norms-aot-verify",
                         "Norms / LSTM AOT kernels through the TensorFlow ops' C", ("op", "dtype", "case"))
    gpu = run.gpu()
    if gpu is None:
        return 2
    torch, targets, arch = gpu
    rt = run.build(torch, targets, NormsRuntime, "norms,lstm")
    rng = np.random.default_rng(0)
    work = [("layer_norm", _layer_norm_case, c) for c in (QUICK_LAYER_NORM if args.quick else LAYER_NORM_CASES)]
    work += [("lstm_gates", _lstm_case, c) for c in (QUICK_LSTM if args.quick else LSTM_CASES)]
    return run.cases([({"op": op, "dtype": dtype, "case": str(case)},
                       partial(fn, torch, rt, dtype, case, arch, args.dry_run, rng))
                      for dtype in args.dtypes.split(",") for op, fn, case in work])


if __name__ == "__main__":
    sys.exit(main())
