"""Implicit-GEMM block-sparse convolution vs cuDNN's dense masked convolution and the grouped path.

    python bench/conv_implicit.py --out bench/results            (H200: about 2.5 minutes, 62 rows)
    python bench/conv_implicit.py --out /tmp/ci --quick          (GPU, one row: ~20 s with compiling)
    python bench/conv_implicit.py --out /tmp/ci --quick --cpu    (tiny sizes, Triton's interpreter: checks the script)
    python bench/conv_implicit.py --out bench/results --install  (also writes the suggested rule into the package)
    python bench/conv_implicit.py --out /tmp/ci --shapes 28x28x512-3x3 --dtypes bf16   (a part of a run)

PyTorch, the ResNet-like 2-D layers of ``bench/conv.py`` (N = 32; 56x56x256, 28x28x512,
14x14x1024; 3x3 and 1x1 filters; stride 1 and 2), ``C = K`` in blocks of 32 / 64 / 128 channels
at densities 0.25 and 0.5, "balanced" layouts (every input and every output block column holds
``density * blocks`` blocks, rows shuffled; the one combination without a whole number of blocks,
two 128-channel blocks at density 0.25, is left out).  bf16 on every shape, fp32 (TF32 on both
sides, as cuDNN's default) on the 3x3 stride-1 shapes.  Most of the time goes to compiling and
tuning the kernel (3 configs x tile sizes x dtype x direction) on first use.

* ``implicit``  ``BlocksparseConv(..., path="implicit")`` called as a user does, channels-last
                input: the Triton kernel for the output and the input gradient (launched from the
                kernel library that ``BLOCKSPARSE_KERNELS`` names where it compiles the call, as
                installed wheels do: ``blocksparse/ops/conv/aot.py``), the dense masked cuDNN filter
                gradient; where the library serves both launches, one C++ autograd node runs the call
                (``blocksparse/torch/csrc/conv.cpp``; ``BLOCKSPARSE_TORCH_NATIVE=off``: the Python
                path).  The JSON's ``meta`` says which library served, each row's ``native``
                whether the node ran.
* ``grouped``   the grouped cuDNN path (``path="grouped"``), channels-last input.
* ``dense``     ``F.conv2d`` with a ready dense filter that is zero outside the blocks (cuDNN),
                NCHW and channels-last timed once per shape and dtype; the faster is the baseline.

``fwd`` times the output under ``torch.no_grad()``; ``fwd+bwd`` the output and the gradients of
the input and the filter.  Each path is first checked on the full problem against float64 (outputs
NaN-poisoned; y, dx, dF within the dtype's tolerance); a failed check or an exception marks that
path of the row and the run goes on.  Speedups are the dense baseline's ms / the path's ms (> 1:
faster than cuDNN dense), medians of ``triton.testing.do_bench`` (on the CPU: wall time).
Writes ``conv-implicit-<tag>.json`` after every row and ``conv-implicit-<tag>.md`` at the end,
including the rule table ``IMPLICIT_MAX_DENSITY`` (``blocksparse/ops/conv/implicit.py``) these
numbers suggest: per block width and mode, the largest density up to which the geometric-mean
gain of the implicit path over the faster of the dense and grouped paths (all shapes and dtypes of
that width) is at least ``RULE_MARGIN``.  ``--install`` writes that table into
``blocksparse/ops/conv/implicit.py`` (a full GPU run without failures only).
"""
from __future__ import annotations

import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "--cpu" in sys.argv:  # the kernels on CPU tensors: the interpreter must be on before Triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["BLOCKSPARSE_BACKEND"] = "triton"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402
from conv import (CPU_SHAPES, DENSITIES, DTYPES, SHAPES, _geomean, begin_run, bck_of, only, run_rows,  # noqa: E402
                  timer)

from blocksparse.ops.conv.implicit import IMPLICIT_MAX_DENSITY  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.torch import BlocksparseConv  # noqa: E402
from blocksparse.torch._conv import implicit as implicit_glue  # noqa: E402

BLOCKS, CPU_BLOCKS = (32, 64, 128), (16, 32)
PATHS = ("implicit", "grouped")
#: A density enters the suggested rule table when the path is at least this much faster than dense.
RULE_MARGIN = 1.05


def balanced(CB, density, seed):
    """``(CB, CB)`` 0/1 mask: block (c, k) present when ``(perm[c] + k) % CB < round(density * CB)``,
    so every row and column holds the same number of blocks."""
    per = max(1, round(density * CB))
    perm = np.random.default_rng(seed).permutation(CB)
    return ((perm[:, None] + np.arange(CB)[None, :]) % CB < per).astype(int)


def cases(quick, cpu, only_shapes=None, only_dtypes=None):
    """``(dtype, shape, block size, density)`` of every row (``only_*``: comma-separated names to keep)."""
    if quick:
        return [("fp32", "8x8x64-3x3", 16, 0.25)] if cpu else [("bf16", "28x28x512-3x3", 64, 0.25)]
    shapes, blocks, dtypes = (CPU_SHAPES, CPU_BLOCKS, ("fp32",)) if cpu else (SHAPES, BLOCKS, tuple(DTYPES))
    shapes, dtypes = only(shapes, only_shapes), only(dtypes, only_dtypes)
    rows = []
    for dt in dtypes:
        for shape in shapes:
            if dt == "fp32" and not cpu and not shape.endswith("-3x3"):
                continue
            channels = shapes[shape][2]
            # whole numbers of blocks per column only (2 blocks of 128 channels have no density 0.25)
            rows += [(dt, shape, bs, d) for bs in blocks for d in DENSITIES if (channels // bs * d).is_integer()]
    return rows


class Case:
    """One layer: the ops per path, random operands, float64 references."""

    def __init__(self, dt, shape, bs, density, device, seed):
        N, HW, C, RS, stride = (CPU_SHAPES if device == "cpu" else SHAPES)[shape]
        self.dtype, self.stride, self.pad = DTYPES[dt], stride, RS // 2
        self.mask, self.bs = balanced(C // bs, density, seed), bs
        bck = bck_of(self.mask, bs)
        self.ops = {path: BlocksparseConv(bck, (RS, RS), (HW, HW), strides=stride, path=path) for path in PATHS}
        op = self.ops["implicit"]
        self.density = op.density
        g = torch.Generator(device="cpu").manual_seed(seed)
        f = torch.randn(op.f_shape(), generator=g) / (C * density * RS * RS) ** 0.5
        self.F = f.to(device, self.dtype).requires_grad_()
        x = torch.randn(N, C, HW, HW, generator=g)
        self.x = x.to(device, self.dtype).to(memory_format=torch.channels_last).requires_grad_()
        self.dy = torch.randn(op.o_shape(N), generator=g).to(device, self.dtype)
        self.dy = self.dy.to(memory_format=torch.channels_last)

    def dense_filter(self, F_value, dtype):
        """``(K, C, R, S)``, zero outside the blocks (built from the mask, not by the library)."""
        bs, CB = self.bs, self.mask.shape[0]
        w = torch.zeros(CB * bs, CB * bs, *F_value.shape[-2:], dtype=dtype, device=F_value.device)
        for b, (k, c) in enumerate((k, c) for k in range(CB) for c in np.flatnonzero(self.mask[:, k])):
            w[k * bs:(k + 1) * bs, c * bs:(c + 1) * bs] = F_value[b].to(dtype)
        return w

    def references(self):
        x64 = self.x.detach().double().requires_grad_()
        F64 = self.F.detach().double().requires_grad_()
        y64 = F.conv2d(x64, self.dense_filter(F64, torch.float64), stride=self.stride, padding=self.pad)
        return [y64.detach(), *torch.autograd.grad(y64, [x64, F64], self.dy.double())]

    def check(self, path, refs):
        """Largest relative error of y, dx, dF; raises past the dtype's tolerance."""
        with poisoned_empty():
            y = self.ops[path](self.F, self.x)
            got = [y, *torch.autograd.grad(y, [self.x, self.F], self.dy)]
        errs = [rel_error(g, r) for g, r in zip(got, refs)]
        bound = tolerance(self.dtype, tf32=self.dtype == torch.float32 and torch.backends.cudnn.allow_tf32)
        if max(errs) > bound:
            raise AssertionError(f"relative errors y/dx/dF {[f'{e:.1e}' for e in errs]} > {bound}")
        return max(errs)

    def run(self, path, backward):
        op = self.ops[path]
        if not backward:
            def fwd():
                with torch.no_grad():
                    op(self.F, self.x)
            return fwd
        return lambda: torch.autograd.grad(op(self.F, self.x), [self.x, self.F], self.dy)


def dense_run(case, channels_last, backward):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    W = case.dense_filter(case.F.detach(), case.dtype).contiguous(memory_format=fmt).requires_grad_()
    x = case.x.detach().contiguous(memory_format=fmt).requires_grad_()
    dy = case.dy.contiguous(memory_format=fmt)
    if not backward:
        def fwd():
            with torch.no_grad():
                F.conv2d(x, W, stride=case.stride, padding=case.pad)
        return fwd
    return lambda: torch.autograd.grad(F.conv2d(x, W, stride=case.stride, padding=case.pad), [x, W], dy)


def _gain(row, mode):
    """How much faster the implicit path ran than the faster of the dense and grouped paths."""
    best = row[f"dense_{mode}_ms"]
    if "error" not in row["grouped"]:
        best = min(best, row["grouped"][f"{mode}_ms"])
    return best / row["implicit"][f"{mode}_ms"]


def suggested_rule(rows):
    """``IMPLICIT_MAX_DENSITY`` as the rows suggest (keys of the shipped table; see the module): per
    width and mode, the densities up to the first whose geometric-mean gain over the faster other
    path falls below ``RULE_MARGIN``."""
    table = {}
    for width, mode in IMPLICIT_MAX_DENSITY:
        table[(width, mode)] = 0.0
        for d in sorted(DENSITIES):
            sel = [_gain(r, mode) for r in rows
                   if r["bs"] == width and r["density"] == d and "speedup_fwd" in r.get("implicit", {})]
            if not sel or _geomean(sel) < RULE_MARGIN:
                break
            table[(width, mode)] = d
    return table


def rule_source(table):
    """The Python source of ``IMPLICIT_MAX_DENSITY = {...}`` for ``table``, one width a line."""
    widths = sorted({w for w, _ in table})
    lines = [f"    ({w}, \"fwd\"): {table[(w, 'fwd')]}, ({w}, \"fwd+bwd\"): {table[(w, 'fwd+bwd')]}," for w in widths]
    return "IMPLICIT_MAX_DENSITY = {\n" + "\n".join(lines) + "\n}"


def markdown(rows, meta):
    lines = [f"# Implicit-GEMM block-sparse convolution vs dense masked cuDNN ({meta['device']})", "",
             f"torch {meta['torch']}, {meta['when']}; N x C x H x W, C = K, balanced layouts, channels-last data "
             "for ours; ms = median; speedup = dense baseline ms / path ms (> 1: faster than cuDNN dense); "
             f"kernel library: {(meta.get('kernels') or {}).get('library') or 'none'} (the implicit rows' launches "
             "of the output / the input gradient in brackets: `aot` from it, `jit` through Triton's JIT, `dense` "
             "the dense convolution's (strided layers' input gradient); `native` where "
             "the C++ autograd node ran them, `python` where the Python autograd function did).", ""]
    lines += ["Geometric-mean speedup over dense, fwd / fwd+bwd (rows):", "",
              "| dtype | bs | path | " + " | ".join(f"density {d}" for d in DENSITIES) + " |",
              "|---|---|---|" + "---|" * len(DENSITIES)]
    for dt in DTYPES:
        for bs in sorted({r["bs"] for r in rows}):
            for path in PATHS:
                cells = []
                for d in DENSITIES:
                    sel = [r[path] for r in rows if (r["dtype"], r["bs"], r["density"]) == (dt, bs, d)
                           and "speedup_fwd" in r.get(path, {})]
                    cells.append(f"{_geomean([s['speedup_fwd'] for s in sel]):.2f} / "
                                 f"{_geomean([s['speedup_fwd+bwd'] for s in sel]):.2f} ({len(sel)})" if sel else "")
                if any(cells):
                    lines.append(f"| {dt} | {bs} | {path} | " + " | ".join(cells) + " |")
    rule = suggested_rule(rows)
    lines += ["", f"Suggested `IMPLICIT_MAX_DENSITY` (margin {RULE_MARGIN}; `--install` writes it):", "",
              "```python", rule_source(rule), "```", "",
              "| dtype | shape | bs | density | dense fwd / fwd+bwd ms (format) | "
              + " | ".join(f"{p} fwd / fwd+bwd ms (speedup) | {p} err" for p in PATHS) + " |",
              "|---|---|---|---|---|" + "---|---|" * len(PATHS)]
    for r in rows:
        head = f"| {r['dtype']} | {r['shape']} | {r['bs']} | {r['density']} |"
        if "error" in r:
            lines.append(f"{head} FAILED: {r['error'][:100]} |" + " | |" * len(PATHS))
            continue
        cells = [f"{r['dense_fwd_ms']:.3f} / {r['dense_fwd+bwd_ms']:.3f} ({r['dense_format']})"]
        for path in PATHS:
            p = r[path]
            if "error" in p:
                cells += [f"FAILED: {p['error'][:80]}", ""]
            else:
                launch = f" [{p['launch']}{', ' + p['native'] if p.get('native') else ''}]" if "launch" in p else ""
                cells += [f"{p['fwd_ms']:.3f} / {p['fwd+bwd_ms']:.3f} ({p['speedup_fwd']:.2f} / "
                          f"{p['speedup_fwd+bwd']:.2f}){launch}", f"{p['max_rel_err']:.1e}"]
        lines.append(f"{head} " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def measure(case, ms, dense_ms, key):
    """One row's numbers: the dense baseline (cached per shape and dtype), then each path."""
    if key not in dense_ms:  # the dense convolution's time does not depend on the mask
        dense_ms[key] = {f"{fmt} {mode}": ms(dense_run(case, fmt == "channels_last", mode == "fwd+bwd"))
                         for fmt in ("NCHW", "channels_last") for mode in ("fwd", "fwd+bwd")}
    t = dense_ms[key]
    fmt = min(("NCHW", "channels_last"), key=lambda f: t[f"{f} fwd"] + t[f"{f} fwd+bwd"])
    row = {"dense_format": fmt, "dense_fwd_ms": t[f"{fmt} fwd"], "dense_fwd+bwd_ms": t[f"{fmt} fwd+bwd"]}
    refs = case.references()
    for path in PATHS:
        try:
            result = {"max_rel_err": case.check(path, refs)}
            for mode in ("fwd", "fwd+bwd"):
                result[f"{mode}_ms"] = ms(case.run(path, mode == "fwd+bwd"))
                result[f"speedup_{mode}"] = row[f"dense_{mode}_ms"] / result[f"{mode}_ms"]
            if path == "implicit":  # which launches served the output and the input gradient, and whether
                tables = case.ops[path]._tables.on(case.x.device)  # the native node ran them
                result["launch"] = "/".join(implicit_glue.launch_path(tables, t) or "dense" for t in (False, True))
                result["native"] = implicit_glue.native_path(tables)
        except Exception as exc:  # keep going: the cell says what failed
            result = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        row[path] = result
    return row


def main(argv=None):
    args, device, meta, path_json = begin_run(__doc__, "conv-implicit", argv, "one row (a smoke run)",
                                              "tiny sizes on the CPU through Triton's interpreter",
                                              install="write the suggested rule into blocksparse/ops/conv/implicit.py")
    ms = timer(device)
    dense_ms, started = {}, time.time()

    def measure_row(seed, row):
        case = Case(row["dtype"], row["shape"], row["bs"], row["density"], device, seed)
        return dict(density_actual=case.density, **measure(case, ms, dense_ms, f"{row['dtype']} {row['shape']}"))

    names = ("dtype", "shape", "bs", "density")
    rows = run_rows([dict(zip(names, c)) for c in cases(args.quick, args.cpu, args.shapes, args.dtypes)], measure_row, path_json, meta,
                    dense_ms, device)
    with open(path_json[:-len(".json")] + ".md", "w") as f:
        f.write(markdown(rows, meta))
    failed = sum("error" in r or any("error" in r.get(p, {}) for p in PATHS) for r in rows)
    print(f"{len(rows)} rows, {failed} with failures, {time.time() - started:.0f} s -> {path_json}")
    if args.install:
        if failed or args.quick or args.cpu:
            print("--install: not installed (a full GPU run without failures only)")
            return 1
        target = common.package_file("ops", "conv", "implicit.py")
        common.install_literal(target, "IMPLICIT_MAX_DENSITY", rule_source(suggested_rule(rows)))
        print(f"--install: wrote the suggested IMPLICIT_MAX_DENSITY into {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
