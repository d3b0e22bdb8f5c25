#!/usr/bin/env python3
"""Verify the ahead-of-time matmul kernels on a GPU, in one run, through both callers.

    python scripts/verify_aot.py --out DIR [--archs sm_80,sm_90,compute_80] [--dtypes bf16] [--block-sizes 32]
                                 [--match _pack] [--jobs N] [--dry-run]

Compiles every matmul spec (``configs.aot_specializations``) for the archs, generates the C
launchers and builds them with the kernel runtime into a kernel library (system C compiler), loads
it with ctypes, and runs every spec this GPU can run -- cubins of its arch, and the PTX of
``compute_XY`` targets, which the driver JIT-compiles here as on any later GPU -- on PyTorch CUDA
tensors twice: through the
PyTorch launch layer (the launch a plan describes, packed into ``bsk_arg`` and launched by
``bsk_launch``) and through ``bsk_matmul_run_spec`` (the matmul C the TensorFlow ops call).  Both
outputs are compared with the JIT kernel (the same launch through Triton) and with a float64
reference.  Then ``bsk_matmul_run`` -- which picks the kernel and the updat split itself -- is
checked once per product, dtype, block size and axis.  Needs torch, triton and a C compiler; no
TensorFlow.  Writes ``DIR/aot-verify.json`` and ``DIR/aot-verify.md``; exits 1 if any check
failed.

``--dry-run`` (any machine, no GPU): compiles, generates, builds and loads everything, checks the
library's manifest, kernel selection and that every spec packs the launch a PyTorch plan
describes; launches nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from blocksparse.ops.matmul import configs  # noqa: E402
from blocksparse.aot import DEFAULT_ARCHS, build_sources, parse_archs, parse_filters  # noqa: E402
from blocksparse.aot.abi import KernelLibrary  # noqa: E402
from blocksparse.aot.native import build_kernel_library  # noqa: E402
from blocksparse.ops.matmul.refine import refine  # noqa: E402
from blocksparse.ops.matmul.capi import DTYPES, PRODUCTS, MatmulCall, MatmulRuntime  # noqa: E402
from blocksparse.layout import Layout  # noqa: E402
from blocksparse.testing import TOLERANCE  # noqa: E402
from blocksparse.testing.matmul import dense_products  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402

TOL_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
LARGE_N = 1000   # tokens of the main case (a multiple of 8: (F, N) rows stay 16-byte aligned)


def spec_layout(rng, spec, c_features, k_features, density, **kw):
    """A random layout for ``spec`` of about ``c_features`` x ``k_features``: of its block size, or
    for a ``pack`` ``p`` spec the packed refinement of a layout of blocks ``p`` times larger (the
    weight stored as those larger blocks, as :class:`~blocksparse.torch.PixelflyLinear` keeps it)."""
    bs, p = spec["block_size"], spec.get("pack", 1)
    coarse = Layout(random_layout(rng, max(3, c_features // (bs * p)), max(3, k_features // (bs * p)), density, **kw),
                    bs * p, any_block_size=p > 1)
    return coarse if p == 1 else refine(coarse, bs, packed=True).layout


def _rel(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        return math.inf
    if not np.all(np.isfinite(out)):
        return math.nan
    scale = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (scale if scale > 0 else 1.0))


class Problem:
    """Random inputs of one layout, dtype and activation layout, and their float64 products."""

    def __init__(self, torch, rng, layout, dtype, axis, n, device="cuda"):
        self.torch, self.layout, self.axis, self.n, self.device = torch, layout, axis, n, device
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        to = lambda a: torch.from_numpy(a).to(self.dtype).to(device)  # noqa: E731
        self.x = to(rng.standard_normal(self.shape(layout.C)))
        self.w = to(rng.standard_normal(layout.w_shape) / np.sqrt(layout.block_size))
        self.dy = to(rng.standard_normal(self.shape(layout.K)))
        self.refs = dict(zip(("fprop", "bprop", "updat"), dense_products(
            layout, *(t.double().cpu().numpy() for t in (self.x, self.w, self.dy)), axis)))

    def shape(self, features):
        return (self.n, features) if self.axis == 1 else (features, self.n)

    def table(self, array):
        return self.torch.from_numpy(np.array(array, dtype=np.int32)).to(self.device)  # a writable copy

    def tables(self, product, group, split=False):
        """The spec's tables; split xprop reductions (atomics or tickets) walk segments of 2 blocks."""
        if product == "updat":
            return (self.table(self.layout.updat_groups(group)),)
        lut = getattr(self.layout, product)(2 if split else None, group=group)
        return self.table(lut.headers), self.table(lut.entries), self.table(lut.offsets)

    def output(self, product, atomic=False, dw16=False):
        """A NaN-filled output (a tile never written shows up); split xprop reductions add into
        float32 zeros; dW is float32 except from a ``dw16`` or ticket updat (the activations' dtype)."""
        torch = self.torch
        if product == "updat":
            return torch.full(self.layout.w_shape, math.nan, dtype=self.dtype if dw16 else torch.float32,
                              device=self.device)
        features = self.layout.K if product == "fprop" else self.layout.C
        if atomic:
            return torch.zeros(self.shape(features), dtype=torch.float32, device=self.device)
        return torch.full(self.shape(features), math.nan, dtype=self.dtype, device=self.device)

    def call(self, spec, out, tables, split):
        lay = self.layout
        c = MatmulCall(product=PRODUCTS[spec["product"]], dtype=DTYPES[spec["dtype"]],
                    block_size=lay.block_size, axis=self.axis, group=spec["group"], split=split,
                    n_tokens=self.n, c_blocks=lay.CB, k_blocks=lay.KB, blocks=lay.blocks,
                    table_rows=tables[0].shape[0])
        p = lambda t: t.data_ptr()  # noqa: E731
        if spec["product"] == "fprop":
            c.x, c.w, c.y, c.headers, c.entries = p(self.x), p(self.w), p(out), *map(p, tables[:2])
        elif spec["product"] == "bprop":
            c.dy, c.w, c.dx, c.headers, c.entries = p(self.dy), p(self.bprop_weight(spec)), p(out), \
                *map(p, tables[:2])
        else:
            c.x, c.dy, c.dw, c.groups = p(self.x), p(self.dy), p(out), p(tables[0])
        return c

    def bprop_weight(self, spec):
        """The weight as a bprop kernel reads it: blocks transposed where ``trans_w`` is false."""
        if spec["trans_w"]:
            return self.w
        if not hasattr(self, "_w_t"):
            from blocksparse.torch._matmul.launch import transpose_blocks

            self._w_t = transpose_blocks(self.w, self.layout.packing)
        return self._w_t

    def operands(self, spec):
        """(input, weight or dy) of the spec's product."""
        if spec["product"] == "fprop":
            return self.x, self.w
        if spec["product"] == "bprop":
            return self.dy, self.bprop_weight(spec)
        return self.x, self.dy

    def launch(self, spec, tables, split):
        """The launch a PyTorch plan describes for this spec's kernel and tile."""
        from blocksparse.torch._matmul import launch as _launches

        lay, bs = self.layout, self.layout.block_size
        a, b = self.operands(spec)
        variant = "tma" if spec["tma"] else "ptr"
        ticket = bool(spec.get("ticket"))
        if spec["product"] == "updat":
            return _launches.updat_launch(variant, tuple(a.shape), a.stride(), tuple(b.shape), b.stride(),
                                          self.dtype, tables[0], bs=bs, axis=self.axis,
                                          cfg=configs.UpdatConfig(**spec["config"]), split=split,
                                          precision="ieee", ticket=ticket,
                                          dw_dtype=self.dtype if spec.get("dw16") or ticket else self.torch.float32,
                                          pack=lay.packing)
        return _launches.xprop_launch(variant, tuple(a.shape), a.stride(), self.dtype, *tables[:2],
                                      blocks=lay.blocks, out_features=lay.K if spec["product"] == "fprop" else lay.C,
                                      bs=bs, axis=self.axis, trans=spec["trans_w"],
                                      cfg=configs.XpropConfig(**spec["config"]), atomic=spec["atomic"],
                                      precision="ieee", offsets=tables[2] if ticket else None, pack=lay.packing)

    def run(self, runner, spec, split):
        """``runner`` (an AotLaunch or JitLaunch) on fresh buffers: NaN-filled, zeros for atomics;
        a ticket spec also gets its zeroed scratch."""
        from blocksparse.torch import _scratch
        from blocksparse.torch._matmul import launch as _launches

        out = self.output(spec["product"], spec["atomic"], spec.get("dw16", False) or spec.get("ticket", False))
        if (spec["product"] == "updat" and self.n == 0) or spec["atomic"]:  # as a plan zero-fills
            out.zero_()
        operands = (*self.operands(spec), out)
        if spec.get("ticket"):
            lay, bs = self.layout, self.layout.block_size
            if spec["product"] == "updat":
                sizes = _launches.updat_scratch(lay.blocks, bs, len(lay.updat_groups(spec["group"])),
                                                configs.UpdatConfig(**spec["config"]))
            else:
                sizes = _launches.xprop_scratch(self.n, lay.K if spec["product"] == "fprop" else lay.C, bs,
                                                configs.XpropConfig(**spec["config"]), spec["tma"])
            operands += (operands[0], *_scratch.scratch(self.device, *sizes))
        runner(operands)
        return out


def _time_us(torch, fn, repeats=20):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return float(np.median(times))


def _main_n(spec):
    """The token count a spec is timed at: :data:`LARGE_N` (the next multiple of 16 for an ``n16``
    kernel), or 64 for the few-token tiles."""
    return 64 if spec.get("max_tokens") else -(-LARGE_N // 16) * 16 if spec.get("n16") else LARGE_N


def _token_counts(spec):
    """(N, compare with the JIT kernel?): one token, a ragged count, the main case, none."""
    if spec.get("n16"):  # compiled for multiples of 16 tokens
        return [(16, False), (96, True), (_main_n(spec), True), (0, False)]
    aligned = spec["axis"] == 0 and "_tma" in spec["kernel"]
    return [(8 if aligned else 1, False), (88 if aligned else 77, True), (_main_n(spec), True), (0, False)]


def _probe_n(spec):
    """Tokens of the checks without a GPU: 64 where the kernel needs aligned (F, N) rows or multiples
    of 16 tokens, else 13 (unaligned: where the general pointer kernels serve)."""
    return 64 if "_tma" in spec["kernel"] or spec.get("n16") else 13


def check_spec(torch, lib, index, spec, rng):
    """Every case of one spec through both callers; returns its record."""
    from blocksparse.torch._launch import AotLaunch, JitLaunch

    mm = MatmulRuntime(lib)
    record = {k: spec[k] for k in ("name", "arch", "target", "product", "dtype", "block_size", "axis",
                                   "kernel", "atomic", "group", "max_tokens", "n16", "dw16")}
    lay = spec_layout(rng, spec, 512, 384, 0.4, empty_rows=1, empty_cols=1)
    # a ticket spec (split reductions finished in the kernel) and a packed one (weights stored as
    # larger blocks) are the PyTorch plans' alone: the op library's C must refuse them (no scratch
    # there; its weights are plain blocks), and a plan never launches them without tokens
    ticket = bool(spec.get("ticket"))
    torch_only = ticket or spec.get("pack", 1) > 1
    record["ticket"], record["pack"] = ticket, spec.get("pack", 1)
    split = 3 if spec["atomic"] or ticket else 1
    tol = TOLERANCE[TOL_NAMES[spec["dtype"]]]
    stream = torch.cuda.current_stream().cuda_stream
    cases, ok = [], True
    for n, compare_jit in _token_counts(spec):
        if torch_only and not n:
            continue
        prob = Problem(torch, rng, lay, spec["dtype"], spec["axis"], n)
        tables = prob.tables(spec["product"], spec["group"], spec["atomic"] or ticket)
        out = prob.output(spec["product"], spec["atomic"], spec.get("dw16", False) or ticket)
        call = prob.call(spec, out, tables, split)
        case = {"n": n, "split": split}
        try:
            first = not cases
            start = time.perf_counter()
            if torch_only:
                try:
                    mm.run_spec(index, call, stream)
                    case["c_refused"] = False
                except Exception:  # noqa: BLE001 -- what must happen
                    case["c_refused"] = True
            else:
                mm.run_spec(index, call, stream)
            if first:  # loads the module: for PTX, the driver's JIT compile (or its disk cache)
                torch.cuda.synchronize()
                record["first_call_ms"] = 1e3 * (time.perf_counter() - start)
            via_torch = out  # zero tokens: a PyTorch plan launches nothing (its runner is None)
            if n:
                launch = prob.launch(spec, tables, split)
                torch_aot, torch_jit = AotLaunch(launch, lib, index, torch.cuda.current_device()), JitLaunch(launch)
                via_torch = prob.run(torch_aot, spec, split)
            if torch_only:
                out = via_torch
            torch.cuda.synchronize()
            ref = prob.refs[spec["product"]]
            case["rel_err_ref"] = _rel(out.double().cpu().numpy(), ref)
            case["rel_err_ref_torch"] = _rel(via_torch.double().cpu().numpy(), ref)
            if compare_jit:
                jit = prob.run(torch_jit, spec, split)
                torch.cuda.synchronize()
                case["rel_err_jit"] = _rel(out.double().cpu().numpy(), jit.double().cpu().numpy())
                case["bitwise_equal_jit"] = bool(torch.equal(out, jit))
                case["bitwise_equal_jit_torch"] = bool(torch.equal(via_torch, jit))
            if n == _main_n(spec):
                if not torch_only:
                    case["aot_us"] = _time_us(torch, lambda: mm.run_spec(index, call, stream))
                case["aot_torch_us"] = _time_us(torch, lambda: prob.run(torch_aot, spec, split))
                case["jit_us"] = _time_us(torch, lambda: prob.run(torch_jit, spec, split))
            good = (case["rel_err_ref"] < tol and case["rel_err_ref_torch"] < tol
                    and case.get("rel_err_jit", 0.0) < tol and case.get("c_refused", True))
        except Exception as exc:  # a launch failure is a result, not the end of the run
            case["error"] = f"{type(exc).__name__}: {exc}"
            good = False
        case["passed"] = bool(good)
        ok &= good
        cases.append(case)
    record["cases"] = cases
    record["status"] = "passed" if ok else "failed"
    return record


def check_dispatch(torch, lib, arch, rng):
    """``bsk_matmul_run`` (kernel and split chosen by the runtime) once per product family."""
    mm = MatmulRuntime(lib)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # the TensorFlow ops' tables: the groups of the many-token kernels the runtime ranks best here
    # (a cubin over PTX; few-token specs reading them serve few tokens)
    ranked = [((s["product"], s["dtype"], s["block_size"], s["axis"]), s["group"], lib.rank(i, arch))
              for i, s in enumerate(lib.specs) if not s.get("max_tokens")]
    top = {}
    for key, _, rank in ranked:
        top[key] = max(top.get(key, 0), rank)
    keys = sorted({(*key, group) for key, group, rank in ranked if rank and rank == top[key]})
    stream = torch.cuda.current_stream().cuda_stream
    records = []
    for product, dtype, bs, axis, group in keys:
        lay = Layout(random_layout(rng, max(2, 512 // bs), max(2, 384 // bs), 0.5), bs)
        for n in ((LARGE_N, 64, 13) if axis == 0 else (LARGE_N, 64)):
            prob = Problem(torch, rng, lay, dtype, axis, n)
            trans_w = next(s["trans_w"] for s in lib.specs if (s["product"], s["dtype"]) == (product, dtype))
            spec = {"product": product, "dtype": dtype, "group": group, "trans_w": trans_w}
            tables = prob.tables(product, group)
            out = prob.output(product)
            call = prob.call(spec, out, tables, split=0)
            record = {"product": product, "dtype": dtype, "block_size": bs, "axis": axis, "n": n}
            index = mm.select(call, arch, False)
            if product == "updat" and index >= 0:
                cfg = configs.UpdatConfig(**lib.specs[index]["config"])
                record["split"] = configs.updat_split(cfg, n, tables[0].shape[0], sms)
                if record["split"] > 1:
                    index = mm.select(call, arch, True)
            record["kernel"] = f"{lib.specs[index]['name']} ({lib.specs[index]['target']})" if index >= 0 else None
            try:
                mm.run(call, stream)
                torch.cuda.synchronize()
                record["rel_err_ref"] = _rel(out.double().cpu().numpy(), prob.refs[product])
                record["passed"] = record["rel_err_ref"] < TOLERANCE[TOL_NAMES[dtype]]
            except Exception as exc:
                record["error"] = f"{type(exc).__name__}: {exc}"
                record["passed"] = False
            records.append(record)
    return records


def check_packing(torch, lib, rng):
    """Without a GPU: the launch a PyTorch plan describes for each spec packs into that spec's
    arguments (no mismatch of kernel, constexprs, kinds, dtypes, alignment or boxes), so the
    PyTorch frontend can launch every compiled kernel.  Names the specs that cannot."""
    from blocksparse.torch._launch import AotLaunch, Mismatch

    problems = []
    for index, spec in enumerate(lib.specs):
        lay = spec_layout(rng, spec, 256, 128, 0.5)
        prob = Problem(torch, rng, lay, spec["dtype"], spec["axis"], _probe_n(spec), device="cpu")
        try:
            splits = spec["atomic"] or spec.get("ticket", False)
            tables = prob.tables(spec["product"], spec["group"], splits)
            AotLaunch(prob.launch(spec, tables, 3 if splits else 1), lib, index, -1)
        except Mismatch as exc:
            problems.append(f"{spec['name']}: {exc}")
    return problems


#: A GPU newer than any compiled cubin: only PTX serves it.
FUTURE_ARCH = 130


def check_selection(lib):
    """Pure checks of the library without a GPU: each arch's cubins are found by
    bsk_matmul_select (few-token specs for few tokens, the others past them), and the PTX on a GPU
    no cubin serves; a ``dw16`` updat, a ``ticket`` or a ``pack`` spec (the PyTorch plans') never: its
    float32 / atomic / plain-block twin is."""
    mm = MatmulRuntime(lib)
    problems = []
    where = {(s["name"], s["target"]): i for i, s in enumerate(lib.specs)}
    for index, spec in enumerate(lib.specs):
        atomic, name = spec["atomic"], spec["name"].replace("_dw16", "").replace(f"_pack{spec.get('pack', 1)}", "")
        if spec.get("ticket"):  # the twin: the same kernel and tile with float32 atomics
            atomic, name = True, name.replace("_ticket", "").replace(f"_{spec['kernel'].removesuffix('_kernel')}",
                                                                    f"_{spec['kernel'].removesuffix('_kernel')}_atomic", 1)
        want = where.get((name, spec["target"])) if name != spec["name"] else index
        n = _probe_n(spec) + (0 if spec.get("max_tokens") else configs.SMALL_N)
        call = MatmulCall(product=PRODUCTS[spec["product"]], dtype=DTYPES[spec["dtype"]],
                          block_size=spec["block_size"], axis=spec["axis"], group=spec["group"],
                          n_tokens=n, c_blocks=4, k_blocks=4, blocks=4, table_rows=4)
        arch = FUTURE_ARCH if spec["image"] == "ptx" else spec["arch"]
        if mm.select(call, arch, atomic) != want:
            problems.append(f"{spec['name']} ({spec['target']})")
    return problems


def _markdown(result):
    lines = ["# Ahead-of-time kernels: verification", ""]
    env = result["environment"]
    lines += [f"- GPU: {result['gpu'] or 'none (dry run)'}", f"- torch {env['torch']}, triton "
              f"{env['triton']}, CUDA headers {env['cuda_headers']}, Python {env['python']}",
              f"- compiled {len(result['kernels'])} kernels for {', '.join(result['archs'])}: "
              f"{result['build']['cubin_bytes'] / 2**20:.1f} MiB of cubins and PTX, library "
              f"{result['build']['library_bytes'] / 2**20:.1f} MiB, {result['build']['seconds']:.0f} s",
              f"- summary: {json.dumps(result['summary'])}", ""]
    if result["dry_run"]:
        lines += ["This was a dry run: everything compiled and loaded, nothing launched.", ""]
        return "\n".join(lines)
    lines += ["Each runnable kernel ran through its generated C launcher at N = 1 (8), 77 (88), 1000 "
              "and 0 tokens on NaN-filled outputs, from the matmul C (`bsk_matmul_run_spec`, the "
              "TensorFlow ops' path) and from the PyTorch launch layer (`bsk_launch` with the "
              "arguments a plan packs; at 0 tokens a plan launches nothing, so the C alone); "
              "error = ||out - ref|| / ||ref|| against float64 and against "
              "the JIT kernel with the same launch (N = 77/88 and 1000); times at N = 1000, median of "
              "20, events around each call (host time included); first call: the first launch, "
              "with the module's load (for PTX: the driver's JIT compile, or its disk cache).", "",
              "| kernel | image | status | max err vs float64 (C / torch) | max err vs JIT | bitwise = JIT | "
              "first call ms | C us | torch AOT us | JIT us |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k in result["kernels"]:
        cases = k.get("cases", [])
        ref = max((c.get("rel_err_ref", math.nan) for c in cases), default=math.nan)
        ref_torch = max((c.get("rel_err_ref_torch", math.nan) for c in cases), default=math.nan)
        jit = max((c["rel_err_jit"] for c in cases if "rel_err_jit" in c), default=math.nan)
        bitwise = all(c.get("bitwise_equal_jit", True) and c.get("bitwise_equal_jit_torch", True)
                      for c in cases) if cases else None
        large = next((c for c in cases if "aot_us" in c), {})
        lines.append(f"| {k['name']} | {k.get('target', '')} | {k['status']} | {ref:.2e} / {ref_torch:.2e} | "
                     f"{jit:.2e} | {bitwise} | {k.get('first_call_ms', math.nan):.1f} | "
                     f"{large.get('aot_us', math.nan):.1f} | {large.get('aot_torch_us', math.nan):.1f} | "
                     f"{large.get('jit_us', math.nan):.1f} |")
    lines += ["", "`bsk_matmul_run` (the TensorFlow ops' entry point: kernel and split chosen by the runtime):",
              "", "| product | dtype | bs | axis | N | split | kernel | err vs float64 | passed |",
              "|---|---|---|---|---|---|---|---|---|"]
    for d in result["dispatch"]:
        lines.append(f"| {d['product']} | {d['dtype']} | {d['block_size']} | {d['axis']} | {d['n']} | "
                     f"{d.get('split', '')} | {d['kernel']} | {d.get('rel_err_ref', math.nan):.2e} | "
                     f"{d['passed']} |")
    return "\n".join(lines) + "\n"


def _write(out, result):
    statuses = [k["status"] for k in result["kernels"]]
    result["summary"] = {s: statuses.count(s) for s in sorted(set(statuses))}
    result["summary"]["dispatch_failed"] = sum(not d["passed"] for d in result["dispatch"])
    result["summary"]["selection_mismatches"] = len(result["selection_mismatches"])
    result["summary"]["packing_mismatches"] = len(result["packing_mismatches"])
    (out / "aot-verify.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "aot-verify.md").write_text(_markdown(result))


def main(argv=None):
    # Triton's CPU interpreter (TRITON_INTERPRET=1, set by the CPU test runs) cannot compile
    # kernels ahead of time: this script always needs the compiler
    os.environ.pop("TRITON_INTERPRET", None)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for aot-verify.json / .md")
    parser.add_argument("--archs", default=",".join(f"sm_{a}" for a in DEFAULT_ARCHS))
    parser.add_argument("--dtypes", help="only these dtypes, e.g. bf16,fp32")
    parser.add_argument("--block-sizes", help="only these block sizes, e.g. 32,64")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the CPUs)")
    parser.add_argument("--dry-run", action="store_true", help="build and load only (no GPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--match", default="", help="run only the specs whose name holds this, e.g. _pack")
    args = parser.parse_args(argv)
    import torch
    import triton

    filters = parse_filters(args.dtypes, args.block_sizes)
    if not args.dry_run and not torch.cuda.is_available():
        print("verify_aot: no CUDA GPU; use --dry-run to build and load only", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    archs = parse_archs(args.archs)
    work = Path(tempfile.mkdtemp(prefix="blocksparse-verify-"))
    start = time.perf_counter()
    source, manifest = build_sources(archs, work / "aot", jobs=args.jobs, families=("matmul",), **filters)
    library = build_kernel_library(source, work / "_kernels.so", jobs=args.jobs)
    lib = KernelLibrary(library)
    build = {"seconds": time.perf_counter() - start, "library_bytes": library.stat().st_size,
             "cubin_bytes": sum(s["cubin_bytes"] for s in lib.specs)}
    print(f"verify_aot: {len(lib.specs)} kernels for {', '.join(manifest['archs'] + manifest['ptx'])} built in "
          f"{build['seconds']:.0f} s", flush=True)
    result = {"dry_run": args.dry_run, "archs": manifest["archs"] + manifest["ptx"], "build": build, "gpu": None,
              "environment": {"torch": torch.__version__, "triton": triton.__version__,
                              "cuda_headers": manifest["cuda"], "python": platform.python_version()},
              "selection_mismatches": check_selection(lib),
              "packing_mismatches": check_packing(torch, lib, np.random.default_rng(args.seed)),
              "kernels": [], "dispatch": []}
    if args.dry_run:
        result["kernels"] = [{**{k: s[k] for k in ("name", "arch", "target", "product", "dtype", "block_size",
                                                    "axis", "kernel", "atomic", "group", "max_tokens", "n16", "dw16")},
                              "status": "compiled", "cubin_bytes": s["cubin_bytes"]} for s in lib.specs]
    else:
        major, minor = torch.cuda.get_device_capability(0)
        arch = 10 * major + minor
        result["gpu"] = f"{torch.cuda.get_device_name(0)} (sm_{arch})"
        rng = np.random.default_rng(args.seed)
        # a stream of its own, as TensorFlow's: the runtime takes the context from the stream
        with torch.cuda.stream(torch.cuda.Stream()):
            for index, spec in enumerate(lib.specs):
                if args.match not in spec["name"]:
                    continue
                if not lib.rank(index, arch):
                    result["kernels"].append({"name": spec["name"], "arch": spec["arch"], "target": spec["target"],
                                              "status": f"not runnable on sm_{arch}"})
                    continue
                record = check_spec(torch, lib, index, spec, rng)
                print(f"  {record['status']:6} {spec['name']}", flush=True)
                result["kernels"].append(record)
                if len(result["kernels"]) % 16 == 0:  # partial results survive a time limit
                    _write(out, result)
            result["dispatch"] = check_dispatch(torch, lib, arch, rng)
    _write(out, result)
    print(f"verify_aot: {json.dumps(result['summary'])} -> {out / 'aot-verify.md'}")
    failed = (result["summary"].get("failed", 0) + result["summary"]["dispatch_failed"]
              + result["summary"]["selection_mismatches"] + result["summary"]["packing_mismatches"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
