"""Compile every stream-kernel candidate of ``tune_bsmm2.py`` for sm_90 -- no GPU needed.

    python bench/preflight_tune2.py [--out DIR] [--jobs N]      (a few minutes on 2 CPU cores)

Per candidate (op, name, block size): whether Triton compiles it, the shared memory and registers
of the cubin (``cuobjdump``), local memory (spills), how many tile buffers the software pipeliner
gave the activation tile, and the programs per SM that fit, against the candidate's ``PER_SM``.
A candidate that does not fit its ``PER_SM`` is re-planned by the sweep itself; one that does not
compile shows here before it costs GPU time.  Writes ``preflight.json`` into ``--out`` if given.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SMEM_PER_SM = 228 * 1024
POINTERS = ("Y", "WS", "CNT", "STEPS", "CUTS", "OUTS", "OFFSETS")


def jobs():
    """(op, name, block size, config) of every stream candidate of the sweep."""
    import tune_bsmm2 as sweep

    out = []
    for table in (sweep.XPROP, sweep.SMALL_XPROP):
        for name, cfgs in table.items():
            for bs, cfg in cfgs.items():
                ops = ("fprop", "bprop") if table is sweep.XPROP and bs < 128 else ("fprop",)
                out += [(op, name, bs, cfg) for op in ops]
    return out


def compile_one(job):
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from blocksparse.aot.resources import cubin_usage
    from blocksparse.ops.matmul.xprop_stream import xprop_stream_kernel as fn

    op, name, bs, cfg = job
    bk, trans = cfg.BK or bs, op == "bprop"
    types = {"x_desc": f"tensordesc<bf16[{cfg.BM}, {bk}]>",
             "w_desc": f"tensordesc<bf16[{bs}, {bk}]>" if trans else f"tensordesc<bf16[{bk}, {bs}]>",
             "Y": "*bf16", "WS": "*fp32", **{p: "*i32" for p in POINTERS[2:]},
             "N": "i32", "stride_yn": "i32", "num_entries": "i32", "num_groups": "i32", "num_units": "i32",
             "num_programs": "i32"}
    # as the JIT specialises a call on (N, F) activations: unit feature stride, aligned pointers
    consts = dict(stride_yf=1, BS=bs, G=cfg.G, BM=cfg.BM, BK=bk, X_T=False, TRANS_W=trans, SKIP=cfg.SKIP,
                  SPLIT=cfg.SPLIT, PRECISION="ieee", NUM_STAGES=cfg.num_stages)
    names = list(fn.arg_names)
    signature = {n: "constexpr" if n in consts else types[n] for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in (*POINTERS, "stride_yn")}
    row = dict(op=op, name=name, bs=bs, config=repr(cfg))
    try:
        k = triton.compile(ASTSource(fn, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    except Exception as exc:
        row["error"] = repr(exc)[:400]
        return row
    found = cubin_usage(k.asm["cubin"])
    buffers = re.findall(rf"memdesc<(\d+)x{cfg.BM}x{bk}xbf16", k.asm["ttgir"])
    regs = found["regs"]
    fit = min(SMEM_PER_SM // (k.metadata.shared + 1024),
              65536 // max(1, -(-regs // 8) * 8 * 32 * cfg.num_warps), 64 // cfg.num_warps)
    row.update(shared=k.metadata.shared, regs=regs, local=found["local"], stack=found["stack"],
               x_buffers=int(buffers[0]) if buffers else 1, fits_per_sm=fit,
               per_sm_ok=cfg.PER_SM <= fit)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    todo = jobs()
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        rows = list(pool.map(compile_one, todo))
    print(f"{'op':5} {'candidate':17} {'bs':>3} {'shared':>7} {'regs':>4} {'local':>5} {'bufs':>4} {'fit/SM':>6}  PER_SM")
    for r in rows:
        if "error" in r:
            print(f"{r['op']:5} {r['name']:17} {r['bs']:>3}  COMPILE FAILED: {r['error']}")
            continue
        per_sm = re.search(r"PER_SM=(\d+)", r["config"]).group(1)
        flag = "" if r["per_sm_ok"] else "  (sweep re-plans)"
        print(f"{r['op']:5} {r['name']:17} {r['bs']:>3} {r['shared']:>7} {r['regs']:>4} {r['local']:>5} "
              f"{r['x_buffers']:>4} {r['fits_per_sm']:>6}  {per_sm}{flag}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "preflight.json"), "w") as f:
            json.dump(rows, f, indent=1)
    failed = [r for r in rows if "error" in r]
    print(f"{len(rows)} candidates, {len(failed)} failed to compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
