"""Fused block-sparse attention on a GPU: ours vs FlexAttention (same layout) vs dense SDPA (causal).

    python bench/attention.py --out DIR            comparison, ~4-5 min on an H200 (--budget-s caps it)
    python bench/attention.py --sweep --out DIR    tile-config sweep, ~2 min: best fwd / bwd config per head dim
    python bench/attention.py --seqs 65536 ...     only some sequence lengths (--dims 128: head dims)
    python bench/attention.py --quick ...          a smoke run (one shape, a few configs)
    python bench/attention.py --quick --cpu ...    tiny shapes through Triton's interpreter (no GPU; Flex and
                                                   SDPA skipped): checks the script, not speed

Comparison: bf16, 16 heads, block size 128; seq 4096 (batch 4), 16384 and 65536 (batch 1); head dim
128 and 64; layouts ``causal``, ``fixed`` (Sparse Transformer, stride 8 blocks, 1 summary block) and
``bigbird`` (window +-1 block, 1 global block, 3 random blocks per row, seed 0), all with causal
masking inside the diagonal blocks except bigbird.  Implementations:

* ``ours``   ``blocksparse.torch.attention`` with a prepared ``AttentionLayout``, as users call it: on
  the causal layout (every block up to the diagonal) that is PyTorch's SDPA, which the call
  dispatches to for layouts that drop no block;
* ``kernels`` (causal only) the same call with ``BLOCKSPARSE_ATTENTION_SDPA=off``: our fused kernels;
* ``flex``   ``torch.nn.attention.flex_attention`` under ``torch.compile(dynamic=False)`` (a static
  kernel per shape, as the anchors measured it), with the ``BlockMask`` that ``create_block_mask`` builds (BLOCK_SIZE 128) from the
  same layout and causal mask_mod; layouts of one shape share one mask_mod, so they share its
  compiled kernels;
* ``sdpa``   ``F.scaled_dot_product_attention(is_causal=True)`` as PyTorch dispatches it (causal only):
  the anchors' "flash SDPA" baseline.  On an H200 with torch 2.11 that is cuDNN's fused flash
  kernel (``cudnn_generated_fort_native_sdpa_sm90_flash_*``), about 1.8x faster than the flash
  backend; its kernel names are recorded (``sdpa_kernels``);
* ``flash``  the same call forced onto the flash backend (``SDPBackend.FLASH_ATTENTION``: FlashAttention
  2), for reference.

Before timing, ours and Flex are checked (outputs NaN-poisoned): at 4096 against float64 dense
attention on two heads of the first batch element, beyond against each other.  Times are medians
of ``triton.testing.do_bench`` (CUDA events); forward, and forward + backward.  Ratios: ``flex/ours``
(speedup over Flex, goal >= 1.2) and ``ours/sdpa`` (goal <= 1.1; ``results/attention-h200.md`` before
2026-12-04 took the flash backend as this baseline, which flattered ours by ~1.8x).  Every case runs in its own
try block and results are written after each one (``attention-<gpu>.json`` / ``.md``), so a failure
or the time budget (``--budget-s``: no new case starts after it; the skipped ones are listed, run
them with ``--seqs``) leaves the rest.  Our kernels are compiled first by parallel worker processes;
Flex's compiles (per shape) count in the budget.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import asdict, replace

if "--cpu" in sys.argv:  # before triton is imported: kernels run in the interpreter on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["BLOCKSPARSE_BACKEND"] = "triton"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402

from blocksparse.layouts import attention as layouts  # noqa: E402
from blocksparse.ops.attention import configs  # noqa: E402
from blocksparse.ops.attention.configs import BwdConfig, FwdConfig  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.torch import AttentionLayout, attention  # noqa: E402
from blocksparse.torch._attention import launch as attention_launch  # noqa: E402

BS = 128
HEADS = 16
DTYPE = torch.bfloat16
LAYOUTS = ("causal", "fixed", "bigbird")
CAUSAL = {"causal": True, "fixed": True, "bigbird": False}
#: (S, B) in the order they run: the anchor shapes first, 64k last.
SHAPES = ((4096, 4), (16384, 1), (65536, 1))
HEAD_DIMS = (128, 64)
#: P and dS are rounded to bf16 before their products: gradients get twice the bound.
GRAD_FACTOR = 2
#: The sweep's longest problem checked against float64 (its dense scores: S x S float64 a head).
REFERENCE_MAX_S = 16384

# the sweep's candidates: a handful around the defaults, none of which spills many registers on
# sm_90 for head dim 128 (ptxas -v); the first of each list is the default
SWEEP_FWD = [FwdConfig(BM=bm, BN=bn, num_warps=w, num_stages=s, warp_specialize=ws, tma=tma)
             for bm, bn, w, s, ws, tma in [
                 (128, 64, 8, 3, False, True), (128, 128, 8, 3, False, True), (128, 64, 8, 2, False, True),
                 (128, 64, 8, 4, False, True), (128, 128, 8, 2, False, True), (128, 64, 4, 3, False, True),
                 (64, 64, 4, 3, False, True), (64, 128, 4, 3, False, True), (128, 64, 8, 3, True, True),
                 (128, 128, 8, 3, True, True), (128, 64, 8, 3, False, False), (64, 64, 4, 4, False, True)]]
SWEEP_BWD = [BwdConfig(BM1=m1, BN1=n1, BM2=m2, BN2=n2, num_warps=w, num_stages=s, tma=tma, atomic_dq=at)
             for m1, n1, m2, n2, w, s, tma, at in [
                 (32, 128, 128, 32, 8, 3, True, False), (16, 128, 128, 32, 8, 3, True, False),
                 (64, 64, 128, 64, 8, 3, True, False), (64, 128, 128, 64, 8, 3, True, False),
                 (32, 128, 128, 32, 8, 2, True, False), (32, 128, 128, 32, 8, 4, True, False),
                 (32, 128, 128, 64, 8, 3, True, False), (32, 128, 128, 32, 4, 3, True, False),
                 (64, 64, 64, 64, 4, 3, True, False), (32, 128, 128, 32, 8, 3, False, False),
                 (32, 128, 64, 64, 8, 3, True, True), (64, 64, 64, 64, 8, 3, True, True)]]
# and the full blocks' walks reading their tables one step ahead (``prefetch``: the main loops get
# num_stages tile buffers where the plain walk gets 2; see blocksparse/ops/attention/tiles.py)
SWEEP_FWD += [replace(SWEEP_FWD[i], prefetch=True) for i in (0, 1, 3, 6)]
SWEEP_BWD += [replace(SWEEP_BWD[i], prefetch=True) for i in (0, 2, 3, 5, 8)]
SWEEP_BWD += [replace(SWEEP_BWD[8], prefetch=True, num_stages=4)]
# "fixed" at 4k x 4 too: the one comparison row that ran slower with the prefetching tiles; BigBird
# 4k x 4: its (non-causal) rows ran 1.47x slower with the d64 tiles the causal and fixed shapes chose
SWEEP_SHAPES = (("causal", 4096, 4), ("fixed", 16384, 1), ("fixed", 4096, 4), ("bigbird", 4096, 4))
# the tables' configs with and without every head's heaviest tiles started first (grids (heads,
# tiles)), and the backward's in one launch (fused) or two; alone with them under --table
TABLE_FWD = [configs.fwd_config(D, BS) for D in HEAD_DIMS]
TABLE_BWD = [configs.bwd_config(D, BS) for D in HEAD_DIMS]
TABLE_FWD += [replace(c, heads_first=not c.heads_first) for c in TABLE_FWD]
TABLE_BWD += [replace(c, heads_first=not c.heads_first) for c in TABLE_BWD]
TABLE_BWD += [replace(c, fused=not c.fused) for c in TABLE_BWD]
SWEEP_FWD += [c for c in TABLE_FWD if c not in SWEEP_FWD]
SWEEP_BWD += [c for c in TABLE_BWD if c not in SWEEP_BWD]
# ``--reduce-dq`` (head dim 128): the table's backward (7 products a tile pair) against dk/dv programs
# that also add dq (5 products) by bulk reduce-adds of [BM1, 128] float32 tiles through a tensor
# descriptor (the copy engine's reduction, as FlashAttention-3 accumulates dq), written 2026-12-05:
# element atomics had taken 1.4x the table's time (attention-sweep-h200.md).  Compiled for sm_90:
# 255 registers, 112 / 80 / 8 B of stack at BM1 64 x 3 stages / 64 x 2 / 32 x 3.  Measured 2026-12-06
# on an H100 (results/raw/attention-reduce-dq-sweep-h100.md): 1.23-1.67x the table's time, not adopted.
REDUCE_DQ_BWD = [configs.bwd_config(128, BS)] + [
    replace(configs.bwd_config(128, BS), atomic_dq=True, fused=False, **kw)
    for kw in (dict(), dict(num_stages=2), dict(BM1=32), dict(heads_first=True), dict(prefetch=False))]

# ``--long-bwd`` (head dim 128): the table's backward and its neighbours on the rows still below 1.2x
# FlexAttention forward + backward (sparse layouts whose key columns are long: "fixed" 64k, BigBird),
# which the first sweeps did not time ("fixed" 64k ran out of memory in their float64 check).
# With them, ``store_ds``: the dk/dv programs write dS, a dq launch sums dS k from it (five products
# a tile pair instead of seven; "fixed" 64k's 9.6 GB of dS in chunks of heads under the scratch limit).
_T128 = configs.bwd_config(128, BS)
LONG_BWD = [_T128] + [replace(_T128, **kw) for kw in (
    dict(heads_first=True), dict(num_stages=2), dict(num_stages=4), dict(BM1=32), dict(BN2=32), dict(BM2=64),
    dict(prefetch=False), dict(fused=False),
    dict(store_ds=True), dict(store_ds=True, heads_first=True), dict(store_ds=True, BN2=128),
    dict(store_ds=True, BM1=32), dict(store_ds=True, num_stages=2), dict(store_ds=True, BM2=64, BN2=128))]
LONG_BWD_SHAPES = (("fixed", 65536, 1), ("bigbird", 4096, 4), ("bigbird", 16384, 1))

# --------------------------------------------------------------------------- problems
def make_layout(name, nb):
    if name == "causal":
        return layouts.causal(nb)
    if name == "fixed":
        return layouts.fixed(nb, min(8, max(1, nb // 2)), 1)
    return layouts.bigbird(nb, 1, 1, 3, seed=0)


class Problem:
    """Inputs (leaves with gradients), the prepared layout and its element mask for one case."""

    def __init__(self, name, S, B, D, device, heads=HEADS, seed=0):
        self.name, self.S, self.B, self.D, self.device = name, S, B, D, device
        self.causal = CAUSAL[name]
        self.layout_np = make_layout(name, S // BS)
        self.layout = AttentionLayout(self.layout_np, BS)
        g = torch.Generator(device=device).manual_seed(seed)
        self.q, self.k, self.v, self.do = (torch.randn(B, heads, S, D, generator=g, device=device).to(DTYPE)
                                           for _ in range(4))
        for t in (self.q, self.k, self.v):
            t.requires_grad_()

    @property
    def leaves(self):
        return [self.q, self.k, self.v]

    def keep(self):
        """(S, S) bool element mask: layout blocks, and causal inside them."""
        lay = torch.as_tensor(self.layout_np, device=self.device, dtype=torch.bool)
        keep = lay.repeat_interleave(BS, 0).repeat_interleave(BS, 1)
        return keep & torch.ones_like(keep).tril() if self.causal else keep

    def kept_pct(self):
        keep = self.layout_np.astype(bool) & (np.tri(self.S // BS, dtype=bool) if self.causal else True)
        return 100.0 * keep.mean()

    def ours(self):
        return attention(self.q, self.k, self.v, self.layout, causal=self.causal)

    def kernels(self):
        """:meth:`ours` on the fused kernels whatever the layout (``BLOCKSPARSE_ATTENTION_SDPA=off``)."""
        saved = os.environ.get("BLOCKSPARSE_ATTENTION_SDPA")
        os.environ["BLOCKSPARSE_ATTENTION_SDPA"] = "off"
        try:
            return self.ours()
        finally:
            if saved is None:
                os.environ.pop("BLOCKSPARSE_ATTENTION_SDPA")
            else:
                os.environ["BLOCKSPARSE_ATTENTION_SDPA"] = saved


def run_grads(fn, p):
    """Output and (dq, dk, dv) of one call with fresh gradients, outputs NaN-poisoned."""
    for t in p.leaves:
        t.grad = None
    with poisoned_empty():
        o = fn()
        o.backward(p.do)
    grads = [t.grad for t in p.leaves]
    for t in p.leaves:  # a later backward must not accumulate into the gradients returned here
        t.grad = None
    return [o.detach()] + grads


def reference_subset(p, heads=2):
    """float64 dense attention (SDPA math with a boolean mask) on ``heads`` heads of batch 0."""
    leaves = [t[:1, :heads].detach().double().requires_grad_() for t in p.leaves]
    o = F.scaled_dot_product_attention(*leaves, attn_mask=p.keep(), scale=p.D ** -0.5)
    return [o.detach()] + list(torch.autograd.grad(o, leaves, p.do[:1, :heads].double()))


def errors(got, ref, subset=None):
    """Relative errors of (o, dq, dk, dv), NaN where a result is not finite."""
    out = []
    for g, r in zip(got, ref):
        g = g if subset is None else g[:1, :subset]
        try:
            out.append(rel_error(g, r))
        except AssertionError:
            out.append(float("nan"))
    return out


def within(errs, factor=1.0):
    tol = tolerance(DTYPE)
    return all(e < factor * tol * (1 if i == 0 else GRAD_FACTOR) for i, e in enumerate(errs))


# --------------------------------------------------------------------------- timing
def time_ms(fn, leaves=None, first=False):
    """Median ms per call: CUDA events (do_bench) on a GPU, wall clock in the interpreter."""
    if torch.cuda.is_available():
        import triton
        # the first timing warms up for 100 ms: clocks take a while to rise after host-side work
        return triton.testing.do_bench(fn, warmup=100 if first else 10, rep=40, grad_to_none=leaves,
                                       return_mode="median")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(times))


def interleaved(calls, rounds, leaves):
    """``{name: (median ms, spread)}`` of each call over ``rounds`` rounds; each round times every
    call once, in an order rotated per round, so a change of the GPU's clocks shifts all the
    implementations of a case alike."""
    names = list(calls)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(time_ms(calls[name], leaves, first=r == 0))
    return {name: (float(np.median(t)), (max(t) - min(t)) / min(t)) for name, t in times.items()}


def fwd_and_fwdbwd(impl, fwd, p):
    """The two timed calls of an implementation: forward, and forward + backward."""
    def both():
        fwd().backward(p.do)
    return {(impl, "fwd"): fwd, (impl, "fwdbwd"): both}


# --------------------------------------------------------------------------- FlexAttention
_flex = None
_mask_mods = {}


def flex_impl(p):
    """Compiled flex_attention over the BlockMask of ``p``'s layout (+ causal mask_mod), and whether
    that BlockMask keeps exactly our blocks."""
    global _flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex is None:
        torch._dynamo.config.cache_size_limit = 256     # never an eager fallback
        torch._dynamo.config.accumulated_cache_size_limit = 4096
        # static kernels per shape, as the anchors measured Flex (one shape a process): under the
        # default, the second sequence length marks the dims dynamic and Flex's later shapes ran
        # slower kernels (16k and 64k: up to 1.4x its static time)
        _flex = torch.compile(flex_attention, dynamic=False)
    key = (p.S, p.causal)
    if key not in _mask_mods:
        # one mask_mod per (S, causal) reading a layout buffer that each case overwrites: layouts of
        # one shape share a compiled kernel instead of recompiling for each new closure
        lay = torch.zeros(p.S // BS, p.S // BS, dtype=torch.bool, device=p.device)
        if p.causal:
            def mask_mod(b, h, q_idx, kv_idx):
                return lay[q_idx // BS, kv_idx // BS] & (q_idx >= kv_idx)
        else:
            def mask_mod(b, h, q_idx, kv_idx):
                return lay[q_idx // BS, kv_idx // BS]
        _mask_mods[key] = mask_mod, lay
    mask_mod, lay = _mask_mods[key]
    lay.copy_(torch.as_tensor(p.layout_np != 0, device=p.device))
    bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=p.S, KV_LEN=p.S, device=p.device, BLOCK_SIZE=BS)
    want = p.layout_np.astype(bool) & (np.tri(p.S // BS, dtype=bool) if p.causal else True)
    same = bool((bm.to_dense()[0, 0].cpu().numpy().astype(bool) == want).all())
    return (lambda: _flex(p.q, p.k, p.v, block_mask=bm)), same


# --------------------------------------------------------------------------- comparison
def compare_case(name, S, B, D, device, cpu, rounds):
    """Rows (ours, flex, sdpa, flash) of one case: each checked, then all timed interleaved."""
    attention_launch._PLANS._plans.clear()  # the launches this case prepares are recorded with its row
    p = Problem(name, S, B, D, device, heads=2 if cpu else HEADS)
    base = dict(S=S, B=B, H=p.q.shape[1], D=D, layout=name, causal=p.causal, kept_pct=round(p.kept_pct(), 1))
    ref = reference_subset(p) if S <= 4096 else None
    ours = run_grads(p.ours, p)
    rows = {"ours": dict(base, impl="ours", check="float64" if ref is not None else "vs-flex")}
    if ref is not None:
        rows["ours"].update(_errors_row(errors(ours, ref, 2)))
    calls = fwd_and_fwdbwd("ours", p.ours, p)
    if p.layout._dense is not None:  # ours ran PyTorch's dense attention: the kernels too
        got = run_grads(p.kernels, p)
        rows["kernels"] = dict(base, impl="kernels", check="float64" if ref is not None else "vs-ours")
        rows["kernels"].update(_errors_row(errors(got, ref, 2) if ref is not None else errors(got, ours),
                                           factor=1.0 if ref is not None else 2.0))
        del got
        calls.update(fwd_and_fwdbwd("kernels", p.kernels, p))
    if not cpu:
        try:
            flex, same = flex_impl(p)
            flex().backward(p.do)  # compile forward and backward outside the NaN-poisoned calls
            got = run_grads(flex, p)
            rows["flex"] = dict(base, impl="flex", same_blocks=same, check=rows["ours"]["check"])
            if ref is not None:
                rows["flex"].update(_errors_row(errors(got, ref, 2)))
                rows["flex"]["ok"] = rows["flex"]["ok"] and same
            else:  # beyond 4k: ours against Flex
                rows["ours"].update(_errors_row(errors(ours, got), factor=2.0))
                rows["flex"]["ok"] = same
            del got
            calls.update(fwd_and_fwdbwd("flex", flex, p))
        except Exception as exc:  # keep ours; note what Flex did
            rows["flex"] = dict(base, impl="flex", error=repr(exc)[:300])
        if name == "causal":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def sdpa():
                return F.scaled_dot_product_attention(p.q, p.k, p.v, is_causal=True)

            def flash():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa()
            rows["sdpa"] = dict(base, impl="sdpa", sdpa_kernels=sdpa_kernels(sdpa, p))
            rows["flash"] = dict(base, impl="flash")
            calls.update(fwd_and_fwdbwd("sdpa", sdpa, p))
            calls.update(fwd_and_fwdbwd("flash", flash, p))
    del ours
    rows["ours"]["launches"] = sorted({r.path for plan in attention_launch._PLANS._plans.values() for r in plan})
    for (impl, kind), (ms, spread) in interleaved(calls, rounds, p.leaves).items():
        rows[impl][f"{kind}_ms"] = ms
        rows[impl][f"{kind}_spread"] = round(spread, 3)
    return list(rows.values())


def sdpa_kernels(fn, p):
    """Names of the attention kernels that one forward + backward of ``fn`` launches (which backend
    PyTorch's dispatch picked)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn().backward(p.do)
        torch.cuda.synchronize()
    for leaf in p.leaves:
        leaf.grad = None
    names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    return sorted(n[:80] for n in names if any(w in n.lower() for w in ("attn", "flash", "fmha", "sdpa")))


def _errors_row(err, factor=1.0):
    return dict(err_o=err[0], err_dq=err[1], err_dk=err[2], err_dv=err[3], ok=within(err, factor))


def comparison_cases(args):
    if args.cpu:
        return [(name, 256, 1, 64) for name in LAYOUTS]
    shapes = [(S, B) for S, B in (SHAPES[:1] if args.quick else SHAPES) if not args.seqs or S in args.seqs]
    dims = [D for D in (HEAD_DIMS[:1] if args.quick else HEAD_DIMS) if not args.dims or D in args.dims]
    return [(name, S, B, D) for S, B in shapes for D in dims for name in LAYOUTS]


def comparison_markdown(meta, rows):
    by = {}
    for r in rows:
        by.setdefault((r["S"], r["B"], r["D"], r["layout"]), {})[r["impl"]] = r
    fmt = lambda r, k: f"{r[k]:.3f}" if r and isinstance(r.get(k), float) else "–"  # noqa: E731
    lines = [f"# Fused block-sparse attention, {meta['device']} ({meta['date']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}; bf16, block size {BS}; ms = median of "
             "interleaved rounds (max spread: the largest (max - min) / min of a case's timings). "
             "Speedup = Flex ms / ours ms (goal >= 1.2); ours/sdpa = our ms / dense causal SDPA ms as PyTorch "
             "dispatches it (goal <= 1.1; on the H200 cuDNN's flash kernel); flash: SDPA forced onto the flash "
             f"backend (FlashAttention 2), for reference. Our launches: {meta.get('kernels', 'jit')}.", "",
             "Layouts that drop no block (causal) run PyTorch's SDPA through our call; `kernels` times "
             "the same call on our fused kernels (`BLOCKSPARSE_ATTENTION_SDPA=off`).", "",
             "| S | B | D | layout (kept %) | ours fwd / fwd+bwd | kernels fwd / fwd+bwd | Flex fwd / fwd+bwd "
             "| sdpa fwd / fwd+bwd | flash fwd / fwd+bwd | speedup vs Flex fwd / fwd+bwd | ours/sdpa fwd / fwd+bwd "
             "| kernels/sdpa fwd / fwd+bwd | checked | max spread |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (S, B, D, name), g in by.items():
        o, kn, f, sd, fl = g.get("ours"), g.get("kernels"), g.get("flex"), g.get("sdpa"), g.get("flash")
        ratio = lambda a, b, k: (f"{a[k] / b[k]:.2f}" if a and b and a.get(k) and b.get(k) else "–")  # noqa: E731
        ok = "ok" if o and o.get("ok") and all(r is None or r.get("ok") for r in (f, kn)) else "FAIL"
        kept = (o or f or {}).get("kept_pct", "?")
        spread = max((r.get(k, 0.0) for r in g.values() for k in ("fwd_spread", "fwdbwd_spread")), default=0.0)
        lines.append(f"| {S} | {B} | {D} | {name} ({kept}) | {fmt(o, 'fwd_ms')} / {fmt(o, 'fwdbwd_ms')} "
                     f"| {fmt(kn, 'fwd_ms')} / {fmt(kn, 'fwdbwd_ms')} "
                     f"| {fmt(f, 'fwd_ms')} / {fmt(f, 'fwdbwd_ms')} | {fmt(sd, 'fwd_ms')} / {fmt(sd, 'fwdbwd_ms')} "
                     f"| {fmt(fl, 'fwd_ms')} / {fmt(fl, 'fwdbwd_ms')} | {ratio(f, o, 'fwd_ms')} / {ratio(f, o, 'fwdbwd_ms')} "
                     f"| {ratio(o, sd, 'fwd_ms')} / {ratio(o, sd, 'fwdbwd_ms')} "
                     f"| {ratio(kn, sd, 'fwd_ms')} / {ratio(kn, sd, 'fwdbwd_ms')} | {ok} | {100 * spread:.0f}% |")
    errs = [r for r in rows if "error" in r]
    if errs:
        lines += ["", "Errors:", *[f"- {r['S']} {r['D']} {r['layout']} {r['impl']}: {r['error']}" for r in errs]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- sweep
def sweep_case(name, S, B, D, device, cpu, fwd_cfgs, bwd_cfgs, rounds=2):
    """Rows per config of the forward and backward launchers on one problem: each checked against
    float64 (up to :data:`REFERENCE_MAX_S` tokens; beyond, whose dense float64 scores would not
    fit, against the tables' own configs within twice the bound), then the correct ones timed
    interleaved."""
    from blocksparse.torch._attention import launch
    from blocksparse.torch._attention.state import state

    p = Problem(name, S, B, D, device, heads=2 if cpu else HEADS)
    tables = state(p.layout._handle).tables(p.causal, device)
    q, k, v, do = (t.detach() for t in (p.q, p.k, p.v, p.do))
    kw = dict(block_size=BS, causal=p.causal, scale=D ** -0.5)
    o, lse = launch.fwd(q, k, v, None, tables, cfg=configs.fwd_config(D, BS), **kw)
    if S <= REFERENCE_MAX_S:
        ref, subset, factor = reference_subset(p), 2, 1.0
    else:
        table_bwd = configs.bwd_config(D, BS, state(p.layout._handle).density(p.causal))
        ref, subset, factor = [o, *launch.bwd(do, q, k, v, o, lse, None, tables, cfg=table_bwd, **kw)], None, 2.0
    rows, calls = {}, {}
    for kind, cfgs in (("fwd", fwd_cfgs), ("bwd", bwd_cfgs)):
        for i, cfg in enumerate(cfgs):
            row = rows[kind, i] = dict(S=S, B=B, D=D, layout=name, kind=kind, config=asdict(cfg))
            if kind == "fwd":
                call = functools.partial(launch.fwd, q, k, v, None, tables, cfg=cfg, **kw)
            else:
                call = functools.partial(launch.bwd, do, q, k, v, o, lse, None, tables, cfg=cfg, **kw)
            try:
                with poisoned_empty():
                    err = errors(call()[:1], ref[:1], subset) if kind == "fwd" else errors(call(), ref[1:], subset)
                row.update(errors=err, ok=within(err if kind == "fwd" else [0.0] + err, factor))
                if row["ok"]:
                    calls[kind, i] = call
            except Exception as exc:
                row.update(ok=False, error=repr(exc)[:300])
    for key, (ms, spread) in interleaved(calls, rounds, None).items():
        rows[key].update(ms=ms, spread=round(spread, 3))
    for row in rows.values():
        print(json.dumps(row), flush=True)
    return list(rows.values())


def sweep_best(rows):
    """Per (D, kind): [(summed ms over the shapes, config json)] of the configs correct on every shape,
    fastest first, and the configs that failed somewhere."""
    out = {}
    for D in sorted({r["D"] for r in rows if "config" in r}):
        for kind in ("fwd", "bwd"):
            per = {}
            for r in rows:
                if r["D"] == D and r.get("kind") == kind:
                    per.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r)
            n_shapes = max((len(v) for v in per.values()), default=0)
            scored = sorted((sum(r["ms"] for r in v), c) for c, v in per.items()
                            if len(v) == n_shapes and all(r.get("ok") for r in v))
            out[D, kind] = scored, [c for c, v in per.items() if not all(r.get("ok") for r in v)], n_shapes
    return out


def sweep_markdown(meta, rows):
    lines = [f"# Attention tile-config sweep, {meta['device']} ({meta['date']})", ""]
    for (D, kind), (scored, bad, n_shapes) in sweep_best(rows).items():
        lines += [f"## D = {D}, {kind} (summed ms over {n_shapes} shapes, correct configs only)", "",
                  "| ms | config |", "|---|---|"] + [f"| {ms:.3f} | `{c}` |" for ms, c in scored]
        lines += [f"| FAIL | `{c}` |" for c in bad] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- warm-up
def _warm(part):
    """Worker: compile the kernels of each (D, causal, fwd cfg, bwd cfg) on a small problem with the
    same specialisation as the timed ones (sizes divisible by 16, one layout head); return failures."""
    from blocksparse.torch._attention import launch
    from blocksparse.torch._attention.state import state

    jobs, device = part
    S, heads = (2048, HEADS) if device == "cuda" else (256, 2)
    fails = []
    for D, causal, fcfg, bcfg in jobs:
        try:
            p = Problem("causal" if causal else "bigbird", S, 1, D, device, heads=heads)
            tables = state(p.layout._handle).tables(causal, device)
            q, k, v, do = (t.detach() for t in (p.q, p.k, p.v, p.do))
            kw = dict(block_size=BS, causal=causal, scale=D ** -0.5)
            o, lse = launch.fwd(q, k, v, None, tables, cfg=fcfg, **kw)
            launch.bwd(do, q, k, v, o, lse, None, tables, cfg=bcfg, **kw)
        except Exception as exc:
            fails.append((D, causal, repr(fcfg), repr(bcfg), repr(exc)[:200]))
    if device == "cuda":
        torch.cuda.synchronize()
    return fails


def warm(jobs, workers, device):
    """Compile the kernels of ``jobs`` in ``workers`` spawned processes (Triton's disk cache keeps
    them for this process)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.time()
    workers = max(1, min(workers, len(jobs)))
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        parts = [(jobs[i::workers], device) for i in range(workers)]
        fails = [f for part in pool.map(_warm, parts) for f in part]
    print(f"compiled {len(jobs)} kernel sets in {time.time() - t0:.0f}s; {len(fails)} failures", flush=True)
    for f in fails:
        print("  WARM FAIL", *f, flush=True)


# --------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--sweep", action="store_true", help="time tile configs instead of comparing")
    ap.add_argument("--table", action="store_true", help="--sweep: only the tables' configs and their twins that "
                    "start every head's heaviest tiles first")
    ap.add_argument("--reduce-dq", action="store_true", help="--sweep: head dim 128, the table's backward against "
                    "dq added by bulk reduce-adds (REDUCE_DQ_BWD)")
    ap.add_argument("--long-bwd", action="store_true", help="--sweep: head dim 128, the table's backward and its "
                    "neighbours (LONG_BWD) on the sparse rows below 1.2x Flex (LONG_BWD_SHAPES)")
    ap.add_argument("--quick", action="store_true", help="one shape / few configs: a smoke run")
    ap.add_argument("--cpu", action="store_true", help="tiny shapes in Triton's interpreter (no GPU)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting new cases after this many seconds (default 285 on a GPU, none with --cpu)")
    ap.add_argument("--rounds", type=int, default=3, help="comparison: interleaved timing rounds per case")
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    ap.add_argument("--seqs", type=ints, default=[], help="comparison: only these sequence lengths, e.g. 65536")
    ap.add_argument("--dims", type=ints, default=[], help="only these head dims, e.g. 128")
    ap.add_argument("--store-ds", action="store_true", help="comparison: the tables' backward configs with "
                    "store_ds (dS written by the dk/dv programs, read back by the dq launch)")
    ap.add_argument("--workers", type=int, default=12, help="parallel kernel compilation (GPU)")
    shapes = lambda text: [(n, int(s), int(b)) for n, s, b in (x.split(":") for x in text.split(",") if x)]  # noqa: E731
    ap.add_argument("--sweep-shapes", type=shapes, default=None,
                    help="--sweep: these problems instead of SWEEP_SHAPES, e.g. bigbird:65536:1,fixed:16384:1")
    args = ap.parse_args()
    if args.budget_s is None:
        args.budget_s = float("inf") if args.cpu else 285.0
    if args.cpu:  # the interpreter: one round shows the script works
        args.rounds = 1
    if args.store_ds:
        configs._BWD.update({D: replace(c, store_ds=True) for D, c in configs._BWD.items()})
    t0 = time.time()
    device = "cpu" if args.cpu else "cuda"
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("no CUDA GPU: run with --cpu (interpreter) or on a GPU machine")
    import triton
    gpu = "cpu" if args.cpu else common.gpu_tag()
    meta = dict(device="CPU (Triton interpreter)" if args.cpu else torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
                mode="sweep" if args.sweep else "compare", quick=args.quick, kernels=common.launch_source(),
                bwd_configs={D: asdict(configs.bwd_config(D, BS)) for D in HEAD_DIMS})
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"attention{'-sweep' if args.sweep else ''}-{gpu}")

    if args.sweep:
        fwd_cfgs, bwd_cfgs = ((SWEEP_FWD[:2], SWEEP_BWD[:2]) if args.quick else (TABLE_FWD, TABLE_BWD) if args.table
                              else (TABLE_FWD[:1], REDUCE_DQ_BWD) if args.reduce_dq
                              else (TABLE_FWD[:1], LONG_BWD) if args.long_bwd else (SWEEP_FWD, SWEEP_BWD))
        if (args.reduce_dq or args.long_bwd) and not args.cpu:
            args.dims = [128]
        if args.long_bwd and not args.cpu and not args.sweep_shapes:
            args.sweep_shapes = LONG_BWD_SHAPES
        cases = ([("causal", 256, 1)] if args.cpu else args.sweep_shapes or (SWEEP_SHAPES[:1] if args.quick
                                                                            else SWEEP_SHAPES))
        dims = (64,) if args.cpu else tuple(D for D in HEAD_DIMS if not args.dims or D in args.dims)
        n = max(len(fwd_cfgs), len(bwd_cfgs))  # every forward and every backward config compiled once
        jobs = [(D, True, fwd_cfgs[i % len(fwd_cfgs)], bwd_cfgs[i % len(bwd_cfgs)]) for D in dims for i in range(n)]
        todo = [(name, S, B, D) for D in dims for name, S, B in cases]
        run = lambda name, S, B, D: sweep_case(name, S, B, D, device, args.cpu, fwd_cfgs, bwd_cfgs)  # noqa: E731
        markdown = sweep_markdown
    else:
        todo = comparison_cases(args)
        jobs = [(D, c, configs.fwd_config(D, BS), configs.bwd_config(D, BS))
                for D in sorted({D for *_, D in todo}) for c in (True, False)]
        run = lambda name, S, B, D: compare_case(name, S, B, D, device, args.cpu, args.rounds)  # noqa: E731
        markdown = comparison_markdown

    # the interpreter compiles nothing: one job there only checks the workers run
    warm(jobs[:1] if args.cpu else jobs, 1 if args.cpu else args.workers, device)
    rows, skipped = [], []
    for case in todo:
        if time.time() - t0 > args.budget_s:
            skipped.append(case)
            continue
        try:
            new = run(*case)
        except Exception as exc:
            name, S, B, D = case
            new = [dict(S=S, B=B, D=D, layout=name, impl="ours", kind="case", error=repr(exc)[:300])]
        if not args.sweep:
            for r in new:
                print(json.dumps(r), flush=True)
        rows += new
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        with open(stem + ".json", "w") as f:
            json.dump(dict(meta, rows=rows, skipped=skipped, seconds=round(time.time() - t0)), f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(markdown(meta, rows))
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta, rows=rows, skipped=skipped, seconds=round(time.time() - t0)), f, indent=1)
    print(markdown(meta, rows))
    if args.sweep:
        for (D, kind), (scored, _, _) in sweep_best(rows).items():
            if scored:
                print(f"best D={D} {kind}: {scored[0][1]} ({scored[0][0]:.3f} ms)")
    bad = [r for r in rows if "error" in r or not r.get("ok", True)]
    print(f"{len(rows)} rows, {len(bad)} failed or inaccurate, {len(skipped)} cases skipped (budget); "
          f"{time.time() - t0:.0f}s -> {stem}.json/.md")
    for r in bad:
        print("  BAD", json.dumps(r))


if __name__ == "__main__":
    main()
