"""Timing tables of the dispatch cost model (``blocksparse/dispatch/tables/<framework>-<device>.json``).

    python bench/dispatch.py --out bench/results --install          # GPU: torch-cuda.json (make bench)
    python bench/dispatch.py --cpu --out bench/results --install    # CPU: torch-cpu.json, tensorflow-cpu.json
    python bench/dispatch.py --quick --cpu --out /tmp/d             # smoke run (tiny; kernels interpreted)

For a grid of problems -- tokens N, in C, out K, block size, density, dtype, random or butterfly
layout -- it times every implementation of ``y = x @ W`` as the layers run it
(``LinearDispatch.run`` in PyTorch: the kernels with the weight re-blocked where the block size is
refined, the portable path, the dense masked product, the reference path; the ``Products`` of
``blocksparse._tf.matmul.backend`` in TensorFlow, inside ``tf.function``): the forward product
alone and forward plus both gradients, in wall milliseconds per call (device synchronised).
The GPU grid also holds the exact layers of ``bench/pixelfly.py``, so the model's choice there is a
measurement, not an interpolation.

Robustness: every implementation's output and gradients are checked against float64 first
(``torch.empty`` NaN-poisoned); a wrong or failing implementation is recorded in the row's
``errors`` and left out of it; a failing case is recorded and the run goes on; the table is
rewritten after every case.  Timings are medians (GPU) or the least (CPU: other work only adds
time) of ``--rounds`` rounds with the implementations interleaved within each round; each round
runs a call enough times to last about ``--round-ms``.  A CPU table describes the machine it was
measured on (cores, vector units, BLAS) with the frameworks' default threads: regenerate it on yours.  The table's ``validation`` holds the leave-one-out
check of the model (:func:`blocksparse.dispatch.model.leave_one_out`), under the work exponent fitted to the rows
(:func:`~blocksparse.dispatch.model.fit_work_exponent`).

Expected duration: about 3 minutes on an H200 (60 problems; most of the time is Triton compiling
the kernels the first time), about 7 minutes per framework on two CPU cores.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from blocksparse.dispatch.model import fit_work_exponent, leave_one_out  # noqa: E402
from blocksparse.dispatch.table import TABLES_DIR, Table  # noqa: E402
from blocksparse.layout import Layout  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout, default_butterfly_size  # noqa: E402
from blocksparse.ops.matmul.grouping import groups_well  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import dense_products, dense_products_torch, random_layout  # noqa: E402

#: The layers of bench/pixelfly.py: (in, out, block size, butterfly size).
PIXELFLY_LAYERS = ((384, 1536, 48, 64), (1536, 384, 48, 64), (2048, 8192, 256, 64), (8192, 4096, 256, 64))


@dataclass(frozen=True)
class Case:
    tokens: int
    in_features: int
    out_features: int
    block_size: int
    density: float        # the target; butterfly layouts take the n_factors nearest to it
    dtype: str
    layout: str           # "random" or "butterfly"


def gpu_cases(quick):
    if quick:
        return [Case(256, 256, 512, 32, 0.5, "bfloat16", "butterfly"),
                Case(256, 512, 256, 48, 0.25, "bfloat16", "random")]
    cases = [Case(8192, i, o, bs, 1.0, dt, "butterfly") for i, o, bs, _ in PIXELFLY_LAYERS
             for dt in ("bfloat16", "float32")]
    for c, k in ((1024, 4096), (4096, 1024), (4096, 4096)):
        for n in (1024, 8192):
            for bs in (32, 128):
                for d in (0.125, 0.5):
                    cases += [Case(n, c, k, bs, d, "bfloat16", kind) for kind in ("random", "butterfly")]
    cases += [Case(8192, 4096, 4096, bs, d, "float32", "random") for bs in (32, 128) for d in (0.125, 0.5)]
    return cases


def cpu_cases(quick, framework):
    if quick:
        return [Case(32, 64, 96, 16, 0.5, "float32", "random"), Case(16, 48, 96, 3, 1.0, "float32", "butterfly")]
    # sizes a CPU trains at; the model scales the time per unit of work to larger problems
    cases = []
    for c, k in ((512, 512), (1024, 1024), (512, 2048), (2048, 512)):
        for n in (64, 512):
            for bs in (8, 32, 128):
                cases += [Case(n, c, k, bs, d, "float32", "random") for d in (0.1, 0.25, 0.5)]
    for c, k, sizes in ((512, 2048, (16, 128)), (2048, 512, (16, 128)), (384, 1536, (48,)), (1536, 384, (48,))):
        cases += [Case(512, c, k, bs, 1.0, "float32", "butterfly") for bs in sizes]
    cases += [Case(512, 1024, 1024, bs, d, "bfloat16", "random") for bs in (32, 128) for d in (0.1, 0.5)]
    return cases


def make_layout(case, rng):
    """The case's layout: random at the target density, or the butterfly whose n_factors comes closest."""
    cb, kb = case.in_features // case.block_size, case.out_features // case.block_size
    if case.layout == "random":
        mask = random_layout(rng, cb, kb, case.density, cover=True).astype(bool)
    else:
        n = default_butterfly_size(case.in_features, case.out_features, case.block_size)
        for bs_in, bs_out, b, size in PIXELFLY_LAYERS:  # the benchmarked layers use the seed's size
            if (bs_in, bs_out, b) == (case.in_features, case.out_features, case.block_size):
                n = size
        masks = [butterfly_layout(case.in_features, case.out_features, case.block_size, n, f)
                 for f in range(1, n.bit_length())]
        mask = min(masks, key=lambda m: abs(m.mean() - case.density))
    return Layout(mask, case.block_size, any_block_size=True)


def wall_ms(fn, sync, round_ms):
    """Milliseconds per call of ``fn``, over enough calls to last about ``round_ms``."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = (time.perf_counter() - t0) * 1e3
    reps = int(min(50, max(1, round_ms / max(once, 1e-3))))
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / reps


# ---------------------------------------------------------------- PyTorch


class TorchRunner:
    framework = "torch"

    def __init__(self, case, layout, device, rng):
        import torch

        from blocksparse.torch._portable.dispatch import for_layout

        self.torch, self.device = torch, torch.device(device)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[case.dtype]
        self.layout = layout
        self.dispatch = for_layout(layout, device=self.device)
        t = lambda a: torch.from_numpy(a).to(self.device, self.dtype)  # noqa: E731
        self.x = t(rng.standard_normal((case.tokens, layout.C)).astype(np.float32))
        self.w = t((rng.standard_normal(layout.w_shape) / np.sqrt(layout.block_size * layout.CB * layout.density))
                   .astype(np.float32))
        self.dy = t(rng.standard_normal((case.tokens, layout.K)).astype(np.float32))
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def impls(self):
        smoke = _interpret() and self.dispatch.bsmm is not None  # kernels interpreted on the CPU
        return [i for i in ("kernels", "portable", "dense", "reference")
                if i in self.dispatch.candidates(self.device.type, self.dtype) or (i == "kernels" and smoke)]

    def _grads(self, impl):
        x, w = self.x.clone().requires_grad_(), self.w.clone().requires_grad_()
        with _kernels_env(impl, self.device):
            y = self.dispatch.run(impl, x, w)
            return (y, *self.torch.autograd.grad(y, (x, w), self.dy))

    def check(self, impl):
        from blocksparse.testing.poison import poisoned_empty

        with poisoned_empty():
            outs = self._grads(impl)
        refs = dense_products_torch(self.layout, self.x, self.w, self.dy)
        return {name: rel_error(o, r) for name, o, r in zip(("y", "dx", "dw"), outs, refs)}

    def fns(self, impl):
        def fwd():
            with self.torch.no_grad(), _kernels_env(impl, self.device):
                self.dispatch.run(impl, self.x, self.w)

        return fwd, lambda: self._grads(impl)


def _interpret():
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@contextlib.contextmanager
def _kernels_env(impl, device):
    """On the CPU (smoke runs) the kernels run through Triton's interpreter only when
    BLOCKSPARSE_BACKEND=triton asks for them."""
    if impl != "kernels" or device.type == "cuda":
        yield
        return
    saved = os.environ.get("BLOCKSPARSE_BACKEND")
    os.environ["BLOCKSPARSE_BACKEND"] = "triton"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["BLOCKSPARSE_BACKEND"]
        else:
            os.environ["BLOCKSPARSE_BACKEND"] = saved


# ---------------------------------------------------------------- TensorFlow


class TfRunner:
    framework = "tensorflow"

    def __init__(self, case, layout, device, rng):
        from blocksparse._tf import tf
        from blocksparse._tf.matmul import autodiff, backend

        self.tf, self.layout = tf, layout
        self.products = {"portable": backend.PORTABLE, "dense": backend.DENSE, "reference": backend.REFERENCE}
        dtype = tf.as_dtype(case.dtype)
        t = lambda a: tf.cast(tf.constant(a.astype(np.float32)), dtype)  # noqa: E731
        self.x = t(rng.standard_normal((case.tokens, layout.C)))
        self.w = t(rng.standard_normal(layout.w_shape) / np.sqrt(layout.block_size * layout.CB * layout.density))
        self.dy = t(rng.standard_normal((case.tokens, layout.K)))
        self._fwd, self._fwdbwd = {}, {}
        for name, p in self.products.items():
            self._fwd[name] = tf.function(lambda x, w, p=p: p.fprop(x, w, layout, 1))

            def both(x, w, dy, p=p):
                with tf.GradientTape() as tape:
                    tape.watch([x, w])
                    y = autodiff.matmul(x, w, layout, 1, w.dtype, p)
                return (y, *tape.gradient(y, [x, w], output_gradients=dy))

            self._fwdbwd[name] = tf.function(both)
        self.sync = lambda: None

    def impls(self):
        return list(self.products)

    def check(self, impl):
        outs = self._fwdbwd[impl](self.x, self.w, self.dy)
        refs = dense_products(self.layout, *(self.tf.cast(a, self.tf.float64).numpy()
                                             for a in (self.x, self.w, self.dy)), 1)
        return {name: rel_error(self.tf.cast(o, self.tf.float64).numpy(), r)
                for name, o, r in zip(("y", "dx", "dw"), outs, refs)}

    def fns(self, impl):
        return (lambda: self._fwd[impl](self.x, self.w).numpy(),
                lambda: [t.numpy() for t in self._fwdbwd[impl](self.x, self.w, self.dy)])


# ---------------------------------------------------------------- measuring


def measure(case, runner_cls, device, args, seed):
    rng = np.random.default_rng(seed)
    layout = make_layout(case, rng)
    runner = runner_cls(case, layout, device, rng)
    row = {**asdict(case), "density": layout.density, "target_density": case.density,
           "structured": bool(groups_well(layout)), "fwd_ms": {}, "fwdbwd_ms": {}, "errors": {}, "rel_error": {}}
    tol = 2 * tolerance(case.dtype)
    ok = []
    for impl in runner.impls():
        try:
            errs = runner.check(impl)
            row["rel_error"][impl] = errs
            if max(errs.values()) > tol:
                row["errors"][impl] = f"wrong: relative errors {errs} > {tol:g}"
            else:
                ok.append(impl)
        except Exception as exc:  # a failing implementation must not stop the others
            row["errors"][impl] = f"{type(exc).__name__}: {exc}"[:500]
    samples = {impl: ([], []) for impl in ok}
    for _ in range(args.rounds):
        for impl in ok:  # interleaved: a slow spell of a shared machine hits every impl alike
            fwd, both = runner.fns(impl)
            samples[impl][0].append(wall_ms(fwd, runner.sync, args.round_ms))
            samples[impl][1].append(wall_ms(both, runner.sync, args.round_ms))
    pick = np.min if device == "cpu" else np.median  # other work on a CPU only ever adds time
    for impl, (f, b) in samples.items():
        row["fwd_ms"][impl] = float(pick(f))
        row["fwdbwd_ms"][impl] = float(pick(b))
    return row


def set_threads(framework, threads):
    if framework == "torch":
        import torch
        torch.set_num_threads(threads)
    else:
        import tensorflow as tf
        tf.get_logger().setLevel("ERROR")
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def threads(framework, asked):
    """The intra-op threads of the run: those asked for, else the framework's default."""
    if asked is not None:
        return asked
    if framework == "torch":
        import torch
        return torch.get_num_threads()
    return os.cpu_count() if not hasattr(os, "sched_getaffinity") else len(os.sched_getaffinity(0))


def software(framework):
    info = {"python": platform.python_version(), "numpy": np.__version__}
    if framework == "torch":
        import torch
        import triton
        info.update(torch=torch.__version__, triton=triton.__version__)
    else:
        import tensorflow as tf
        info.update(tensorflow=tf.__version__)
    return info


def device_name(device):
    if device == "cuda":
        import torch
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} logical CPUs)"


def table_dict(framework, device, rows, args):
    return {
        "format": 1, "framework": framework, "device": device, "device_name": device_name(device),
        "created": datetime.date.today().isoformat(), "software": software(framework),
        "method": (f"wall ms per call, device synchronised; {'least' if device == 'cpu' else 'median'} of "
                   f"{args.rounds} rounds, implementations interleaved within each round, each round about "
                   f"{args.round_ms} ms of calls; outputs and gradients checked against float64 first"
                   + (f"; {threads(framework, args.threads)} intra-op thread(s), the least of the rounds "
                      "(other work on the machine only adds time)" if device == "cpu" else "")),
        "rows": rows,
    }


def markdown(data):
    lines = [f"# Dispatch table: {data['framework']} on {data['device_name']} ({data['created']})", "",
             data["method"], "", "| N | C | K | bs | density | dtype | layout | fwd+bwd ms by impl | chosen | regret |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    loo = {tuple(r["key"]): r for r in data.get("validation", {}).get("rows", [])}
    for r in data["rows"]:
        times = ", ".join(f"{k} {v:.3g}" for k, v in sorted(r["fwdbwd_ms"].items(), key=lambda kv: kv[1]))
        v = loo.get((r["tokens"], r["in_features"], r["out_features"], r["block_size"], round(r["density"], 4),
                     r["dtype"], r["layout"]), {})
        lines.append(f"| {r['tokens']} | {r['in_features']} | {r['out_features']} | {r['block_size']} | "
                     f"{r['density']:.3f} | {r['dtype']} | {r['layout']} | {times} | {v.get('chosen', '')} | "
                     f"{v.get('regret', float('nan')):+.1%} |")
    val = data.get("validation", {})
    if val:
        lines += ["", f"Leave-one-out (each row predicted from the others, margin {val['margin']:.0%}): "
                      f"median regret {val['median_regret']:+.1%}, worst {val['max_regret']:+.1%}, "
                      f"{val['within_margin']:.0%} of rows within the margin; on the grid itself the choice "
                      f"is within the margin by construction."]
    return "\n".join(lines) + "\n"


#: The fields of a row the package's table keeps (bench/results keeps them all).
ROW_FIELDS = ("tokens", "in_features", "out_features", "block_size", "density", "dtype", "layout", "structured",
              "fwd_ms", "fwdbwd_ms")


def package_json(data, rows):
    """The table as the package ships it: its metadata, then one row per line."""
    head = {k: v for k, v in data.items() if k not in ("rows", "validation")}
    head["validation"] = {k: v for k, v in data.get("validation", {}).items() if k != "rows"}
    body = ",\n".join("  " + json.dumps({k: r[k] for k in ROW_FIELDS}) for r in rows)
    return json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n"


def write(data, out, install):
    os.makedirs(out, exist_ok=True)
    name = f"{data['framework']}-{data['device']}"
    valid = [r for r in data["rows"] if r["fwdbwd_ms"]]
    if len(valid) > 1:  # the work exponent fitted to these rows, then the validation under it
        data["work_exponent"] = fit_work_exponent(Table.from_dict({**data, "rows": valid}))
        data["validation"] = leave_one_out(Table.from_dict({**data, "rows": valid}))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(markdown(data))
    if install and valid:  # the package gets the measured rows, the fields the model reads
        with open(TABLES_DIR / f"{name}.json", "w") as f:
            f.write(package_json(data, valid))


def run(framework, device, cases, args):
    runner = TorchRunner if framework == "torch" else TfRunner
    rows = []
    for i, case in enumerate(cases):
        t0 = time.perf_counter()
        try:
            row = measure(case, runner, device, args, seed=i)
        except Exception as exc:
            traceback.print_exc()
            row = {**asdict(case), "fwd_ms": {}, "fwdbwd_ms": {}, "errors": {"case": f"{type(exc).__name__}: {exc}"}}
        rows.append(row)
        print(f"[{framework}-{device} {i + 1}/{len(cases)} {time.perf_counter() - t0:.1f}s] {case} -> "
              f"{ {k: round(v, 3) for k, v in row['fwdbwd_ms'].items()} } {row['errors'] or ''}", flush=True)
        write(table_dict(framework, device, rows, args), args.out, install=False)
    write(table_dict(framework, device, rows, args), args.out, install=args.install)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--cpu", action="store_true", help="the CPU tables (PyTorch and TensorFlow)")
    ap.add_argument("--framework", choices=("torch", "tensorflow", "both"), default="both",
                    help="with --cpu: which framework's table")
    ap.add_argument("--quick", action="store_true", help="a few tiny problems (smoke run)")
    ap.add_argument("--install", action="store_true", help="copy the tables into blocksparse/dispatch/tables/")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds (default 5, 1 quick)")
    ap.add_argument("--round-ms", type=float, default=None, help="calls per round last about this long")
    ap.add_argument("--threads", type=int, default=None,
                    help="with --cpu: intra-op threads (default: the frameworks' own default; time on a "
                         "quiet machine)")
    args = ap.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.round_ms = args.round_ms or (1 if args.quick else 100 if args.cpu else 20)
    if args.quick and args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels through Triton's interpreter
    if args.cpu:
        for fw in (("torch", "tensorflow") if args.framework == "both" else (args.framework,)):
            if args.threads is not None:
                set_threads(fw, args.threads)
            run(fw, "cpu", cpu_cases(args.quick, fw), args)
    else:
        run("torch", "cuda", gpu_cases(args.quick), args)


if __name__ == "__main__":
    main()
