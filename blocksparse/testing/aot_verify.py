"""What the GPU checks of a family's compiled kernels through the TensorFlow ops' C share
(``scripts/verify_norms_aot.py``, ``scripts/verify_transformer_aot.py``): their options, the GPU and
targets, building the family's kernel library, one check of an output, the run over the cases and
its reports (``DIR/<stem>.json`` and ``.md``, rewritten after every case).  Imports torch only when
asked for the GPU."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from .numerics import rel_error, tolerance

__all__ = ["TORCH_DTYPES", "Run", "check", "parser"]

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def parser(doc, dtypes="fp16,bf16,fp32"):
    """The options every check takes (a script adds its own): ``--out``, ``--archs``, ``--dtypes``,
    ``--quick``, ``--jobs``, ``--dry-run``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where the results go")
    p.add_argument("--archs", help="GPU architectures (default: this GPU's; dry run: sm_90)")
    p.add_argument("--dtypes", default=dtypes, help="e.g. bf16,fp32")
    p.add_argument("--quick", action="store_true", help="a few cases (a smoke run)")
    p.add_argument("--jobs", type=int, help="parallel compiles (default: the CPUs)")
    p.add_argument("--dry-run", action="store_true", help="build, load and select only (no GPU)")
    return p


def check(name, out, want, dtype):
    """One output against its float64 reference at ``dtype``'s tolerance (a NaN fails)."""
    err = rel_error(out, want)
    return {"output": name, "rel_error": None if not np.isfinite(err) else float(err),
            "ok": bool(np.isfinite(err) and err <= tolerance(TORCH_DTYPES[dtype]))}


class Run:
    """One check's run: ``args`` parsed by :func:`parser`; ``script`` names it in messages, ``stem``
    its reports, ``title`` their heading and ``columns`` the record keys naming a case."""

    def __init__(self, args, script, stem, title, columns):
        self.args, self.script, self.stem, self.title, self.columns = args, script, stem, title, columns
        self.out = Path(args.out)
        self.start = time.perf_counter()
        self.result = None

    def gpu(self):
        """``(torch, targets, arch)``: the compile targets (``--archs``, else this GPU's; a dry run
        sm_90) and the GPU's arch (a dry run: the newest target).  None without a CUDA GPU unless
        dry (the script exits 2)."""
        os.environ.pop("TRITON_INTERPRET", None)   # ahead-of-time compilation needs Triton's compiler
        import torch

        from ..aot import parse_archs

        if not self.args.dry_run and not torch.cuda.is_available():
            print(f"{self.script}: no CUDA GPU; use --dry-run to build and load only", file=sys.stderr)
            return None
        major, minor = (0, 0) if self.args.dry_run else torch.cuda.get_device_capability()
        gpu_arch = 10 * major + minor or None
        targets = parse_archs(self.args.archs or (f"sm_{gpu_arch}" if gpu_arch else "sm_90"))
        return torch, targets, gpu_arch or max(targets.cubins or targets.ptx)

    def build(self, torch, targets, runtime, families, block_sizes=None):
        """The kernel library of ``families`` for ``targets`` and ``--dtypes`` (and ``block_sizes``),
        built in a temporary folder and loaded as ``runtime(path)``; starts the result."""
        from ..aot import build_sources, parse_filters
        from ..aot.native import KERNELS_LIBRARY, build_kernel_library

        work = Path(tempfile.mkdtemp(prefix=f"{self.stem}-"))
        source, manifest = build_sources(targets, work, jobs=self.args.jobs,
                                         **parse_filters(self.args.dtypes, block_sizes, families))
        build_kernel_library(source, work / KERNELS_LIBRARY, jobs=self.args.jobs)
        self.result = {"dry_run": self.args.dry_run, "gpu": None if self.args.dry_run else torch.cuda.get_device_name(),
                       "archs": manifest["archs"] + manifest["ptx"], "kernels": len(manifest["specializations"]),
                       "build_s": time.perf_counter() - self.start, "cases": []}
        return runtime(work / KERNELS_LIBRARY)

    def cases(self, work):
        """Run ``work``: ``(record, fn)`` pairs, ``record`` a dict holding :attr:`columns` and ``fn()``
        returning ``{"selected": [spec names, None where none], "checks": [check(...), ...]}``.  A
        failing case is recorded and the run goes on; the exit status: 1 if any failed."""
        self.out.mkdir(parents=True, exist_ok=True)
        for record, fn in work:
            try:
                record.update(fn())
                selected = None not in record["selected"]
                record["status"] = ("no kernel selected" if not selected else
                                    "selected" if self.args.dry_run and not record["checks"] else
                                    "pass" if all(c["ok"] for c in record["checks"]) else "FAIL")
            except Exception as exc:   # record it and go on with the other cases
                record.update(status="FAIL", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
            self.result["cases"].append(record)
            self.result["total_s"] = time.perf_counter() - self.start
            self._write()
            print(f"{' '.join(str(record[c]) for c in self.columns)}: {record['status']}", flush=True)
        failed = [r for r in self.result["cases"] if r["status"] not in ("pass", "selected")]
        print(f"{self.script}: {len(self.result['cases']) - len(failed)} of {len(self.result['cases'])} cases passed "
              f"in {self.result['total_s']:.0f} s -> {self.out}")
        return 1 if failed else 0

    def _markdown(self):
        r = self.result
        lines = [f"# {self.title}", "",
                 f"- GPU: {r['gpu'] or 'none (dry run)'}; archs {', '.join(r['archs'])}; {r['kernels']} kernels "
                 f"compiled and built in {r['build_s']:.0f} s; whole run {r.get('total_s', 0):.0f} s", ""]
        lines += [f"| {' | '.join(self.columns)} | kernels | result | worst rel. error |",
                  "|---" * (len(self.columns) + 3) + "|"]
        for case in r["cases"]:
            errors = [c["rel_error"] for c in case.get("checks", []) if c["rel_error"] is not None]
            worst = f"{max(errors):.2e}" if errors else ""
            lines.append(f"| {' | '.join(str(case[c]) for c in self.columns)} | "
                         f"{' / '.join(map(str, case.get('selected', [])))} | {case['status']} | {worst} |")
        return "\n".join(lines) + "\n"

    def _write(self):
        (self.out / f"{self.stem}.json").write_text(json.dumps(self.result, indent=1) + "\n")
        (self.out / f"{self.stem}.md").write_text(self._markdown())
