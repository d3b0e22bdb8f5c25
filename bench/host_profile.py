"""Where the host time of an eager call goes, measured on the CPU: the pure-Python cost of each layer
of the PyTorch call path, with the kernel launch itself replaced by a no-op C function.

    python bench/host_profile.py --out DIR [--kernels PATH] [--calls 20000]

No GPU needed (and none used): tensors live on the CPU, plans are built for an sm_90 GPU with a
kernel library (``--kernels``, else a small one built now: bf16, block size 32, ~30 s), and the
library's ``bsk_launch`` is swapped for a C function that returns at once -- so every layer above
the driver runs as on a GPU machine, and nothing below it does.  What only the GPU run can tell
(``bench/latency.py``): the driver's launch cost (``cuLaunchKernel``, tensor-map encoding), the CUDA
caching allocator (here the CPU allocator stands in), the JIT path's Triton launcher, and how
host and GPU time overlap.

Each row is the best of 7 repeats of ``--calls`` calls, in µs per call and in units of one trivial
torch op measured in the same run (``torch.empty`` of the output's shape), so that runs on
different machines compare.  Takes about a minute.  Writes ``host-profile.json`` and
``host-profile.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.pop("TRITON_INTERPRET", None)  # the kernels are never run; plans see the compiler's objects

import numpy as np  # noqa: E402
import torch  # noqa: E402

from blocksparse.aot.abi import KernelLibrary  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402
from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul, _launch  # noqa: E402
from blocksparse.torch._matmul import ops, plan, products  # noqa: E402

NOOP_C = ("int bsk_launch(int s, const void *g, const void *a, int n, void *st, char *m, unsigned long z) "
          "{ return 0; }\n"
          "int bsk_memset32(unsigned long long p, unsigned v, unsigned long w, void *st, char *m, unsigned long z) "
          "{ return 0; }\n")
N, C, BS, DENSITY = 64, 256, 32, 0.25


def noop_runtime(work):
    """C ``bsk_launch`` and ``bsk_memset32`` (zero fills) that do nothing, compiled now (ctypes, no
    argument conversion)."""
    source, library = work / "noop.c", work / "noop.so"
    source.write_text(NOOP_C)
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", source, "-o", library], check=True)
    dll = ctypes.PyDLL(str(library))
    for fn in (dll.bsk_launch, dll.bsk_memset32):
        fn.restype = ctypes.c_int
    return dll.bsk_launch, dll.bsk_memset32


def kernel_library(path, work):
    if path:
        return KernelLibrary(path)
    subprocess.run([sys.executable, "-m", "blocksparse.aot", "--out", str(work / "aot"), "--archs", "sm_90",
                    "--dtypes", "bf16", "--block-sizes", str(BS), "--library"], check=True, cwd=HERE.parent,
                   stdout=subprocess.DEVNULL)
    return KernelLibrary(work / "aot" / "_kernels.so")


def plan_for_a_gpu(kernels):
    """Make CPU calls plan and launch as on an sm_90 GPU with ``kernels`` (whose launch is a no-op)."""
    build = plan._build
    target = (kernels, _launch.DeviceInfo(90, 132))
    plan._build = lambda *args, **kwargs: build(*args, **kwargs, target=target)
    _launch._stream = lambda device: 0
    products.use_triton = lambda t, block_size: True


def best_us(fn, calls, repeats=7):
    for _ in range(min(calls, 200)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls / 1000)
    return best


def rows_of(calls):
    rng = np.random.default_rng(0)
    layout = random_layout(rng, C // BS, C // BS, DENSITY, cover=True)
    bsmm = BlocksparseMatMul(layout, BS)
    lin = BlocksparseLinear(layout, BS, dtype=torch.bfloat16)
    bf16 = dict(dtype=torch.bfloat16)
    x, w, dy = torch.randn(N, C, **bf16), torch.randn(bsmm.w_shape, **bf16), torch.randn(N, C, **bf16)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    h = bsmm._handle
    fprop = products.plan_of("fprop", x, w, h, 1, "ieee")
    out = torch.empty(fprop.out_shape, **bf16)
    tensors = (x, w, out)
    runner = fprop.runner
    assert runner.path == "aot", getattr(runner, "reason", None)
    jit = _launch.JitLaunch(runner.launch)
    jit._run = lambda **kwargs: None  # Triton's launcher itself: only a GPU can run it
    dense = torch.randn(C, C, **bf16)

    def fwdbwd(layer, *inputs):
        return lambda: torch.autograd.grad(layer(*inputs), inputs, dy)

    cases = [
        ("reference", "torch.empty of the output", lambda: torch.empty(fprop.out_shape, **bf16)),
        ("reference", "x @ W (dense, CPU compute included)", lambda: x @ dense),
        ("call", "BlocksparseMatMul(x, w), no grad", lambda: bsmm(x, w)),
        ("call", "BlocksparseMatMul(x, w), x requires grad", lambda: bsmm(xg, w)),
        ("call", "BlocksparseLinear(x), no grad (+ bias add)", lambda: lin(x)),
        ("call", "fwd + bwd: autograd.grad(bsmm(x, w), (x, w))", fwdbwd(bsmm, xg, wg)),
        ("call", "custom op torch.ops.blocksparse.matmul, no grad", lambda: ops.matmul_op(x, w, None, h, 1, "ieee")),
        ("call", "custom op, x requires grad", lambda: ops.matmul_op(xg, w, None, h, 1, "ieee")),
        ("call", "fwd + bwd through the custom ops",
         lambda: torch.autograd.grad(ops.matmul_op(xg, wg, None, h, 1, "ieee"), (xg, wg), dy)),
        ("layer", "argument checks (BlocksparseMatMul._check)", lambda: bsmm._check(x, w)),
        ("layer", "eager dispatch (ops.matmul: compiling? grad?)", lambda: ops.matmul(x, w, h, 1, "ieee")),
        ("layer", "products.fprop (backend, strides, plan, run)", lambda: products.fprop(x, w, h, 1, "ieee")),
        ("layer", "products.bprop", lambda: products.bprop(dy, w, h, 1, "ieee")),
        ("layer", "products.updat (+ float32 buffer cast to bf16)",
         lambda: products.updat(x, dy, h, 1, "ieee", torch.bfloat16)),
        ("layer", "plan lookup (products.plan_of)", lambda: products.plan_of("fprop", x, w, h, 1, "ieee")),
        ("layer", "plan call (allocate + launch)", lambda: fprop(x, w)),
        ("layer", "AOT launch (3 pointers, stream, ctypes call)", lambda: runner(tensors)),
        ("layer", "the ctypes call alone", lambda: runner._raw(*runner._argv)),
        ("layer", "JIT launch up to Triton's launcher (kwargs, descriptors)", lambda: jit(tensors)),
        ("layer", "autograd.Function.apply around the products", lambda: ops.MatmulFunction.apply(xg, w, None, h, 1,
                                                                                                   "ieee")),
    ]
    unit = best_us(cases[0][2], calls)
    rows = []
    for group, name, fn in cases:
        us = best_us(fn, calls if group != "call" or "bwd" not in name else max(calls // 10, 100))
        rows.append(dict(group=group, name=name, us=us, torch_ops=us / unit))
        print(f"{us:9.2f} µs {us / unit:6.1f} ops  {name}", flush=True)
    launches = {k: p.launches for k, p in ((k[0], p) for k, p in plan.state(h).plans.items())}
    return rows, launches


def markdown(meta, rows, launches):
    out = ["# Host time of an eager call, layer by layer (CPU, launch replaced by a no-op)", "",
           f"{meta['machine']}; torch {meta['torch']}; {meta['date']}.  Produced by `bench/host_profile.py` "
           f"(method in its docstring).  N = {N}, C = K = {C}, block size {BS}, density {DENSITY}, bf16; plans "
           "for sm_90 with the kernel library.  `ops` = the cost in units of one `torch.empty` on this "
           "machine.", "", "| group | what | µs per call | ops |", "|---|---|---|---|"]
    out += [f"| {r['group']} | {r['name']} | {r['us']:.2f} | {r['torch_ops']:.1f} |" for r in rows]
    out += ["", "Kernels per call of each product (product, zero fill, cast, weight transpose): "
            + ", ".join(f"{k} {v}" for k, v in sorted(launches.items())), ""]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernels", help="a kernel library with bf16 / block size 32 / sm_90 matmul kernels")
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        kernels = kernel_library(args.kernels, work)
        kernels.raw_launch, kernels.raw_memset32 = noop_runtime(work)
        plan_for_a_gpu(kernels)
        rows, launches = rows_of(args.calls)
    import platform

    meta = dict(machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
                        f"{os.getloadavg()[0]:.1f}", torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "host-profile.json").write_text(json.dumps(dict(meta, rows=rows, launches=launches), indent=1))
    Path(args.out, "host-profile.md").write_text(markdown(meta, rows, launches))
    print(markdown(meta, rows, launches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
