"""Sweep 5 (issue 16, items 2-4): the round-2 kernel candidates against the current kernel and cuBLAS.

    python bench/tune_bsmm2.py --out DIR                 # H200: about 2 minutes
    python bench/tune_bsmm2.py --out DIR --quick         # 5 problems, about 40 s
    python bench/tune_bsmm2.py --out DIR --quick --cpu   # Triton's interpreter, tiny shapes (script check)

On the H200 the compile warm-up (parallel worker processes, ``--workers``) takes about 40 s and the
measurements about 60 s.  Candidates (predictions in ``bench/README.md``, "Round 2 candidates"):

* ``persist``           persistent fprop/bprop: a few programs per SM walk their output tiles in one
                        pipelined loop (:mod:`blocksparse.ops.matmul.xprop_stream`, aligned schedule);
* ``g2-skip``, ``g4-skip``  G outputs per program grouped by shared inputs
                        (:func:`~blocksparse.ops.matmul.stream_table.overlap_groups`), dots and bytes
                        of missing blocks skipped; ``g4-skip-persist`` the same, persistent;
* ``g4-noskip``         control: the same groups with the matrix work on missing blocks done;
* ``g4-adjacent-skip``  control: adjacent outputs grouped (the layout core's grouping), skipping;
* ``streamk``, ``streamk-1``, ``streamk-g2``  few tokens: stream-K ranges with the in-kernel
                        reduction of split outputs (2 or 1 programs per SM; output pairs);
* ``current-deep``      few tokens: the current kernel and plan with a deeper pipeline;
* ``balanced``          updat with token slices chosen against the wave tail
                        (:func:`~blocksparse.ops.matmul.updat_balance.balanced_split`);
* ``tile-g16``, ``tile-g8-bk32``  updat at bs 32: other tiles of the row-stacked pointer kernel.

Problems: C = K = 4096, bf16; N = 8192 (fprop and updat at block sizes 32 / 64 / 128 and densities
0.1 / 0.25 / 0.5, bprop at 32 / 64 and 0.25 / 0.5) and N = 64 (fprop, 32 / 64 / 128 at 0.25 / 0.5).
Per problem every implementation is first checked against float64 (outputs NaN-poisoned), then
dense cuBLAS, the current kernel (through its plan, ``torch.ops.blocksparse``) and every candidate
are timed interleaved in ``--rounds`` rounds (``bench/bsmm.py``'s method: events for N = 8192, CUDA
graphs over rotating operand copies for N = 64).  A row carries ``frac_of_dense`` (useful TFLOP/s
over dense, measured beside it), ``hbm_frac`` (N = 64), ``vs_current`` (speed over the current
kernel) and, where readable, the compiled kernel's registers, spills and shared memory.
Writes ``tune2.json`` and ``tune2.md`` into ``--out`` after every problem.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "--cpu" in sys.argv:  # before triton or blocksparse import: the kernels run in the interpreter
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["BLOCKSPARSE_BACKEND"] = "triton"

import torch  # noqa: E402

import bsmm  # noqa: E402
import common  # noqa: E402
from blocksparse.ops.matmul import configs  # noqa: E402
from blocksparse.ops.matmul.updat_balance import balanced_split  # noqa: E402
from blocksparse.ops.matmul.xprop_stream import (StreamConfig, device_plan, plan_stream,  # noqa: E402
                                                 xprop_stream, xprop_stream_kernel)

C = K = 4096
BIG, SMALL = 8192, 64
S = StreamConfig

#: N = 8192 candidates: name -> {block size: config}.  Tiles follow the current table
#: (configs._XPROP).  ``num_stages`` is Triton's knob, not the depth: with one level of table loads
#: before the tile loads it gives (num_stages - 1) // 2 + 1 tile buffers (the current kernels: 3),
#: without a dot outside a branch (SKIP) num_stages buffers; ``preflight_tune2.py`` prints them.
#: Depths match the current kernel's (persist) or each other's (skip and its control).
XPROP = {
    "persist": {32: S(256, 1, 8, 5, PER_SM=3), 64: S(256, 1, 8, 5, PER_SM=1),
                128: S(128, 1, 4, 5, BK=64, PER_SM=2)},
    "g2-skip": {32: S(256, 2, 8, 5, SKIP=True), 64: S(256, 2, 8, 3, SKIP=True)},
    "g4-skip": {32: S(256, 4, 8, 5, SKIP=True), 64: S(128, 4, 8, 4, SKIP=True)},
    "g4-skip-persist": {32: S(256, 4, 8, 5, SKIP=True, PER_SM=1), 64: S(128, 4, 8, 4, SKIP=True, PER_SM=1)},
    "g4-noskip": {32: S(256, 4, 8, 9), 64: S(128, 4, 8, 7)},
    "g4-adjacent-skip": {32: S(256, 4, 8, 5, SKIP=True, GROUPING="adjacent"),
                         64: S(128, 4, 8, 4, SKIP=True, GROUPING="adjacent")},
}
#: N = 64 candidates (one token tile: stream-K ranges over the weight blocks), 4-6 tile buffers.
SMALL_XPROP = {
    "streamk": {32: S(64, 1, 4, 11, SPLIT=True, PER_SM=2), 64: S(64, 1, 4, 8, SPLIT=True, PER_SM=2),
                128: S(64, 1, 4, 8, BK=64, SPLIT=True, PER_SM=1)},
    "streamk-1": {32: S(64, 1, 4, 15, SPLIT=True, PER_SM=1), 64: S(64, 1, 4, 11, SPLIT=True, PER_SM=1)},
    "streamk-g2": {32: S(64, 2, 4, 11, SPLIT=True, PER_SM=2), 64: S(64, 2, 4, 7, SPLIT=True, PER_SM=2)},
}
#: N = 64: the current kernel and plan with a deeper pipeline (today 2 tile buffers at bs 32, 3 above).
DEEP_STAGES = {32: 7, 64: 8, 128: 8}
U = configs.UpdatConfig
#: updat candidates: other tiles for bs 32 (the row-stacked pointer kernel, today's split rule).
UPDAT = {"tile-g16": {32: U(16, 32, 8, 3, TMA=False)}, "tile-g8-bk32": {32: U(8, 32, 8, 4, TMA=False)}}
#: Shared memory per SM (H100 / H200) for the updat occupancy estimate.
SMEM_PER_SM = 228 * 1024


def problems(quick=False):
    """(N, block size, density, op) of every problem, N = 8192 first."""
    out = []
    for bs in (32, 64, 128):
        for d in (0.1, 0.25, 0.5):
            out += [(BIG, bs, d, "fprop")] + ([(BIG, bs, d, "bprop")] if bs < 128 and d > 0.1 else [])
            out.append((BIG, bs, d, "updat"))
    out += [(SMALL, bs, d, "fprop") for bs in (32, 64, 128) for d in (0.25, 0.5)]
    if quick:
        keep = {(BIG, 32, 0.25, "fprop"), (BIG, 128, 0.1, "fprop"), (BIG, 128, 0.1, "updat"),
                (SMALL, 32, 0.5, "fprop"), (SMALL, 128, 0.25, "fprop")}
        out = [p for p in out if p in keep]
    return out


def candidates(n, bs, op, cpu=False):
    """(name, config) of the candidates timed on a problem (configs shrunk for the interpreter)."""
    table = UPDAT if op == "updat" else SMALL_XPROP if n == SMALL else XPROP
    out = [(name, cfgs[bs]) for name, cfgs in table.items() if bs in cfgs]
    if cpu:  # the interpreter's cost grows with tile area
        small = dict(BK=16) if op == "updat" else dict(BM=16)
        out = [(name, replace(c, num_stages=min(c.num_stages, 2), **small)) for name, c in out]
    if op == "updat":
        return [("balanced", None)] + out
    return ([("current-deep", DEEP_STAGES[bs])] if n == SMALL else []) + out


class Case:
    """One problem: operands, float64 references and a callable per implementation."""

    def __init__(self, n, bs, d, device, sms):
        self.p = common.Problem(C, K, n, bs, d, torch.bfloat16, seed=1000 * bs + int(100 * d), device=device)
        from blocksparse.torch._matmul import plan as _plan
        self.handle = _plan.handle(self.p.layout)
        self.sms = sms
        self._plans = {}

    def operands(self, copy=False):
        p = self.p
        return (p.x.clone(), p.w.clone(), p.dy.clone()) if copy else (p.x, p.w, p.dy)

    def call(self, impl, op, cfg, tensors):
        """A zero-argument launch of ``impl`` on ``tensors`` = (x, w, dy)."""
        x, w, dy = tensors
        p = self.p
        if impl == "dense":  # a random dense weight: cuBLAS is faster on zeros
            W = torch.randn(C, K, device=w.device).to(w.dtype)
            return {"fprop": lambda: x @ W, "bprop": lambda: dy @ W.t(), "updat": lambda: x.t() @ dy}[op]
        if impl == "current":
            ops = torch.ops.blocksparse
            return {"fprop": lambda: ops.matmul(x, w, self.handle, 1, "ieee"),
                    "bprop": lambda: ops.matmul_dx(dy, w, self.handle, 1, "ieee"),
                    "updat": lambda: ops.matmul_dw(x, dy, self.handle, 1, "ieee", x.dtype)}[op]
        if impl == "current-deep":  # cfg: num_stages
            from blocksparse.torch._matmul import launch
            plan, headers, entries = self.current_plan(op)
            deep = replace(plan.config, num_stages=cfg)
            inp, out_features = (x, K) if op == "fprop" else (dy, C)
            return lambda: launch.xprop(inp, w, headers, entries, out_features=out_features, bs=p.bs, axis=1,
                                        trans=op == "bprop", cfg=deep, atomic=plan.max_segment is not None,
                                        precision="ieee")
        if op == "updat":
            from blocksparse.torch._matmul import launch
            cfg, groups, split = self.updat_plan(cfg)
            fn = launch.updat_tma if cfg.TMA and launch.tma_ok(x, dy) else launch.updat_ptr
            return lambda: fn(x, dy, groups, w_shape=p.layout.w_shape, bs=p.bs, axis=1, cfg=cfg, split=split,
                              precision="ieee", dw_dtype=x.dtype)
        plan, tables = self.stream_plan(op, cfg)
        inp, out_features = (x, K) if op == "fprop" else (dy, C)
        return lambda: xprop_stream(inp, w, plan, tables, out_features=out_features, bs=p.bs, axis=1,
                                    trans=op == "bprop", cfg=cfg)

    def current_plan(self, op):
        """(plan, headers, entries) the current kernel runs ``op`` with."""
        from blocksparse.torch._matmul import plan as _plan
        from blocksparse.torch._matmul import products
        p = self.p
        a, b = {"fprop": (p.x, p.w), "bprop": (p.dy, p.w), "updat": (p.x, p.dy)}[op]
        plan = products.plan_of(op, a, b, self.handle, 1, "ieee", p.x.dtype if op == "updat" else None)
        if op == "updat":
            return plan, None, None
        return (plan, *_plan.state(self.handle).xprop_tables(op, plan.max_segment, plan.config.G, p.x.device))

    def stream_plan(self, op, cfg):
        key = (op, cfg)
        if key not in self._plans:
            plan = plan_stream(self.p.layout, op, self.p.N, cfg, self.sms)
            self._plans[key] = (plan, device_plan(plan, self.p.x.device))
        return self._plans[key]

    def updat_plan(self, cfg=None):
        """(config, device table, split) of an updat candidate: ``cfg`` with today's split rule,
        or (None: ``balanced``) today's tile with :func:`balanced_split` for the programs per SM
        the tile's shared memory allows."""
        key = ("updat", cfg)
        if key not in self._plans:
            p = self.p
            if cfg is None:
                cfg = configs.updat_config(p.bs, p.N, tma=True, interpret=p.x.device.type != "cuda")
                table = p.layout.updat_groups(cfg.G)
                tile = 2 * cfg.BK * p.bs * (1 + cfg.G) * cfg.num_stages          # x + G dy tiles per stage
                per_sm = max(1, min(SMEM_PER_SM // (tile + 1024), 64 // cfg.num_warps))
                split = balanced_split(int(table.shape[0]), p.N, cfg.BK, self.sms * per_sm)
            else:
                table = p.layout.updat_groups(cfg.G)
                split = configs.updat_split(cfg, p.N, int(table.shape[0]), self.sms)
            groups = torch.tensor(table.astype("int32"), device=p.x.device)
            self._plans[key] = (cfg, groups, split)
        return self._plans[key]

    def detail(self, impl, op, cfg):
        """What a row records about the implementation's plan."""
        if impl in ("current", "current-deep"):
            plan = self.current_plan(op)[0]
            config = asdict(plan.config) | ({"num_stages": cfg} if impl == "current-deep" else {})
            return dict(config=config, max_segment=plan.max_segment, split=plan.split)
        if impl == "dense":
            return {}
        if op == "updat":
            cfg, groups, split = self.updat_plan(cfg)
            return dict(config=asdict(cfg), split=split, runs=int(groups.shape[0]))
        plan, _ = self.stream_plan(op, cfg)
        from blocksparse.ops.matmul.stream_table import reuse
        return dict(config=asdict(cfg), programs=plan.programs, steps=int(plan.steps.size),
                    reuse=round(reuse(self.p.layout, op, plan.table.outs), 3))


def impls(n, bs, op, cpu=False):
    return [("dense", None), ("current", None)] + candidates(n, bs, op, cpu)


def _warm(chunk):
    """Worker: run every implementation of its problems once (fills Triton's cache); failures."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fails = []
    for n, bs, d, op in chunk:
        try:
            case = Case(n, bs, d, "cuda", sms)
            for impl, cfg in impls(n, bs, op):
                try:
                    case.call(impl, op, cfg, case.operands())()
                except Exception as exc:
                    fails.append(((n, bs, d, op, impl), repr(exc)[:300]))
        except Exception as exc:
            fails.append(((n, bs, d, op), repr(exc)[:300]))
    torch.cuda.synchronize()
    return fails


class WallTimer:
    """CPU stand-in for ``bsmm.Timer`` (``--cpu``: checks the flow, the times mean nothing)."""

    kind = "wall"

    def __init__(self, n, build, per_set_bytes):
        self.fn = build(False)

    def ms(self, first=False):
        t0 = time.perf_counter()
        self.fn()
        return 1e3 * (time.perf_counter() - t0)


def kernel_info(before):
    """Registers, spills and shared memory of the stream kernel compiled since ``before`` (the
    kernel cache's keys then); {} where none was or the cache cannot be read."""
    try:
        cache = xprop_stream_kernel.device_caches[torch.cuda.current_device()][0]
        new = [k for key, k in cache.items() if key not in before]
        if not new:
            return {}
        k = new[-1]
        k._init_handles()
        return dict(n_regs=k.n_regs, n_spills=k.n_spills, shared=k.metadata.shared)
    except Exception:
        return {}


def cache_keys():
    try:
        return set(xprop_stream_kernel.device_caches[torch.cuda.current_device()][0])
    except Exception:
        return set()


#: Programs per SM that fit, per compiled stream kernel (keyed by what the kernel is compiled
#: for): read at a kernel's first compile in this process, reused by later problems.
_RESIDENT = {}


def _kernel_key(op, bs, cfg):
    return op == "bprop", bs, replace(cfg, PER_SM=0, GROUPING="overlap")


def resident(info, num_warps):
    """Programs of a compiled kernel that fit on one SM: shared memory, registers, threads."""
    by_smem = SMEM_PER_SM // (info["shared"] + 1024)
    by_regs = 65536 // (-(-info["n_regs"] // 8) * 8 * 32 * num_warps)
    return max(1, min(by_smem, by_regs, 64 // num_warps))


def check(case, impl, op, cfg, cpu):
    """(row fields, config): the implementation run once on NaN-poisoned outputs against float64.
    A persistent candidate whose compiled kernel fits fewer programs per SM than asked is
    re-planned for as many as fit (a second wave of persistent programs would double its time)."""
    p = case.p
    row = case.detail(impl, op, cfg)
    if impl == "dense":
        return row, cfg
    for attempt in range(2):
        before = cache_keys()
        with common.poisoned_empty():
            out = case.call(impl, op, cfg, case.operands())()
        row["rel_err"] = common.rel_err(out, p.ref(op))
        row["ok"] = bool(row["rel_err"] <= common.tolerance(p.dtype))
        if cpu or not isinstance(cfg, StreamConfig) or attempt:
            break
        info = kernel_info(before)
        row.update(info)
        key = _kernel_key(op, p.bs, cfg)
        if info:
            _RESIDENT[key] = resident(info, cfg.num_warps)
        fit = _RESIDENT.get(key)
        if not (fit and cfg.PER_SM > fit):
            break
        cfg = replace(cfg, PER_SM=fit)
        row.update(case.detail(impl, op, cfg), per_sm_asked=row["config"]["PER_SM"])
    return row, cfg


def measure(todo, save, rounds, cpu, hbm_gbs):
    rows = []
    sms = 2 if cpu else torch.cuda.get_device_properties(0).multi_processor_count
    device = "cpu" if cpu else "cuda"
    for n, bs, d, op in todo:
        t_problem = time.time()
        try:
            case = Case(n, bs, d, device, sms)
        except Exception as exc:
            rows.append(dict(N=n, bs=bs, density=d, op=op, impl="setup", error=repr(exc)[:300]))
            save(rows)
            continue
        p = case.p
        checked = {}
        for impl, cfg in impls(n, bs, op, cpu):
            row = dict(N=n, bs=bs, density=d, real_density=round(p.density, 4), op=op, impl=impl, C=C, K=K)
            try:
                fields, cfg = check(case, impl, op, cfg, cpu)
                row.update(fields)
            except Exception as exc:  # recorded, never hidden; the sweep goes on
                row["error"] = repr(exc)[:300]
                if not cpu:
                    torch.cuda.synchronize()
            checked[impl] = (row, cfg)
        p._refs.clear()

        operand_bytes = sum(t.numel() * t.element_size() for t in (p.x, p.w, p.dy))
        timers = {}
        for impl, (row, cfg) in checked.items():
            if "error" in row:
                continue
            extra = C * K * p.x.element_size() if impl == "dense" else 0
            try:
                build = (lambda copy, impl=impl, cfg=cfg: case.call(impl, op, cfg, case.operands(copy)))
                timers[impl] = (WallTimer if cpu else bsmm.Timer)(n, build, operand_bytes + extra)
            except Exception as exc:
                row["error"] = repr(exc)[:300]
                if not cpu:
                    torch.cuda.synchronize()
        try:
            medians = bsmm.interleaved(timers, 1 if cpu else rounds)
        except Exception as exc:
            medians = {}
            for row, _ in checked.values():
                row.setdefault("error", repr(exc)[:300])
        dense_ms = medians.get("dense", (None,))[0]
        current_ms = medians.get("current", (None,))[0]
        for impl, (row, _) in checked.items():
            if impl in medians and dense_ms:
                ms, spread, _ = medians[impl]
                flops = 2.0 * n * C * K if impl == "dense" else p.useful_flops
                row.update(ms=ms, spread=spread, timer=timers[impl].kind, dense_ms=dense_ms,
                           frac_of_dense=(flops / ms) / (2.0 * n * C * K / dense_ms))
                if current_ms:
                    row["vs_current"] = current_ms / ms
                if n == SMALL and impl != "dense" and hbm_gbs:
                    row["hbm_frac"] = bsmm.bytes_moved(p, op) / ms / 1e6 / hbm_gbs
            rows.append(row)
            print(json.dumps(row), flush=True)
        del case, timers
        if not cpu:
            torch.cuda.empty_cache()
        save(rows)
        print(f"# {op} N={n} bs={bs} d={d}: {time.time() - t_problem:.1f}s", flush=True)
    return rows


def markdown(meta, rows):
    """Per (op, N): implementations x problems; cells frac_of_dense (hbm_frac) and speed over current."""
    out = [f"# Sweep 5 on {meta['device']}", "",
           f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; C = K = {C}, bf16.  Cell: "
           "fraction of dense cuBLAS (useful TFLOP/s; N = 64 also the fraction of HBM bandwidth), then "
           "the speed over the current kernel measured in the same interleaved rounds.  `!` inaccurate "
           "against float64, `err` failed (see the JSON).  Produced by `bench/tune_bsmm2.py`.", ""]
    groups = {}
    for r in rows:
        groups.setdefault((r["op"], r["N"]), []).append(r)
    for (op, n), rs in groups.items():
        probs = sorted({(r["bs"], r["density"]) for r in rs})
        names = list(dict.fromkeys(r["impl"] for r in rs if r["impl"] != "setup"))
        index = {(r["impl"], r["bs"], r["density"]): r for r in rs}
        out += [f"## {op}, N = {n}", "", "| impl | " + " | ".join(f"bs{b} d{d}" for b, d in probs) + " |",
                "|---|" + "---|" * len(probs)]
        for name in names:
            cells = []
            for b, d in probs:
                r = index.get((name, b, d))
                if r is None:
                    cells.append("")
                elif "ms" not in r:
                    cells.append("err")
                else:
                    hbm = f" ({r['hbm_frac']:.2f} hbm)" if "hbm_frac" in r else ""
                    vs = f" {r['vs_current']:.2f}x" if name not in ("dense", "current") and "vs_current" in r else ""
                    bad = "" if r.get("ok", True) else "!"
                    cells.append(f"{r['frac_of_dense']:.2f}{hbm}{vs}{bad}")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="5 problems")
    ap.add_argument("--cpu", action="store_true", help="Triton's interpreter on tiny shapes (checks the script)")
    ap.add_argument("--workers", type=int, default=12, help="compile warm-up processes")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per problem")
    args = ap.parse_args()
    global C, K, BIG, SMALL
    if args.cpu:
        C = K = bsmm.C = bsmm.K = 256
        BIG, SMALL = 48, 16
    todo = problems(args.quick)
    t0 = time.time()
    if not args.cpu:
        common.warm_in_workers(_warm, todo, args.workers)
    import triton
    meta = dict(device="cpu (interpreter)" if args.cpu else torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"), C=C, K=K, rounds=args.rounds,
                hbm_gbs=None if args.cpu else common.hbm_bandwidth_gbs(),
                l2_gbs=None if args.cpu else common.l2_bandwidth_gbs())
    save = common.result_writer(args.out, "tune2", meta, markdown)
    rows = measure(todo, save, args.rounds, args.cpu, meta["hbm_gbs"])
    print(markdown(meta, rows))
    bad = [r for r in rows if r["impl"] != "dense" and not r.get("ok")]
    print(f"{len(rows)} rows, {len(bad)} failed or inaccurate; {time.time() - t0:.0f}s")
    for r in bad:
        print("  BAD", json.dumps(r))


if __name__ == "__main__":
    main()
