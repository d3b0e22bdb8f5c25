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

import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from blocksparse.aot.abi import KernelError  # noqa: E402
from blocksparse.ops.transformer.capi import DTYPES, PRODUCTS, TransformerCall, TransformerRuntime  # noqa: E402
from blocksparse.ops.transformer.lut import AttentionLayout  # noqa: E402
from blocksparse.testing import aot_verify  # noqa: E402
from blocksparse.testing import attention as ref  # noqa: E402
from blocksparse.testing.aot_verify import TORCH_DTYPES, check  # noqa: E402

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


def _run_case(torch, rt, dtype, case, arch, dry_run, seed):
    rng = np.random.default_rng(seed)
    lay, masks = _layout(case, rng)
    calls = _calls(case, lay, masks, dtype)
    specs = {p: rt.select(c, arch) for p, c in calls.items()}
    selected = [rt.specs[s]["name"] if s >= 0 else None for s in specs.values()]
    if min(specs.values()) < 0 or dry_run:
        return {"selected": selected, "checks": []}
    from blocksparse.torch._transformer import state

    torch.manual_seed(seed)
    td = getattr(torch, TORCH_DTYPES[dtype])
    tables = state.state(state.handle(lay, masks)).tables(torch.device("cuda"))
    features = lay.heads * case[5]

    def draw(shape, factor=1.0):
        return (torch.randn(shape, dtype=torch.float64, device="cuda") * factor).to(td)

    q, k, v = (draw((BATCH, ctx, features)) for ctx in (lay.ctx_q, lay.ctx_k, lay.ctx_k))
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
    checks = [check(p, got[p].double().cpu().numpy(), want[p], dtype) for p in calls]
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


def _label(case):
    bs, heads, shared, qb, kb, head_dim, empty, masked, ar = case
    return (f"bs{bs} h{heads} {'shared' if shared else 'per-head'} {qb}x{kb} d{head_dim}"
            f"{f' empty-rows={empty}' if empty else ''}{' masked' if masked else ''}"
            f"{'' if ar is None else f' ar={ar}'}")


def main(argv=None):
    parser = aot_verify.parser(__doc__)
    parser.add_argument("--block-sizes", help="only these block sizes, e.g. 32,64 (default: all)")
    args = parser.parse_args(argv)
    run = aot_verify.Run(args, "verify_transformer_aot", "transformer-aot-verify",
                         "Transformer AOT kernels through the TensorFlow ops' C (nt / nn / tn / softmax / grad)",
                         ("dtype", "case"))
    gpu = run.gpu()
    if gpu is None:
        return 2
    torch, targets, arch = gpu
    rt = run.build(torch, targets, TransformerRuntime, "transformer", args.block_sizes)
    sizes = {int(b) for b in args.block_sizes.split(",")} if args.block_sizes else None
    cases = [c for c in (QUICK if args.quick else CASES) if sizes is None or c[0] in sizes]
    work = [({"dtype": dtype, "case": _label(case)}, partial(_run_case, torch, rt, dtype, case, arch, args.dry_run,
                                                             seed))
            for seed, (dtype, case) in enumerate((d, c) for d in args.dtypes.split(",") for c in cases)]
    return run.cases(work + [({"dtype": "bf16", "case": "batch * heads > 65535"}, partial(_rows_limit, rt))])


if __name__ == "__main__":
    sys.exit(main())
