"""Shared pieces of the GPU benchmarks: problems, float64 references, timers, ceilings."""
from __future__ import annotations

import json
import math
import os
import re
import time

import numpy as np
import torch
import triton
import triton.language as tl

from blocksparse.layout import Layout
from blocksparse.testing import rel_error, tolerance  # noqa: F401  (used as common.tolerance)
from blocksparse.testing.matmul import random_layout as _random_layout
from blocksparse.testing.poison import poisoned_empty  # noqa: F401  (used as common.poisoned_empty)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def random_layout(CB, KB, density, seed):
    """Random layout at ``density`` with every output column (and row) holding a block."""
    return _random_layout(np.random.default_rng(seed), CB, KB, density, cover=True).astype(bool)


class Problem:
    """y = x @ W for one layout: random bf16/fp16/fp32 operands and float64 references."""

    def __init__(self, C, K, N, bs, density, dtype, seed=0, device="cuda"):
        self.layout = Layout(random_layout(C // bs, K // bs, density, seed), bs)
        self.N, self.C, self.K, self.bs, self.dtype = N, C, K, bs, dtype
        g = torch.Generator(device=device).manual_seed(seed)  # noqa: E501
        self.x = torch.randn(N, C, device=device, generator=g).to(dtype)
        self.dy = torch.randn(N, K, device=device, generator=g).to(dtype)
        self.w = (torch.randn(self.layout.w_shape, device=device, generator=g) / math.sqrt(bs)).to(dtype)
        self.coords = torch.from_numpy(np.array(self.layout.coords)).to(device).long()
        self._refs = {}

    @property
    def density(self):
        return self.layout.density

    @property
    def useful_flops(self):
        return 2.0 * self.layout.blocks * self.bs * self.bs * self.N

    def dense_w(self, dtype):
        bs, lay = self.bs, self.layout
        W = torch.zeros(lay.CB, bs, lay.KB, bs, device=self.w.device, dtype=dtype)
        W[self.coords[:, 0], :, self.coords[:, 1], :] = self.w.to(dtype)
        return W.reshape(self.C, self.K)

    def ref(self, op):
        """float64 reference of ``op`` (fprop: y, bprop: dx, updat: packed dw)."""
        if op not in self._refs:
            W = self.dense_w(torch.float64)
            x, dy = self.x.double(), self.dy.double()
            if op == "fprop":
                r = x @ W
            elif op == "bprop":
                r = dy @ W.T
            else:
                full = (x.T @ dy).reshape(self.layout.CB, self.bs, self.layout.KB, self.bs)
                r = full[self.coords[:, 0], :, self.coords[:, 1], :]
            self._refs[op] = r
        return self._refs[op]


def result_writer(out_dir, stem, meta, markdown=None):
    """``save(rows)``: writes ``<stem>.json`` (``meta`` and the rows) and, given ``markdown(meta,
    rows)``, ``<stem>.md`` into ``out_dir`` -- after every problem, so an interrupted run keeps its rows."""
    os.makedirs(out_dir, exist_ok=True)

    def save(rows):
        with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
        if markdown is not None:
            with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
                f.write(markdown(meta, rows))

    return save


def gpu_tag():
    """A short name of the GPU for result files: ``h200``, ``h100``, ... (``cpu`` without one)."""
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    found = re.search(r"\b([a-z]\d{2,4}[a-z]?)\b", name.replace("nvidia", ""))
    return found.group(1) if found else re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def warm_in_workers(fn, todo, workers):
    """Run ``fn(chunk)`` on ``workers`` slices of ``todo`` in spawned processes (each fills
    Triton's on-disk cache, so that compiling does not eat the timed run); ``fn`` returns its
    failures.  Prints a summary; returns every failure."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        fails = [f for part in pool.map(fn, [todo[i::workers] for i in range(workers)]) for f in part]
    print(f"warmed {len(todo)} problems in {time.time() - t0:.0f}s; {len(fails)} failures", flush=True)
    for f in fails:
        print("  WARM FAIL", *f, flush=True)
    return fails


def rel_err(got, ref):
    """:func:`blocksparse.testing.rel_error`, NaN where ``got`` is not finite (the row is marked
    failed instead of stopping the run)."""
    try:
        return rel_error(got, ref)
    except AssertionError:
        return float("nan")


def time_ms(fn, warmup=25, rep=100):
    """Median milliseconds per call (events around each call, L2 flushed in between)."""
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


#: GPU clock cycles spent waiting before a graph's start event (~100 µs at 2 GHz): longer than a graph
#: launch takes on the host (10-40 µs measured), which the events included before 2026-12-06.
HOLD_CYCLES = 200_000
#: Milliseconds of replays before a graph is timed: its first replays after the host's capture ran up
#: to 12% slower (the GPU's clocks come down while it idles).
WARM_MS = 30


class GraphTimer:
    """Times memory-bound calls: one CUDA graph runs one call per operand set (together several
    times the L2), so every call reads its operands from device memory.  Captured once; each
    :meth:`median_ms` replays it (rounds of several implementations can then interleave)."""

    def __init__(self, make_fns):
        fns = make_fns()
        # the graph reads the calls' operands at replay: keep them (and so their memory) alive, or a
        # later capture's empty_cache() hands it back to the driver and the replay faults
        self.fns = fns
        self.calls = len(fns)
        for f in fns:
            f()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for f in fns:  # warm the stream's allocator pool before capture
                f()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, stream=stream):
            for f in fns:
                f()

    def median_ms(self, replays=20):
        """Median milliseconds per call over ``replays`` replays of the graph, after :data:`WARM_MS` of
        replays.  The GPU is kept busy (:data:`HOLD_CYCLES`) before each start event, so the graph is
        queued behind it by the time the event runs: the events time its kernels, not its launch."""
        warm_until = time.perf_counter() + WARM_MS / 1e3
        while time.perf_counter() < warm_until:  # the clocks drop while the host captures: ramp them first
            for _ in range(4):
                self.graph.replay()
            torch.cuda.synchronize()
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(HOLD_CYCLES)
            start.record()
            self.graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / self.calls)
        return float(np.median(times))


def time_rotating_ms(make_fns, replays=20):
    """Median ms per call of memory-bound calls (see :class:`GraphTimer`)."""
    return GraphTimer(make_fns).median_ms(replays)


def launch_source():
    """Where our launches come from: the kernel library's compiled specs where they serve (else
    Triton's JIT), or the JIT alone."""
    from blocksparse import _kernels

    kernels = _kernels.load()
    return "Triton's JIT" if kernels is None else "the kernel library where it holds the launch, else Triton's JIT"


def hbm_bandwidth_gbs():
    """Device-to-device copy bandwidth, counting bytes read plus written (GB/s)."""
    a = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a), warmup=5, rep=30)
    return 2 * a.numel() * a.element_size() / ms / 1e6


@triton.jit
def _l2_read_kernel(X, OUT, n_elem, reps, BLOCK: tl.constexpr):
    # every program sweeps its share of a buffer that fits in L2, ``reps`` times
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for _ in range(reps):
        for start in range(pid * BLOCK, n_elem, nprog * BLOCK):
            acc += tl.load(X + start + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(OUT + pid * BLOCK + tl.arange(0, BLOCK), acc)


def l2_bandwidth_gbs(mbytes=24, reps=20):
    """Read bandwidth from L2: all SMs re-reading a buffer of ``mbytes`` (fits in L2)."""
    n = mbytes * 1024**2 // 2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid, block = 4 * sms, 2048
    out = torch.empty(grid * block, device="cuda")
    fn = lambda: _l2_read_kernel[(grid,)](x, out, n, reps, BLOCK=block, num_warps=8)  # noqa: E731
    ms = triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
    return reps * n * 2 / ms / 1e6


def install_literal(path, name, source):
    """Replace the module-level ``NAME = {...}`` literal (closed by a ``}`` alone on a line) of the
    module at ``path`` by ``source``; what ``--install`` of a tuning script writes into the package."""
    import re

    with open(path) as f:
        text = f.read()
    new, count = re.subn(rf"^{name} = \{{\n.*?^\}}", lambda _: source, text, flags=re.S | re.M)
    if count != 1:
        raise RuntimeError(f"{path}: found {count} {name} tables, expected 1")
    with open(path, "w") as f:
        f.write(new)


def package_file(*parts):
    """The path of a file of the package in this checkout."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "blocksparse", *parts)
