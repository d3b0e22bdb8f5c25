"""The implicit-GEMM convolution's launches: the kernel library's compiled tiles against the JIT's
autotuned kernel, per layer, and the eager calls they make.

    BLOCKSPARSE_KERNELS=build/aot/_kernels.so python bench/conv_launch.py --out DIR   (H200: ~1.5 min)

The bf16 layers of ``bench/conv_implicit.py`` on 56x56x256 (3x3, 3x3 stride 2), 28x28x512 (1x1) and
14x14x1024 (3x3), blocks of 32 / 64 / 128 channels at densities 0.25 and 0.5.  Per layer and
direction (``fwd``: the output; ``dx``: the input gradient), GPU microseconds of one kernel call
(a CUDA graph of it, replayed): ``jit`` (Triton's JIT, the autotuner's pick, ``jit_cfg``), and the
library's ``m128`` and ``m64`` tiles (``blocksparse/ops/conv/aot.py``; ``*_err``: the largest
difference to the JIT's output over its largest value), with ``rule`` the tile
:func:`~blocksparse.ops.conv.aot.tile_for` picks.  Then the public call as a user makes it
(``path="implicit"``, channels-last input), eager microseconds a call, forward and forward +
backward, with the path its launches took (``path_fwd`` / ``path_dx``: ``aot`` or ``jit``) and
whether the C++ autograd node ran them (``native``: ``native`` / ``python``), and the dense masked
cuDNN convolution's.  ``--eager`` measures only the eager calls, each both ways in the same run:
through the C++ node where it serves (``eager_*``) and through the Python ``autograd.Function``
(``eager_*_python``, ``BLOCKSPARSE_TORCH_NATIVE=off``), the dense convolution's beside them, in
interleaved rounds (:func:`interleaved_us`: the calls are mostly bound by host time, which
drifts).  ``--wgrad`` times only the filter gradient: the kernel over the present blocks
(:func:`~blocksparse.torch._conv.implicit.conv_implicit_wgrad`) against cuDNN's dense masked one.
Writes ``conv-launch.json`` into ``--out``.

``results/raw/conv-launch-h200.json`` (2026-12-04) was measured by this script's first form, which
timed each kernel as the median of three rounds of 20 replays of its graph (here: the median of 20
single replays, :class:`common.GraphTimer`); the rows are otherwise the same.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402
import conv_implicit as ci  # noqa: E402
from blocksparse.ops.conv import aot as conv_aot  # noqa: E402
from blocksparse.ops.conv import wgrad as wgrad_module  # noqa: E402
from blocksparse.torch._conv import implicit as glue  # noqa: E402
from blocksparse.torch._conv.dense import dense_grads  # noqa: E402
from blocksparse.torch._launch import device_info, library, prepare  # noqa: E402

SHAPES = ("56x56x256-3x3", "14x14x1024-3x3", "56x56x256-3x3-s2", "28x28x512-1x1")


def graph_us(fn):
    return round(common.GraphTimer(lambda: [fn]).median_ms(20) * 1e3, 1)


def directions(case):
    """``(name, read tensor, plan, packed filter, steps, tiles, written channels)`` of both kernels."""
    op = case.ops["implicit"]
    spec, t = op.spec, op._tables.on(case.x.device)
    flat = case.F.detach().reshape(-1)
    return [("fwd", case.x.detach(), spec.implicit, flat.index_select(0, t.implicit_weight), t.implicit_steps,
             t.implicit_tiles, spec.blocks.K),
            ("dx", case.dy, spec.implicit_grad, flat.index_select(0, t.implicit_grad_weight), t.implicit_grad_steps,
             t.implicit_grad_tiles, spec.blocks.C)]


def _native_off(fn):
    """``fn`` run with the native node switched off (the Python path)."""
    def run():
        saved = os.environ.get("BLOCKSPARSE_TORCH_NATIVE")
        os.environ["BLOCKSPARSE_TORCH_NATIVE"] = "off"
        try:
            fn()
        finally:
            os.environ.pop("BLOCKSPARSE_TORCH_NATIVE")
            if saved is not None:
                os.environ["BLOCKSPARSE_TORCH_NATIVE"] = saved
    return run


def interleaved_us(fns, calls=40, rounds=5):
    """``{name: median wall µs a call}``: rounds of ``calls`` calls of each of ``fns`` in turn
    (synchronised around each), so a drift of clocks or host load meets every one alike."""
    for fn in fns.values():
        for _ in range(5):
            fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: round(sorted(v)[len(v) // 2], 1) for name, v in times.items()}


def eager(case):
    """The eager calls, forward and forward + backward, timed in interleaved rounds: the op's (the
    native node where it serves), the Python path's and the dense masked cuDNN convolution's; with
    the paths the op's took."""
    op = case.ops["implicit"]
    row = {}
    for mode, backward in (("fwd", False), ("fwdbwd", True)):
        fn = case.run("implicit", backward)
        row |= {f"{name}_{mode}" if name == "dense" else f"eager_{mode}{name}": us for name, us in interleaved_us(
            {"": fn, "_python": _native_off(fn), "dense": ci.dense_run(case, True, backward)}).items()}
    device_tables = op._tables.on(case.x.device)
    row["path_fwd"], row["path_dx"] = glue.launch_path(device_tables, False), glue.launch_path(device_tables, True)
    row["native"] = glue.native_path(device_tables)  # "native": the calls ran as the C++ autograd node
    return row


#: ``--wgrad``'s launch variants of the sparse filter gradient: (pixels a step, warps, stages).
WGRAD_VARIANTS = [(128, 4, 3), (128, 8, 3), (64, 8, 3), (64, 4, 4), (128, 8, 4), (32, 4, 3), (256, 8, 3)]


def wgrad(case):
    """GPU µs of the filter gradient: over the present blocks (``ops/conv/wgrad.py``, ``wgrad_sparse``:
    its module's launch; ``wgrad_BM_W_S``: :data:`WGRAD_VARIANTS`, each checked first) and cuDNN's
    dense masked one (``wgrad_dense``, what the path takes today); ``wgrad_err``: the largest
    difference of the first to the dense one over the dense one's largest value."""
    op = case.ops["implicit"]
    spec, t = op.spec, op._tables.on(case.x.device)
    x, dy, flat = case.x.detach(), case.dy, case.F.detach().reshape(-1)
    precision = glue._precision(x)
    sparse = lambda: glue.conv_implicit_wgrad(x, dy, spec, t, precision)  # noqa: E731
    dense = lambda: dense_grads(dy, x, flat, spec, t.dense, False, True)[1]  # noqa: E731
    want = dense().float()
    error = lambda: float((sparse().float() - want).abs().max() / want.abs().max())  # noqa: E731
    row = dict(wgrad_sparse=graph_us(sparse), wgrad_dense=graph_us(dense), wgrad_err=error())
    saved = wgrad_module.WGRAD_BM, wgrad_module.WGRAD_WARPS, wgrad_module.WGRAD_STAGES
    for bm, warps, stages in WGRAD_VARIANTS:
        name = f"wgrad_{bm}_{warps}_{stages}"
        wgrad_module.WGRAD_BM, wgrad_module.WGRAD_WARPS, wgrad_module.WGRAD_STAGES = bm, warps, stages
        try:
            err = error()
            row[name] = graph_us(sparse) if err < 0.02 else f"err {err:.3g}"
        except Exception as exc:  # a variant the GPU cannot run (resources)
            row[name] = repr(exc)[:120]
        finally:
            wgrad_module.WGRAD_BM, wgrad_module.WGRAD_WARPS, wgrad_module.WGRAD_STAGES = saved
    return row


def measure(case, kernels, info, eager_only=False):
    op = case.ops["implicit"]
    spec, row = op.spec, {}
    precision = glue._precision(case.x)
    for name, a, plan, w, steps, tiles, written in [] if eager_only else directions(case):
        transposed = name == "dx"
        jit = lambda: glue._launch(a, w, plan, steps, tiles, spec, written, transposed, precision)  # noqa: E731
        row[f"{name}_jit"] = graph_us(jit)
        row[f"{name}_jit_cfg"] = str(glue.conv_implicit_kernel.best_config)
        ref = jit().float()
        a5 = a.movedim(1, -1).contiguous().view(a.shape[0], 1, *a.shape[2:], a.shape[1])
        rule = conv_aot.tile_for
        for tile in conv_aot.TILES:
            conv_aot.tile_for = lambda *_, tile=tile: tile
            try:
                found = glue.compiled_launch(kernels, info.arch, info.sms, plan, spec, a5, written, transposed,
                                             precision, steps, tiles)
            finally:
                conv_aot.tile_for = rule
            run = None if found is None else prepare(found[0], a.device.index, kernels, found[1])
            if run is None or run.path != "aot":
                row[f"{name}_{tile}"] = "no spec" if run is None else run.reason
                continue
            y = torch.full_like(ref.movedim(1, -1), float("nan"), dtype=a.dtype).contiguous()
            run([a5, w, y])
            row[f"{name}_{tile}_err"] = float((y.movedim(-1, 1).float() - ref).abs().max() / ref.abs().max())
            row[f"{name}_{tile}"] = graph_us(lambda: run([a5, w, y]))  # noqa: B023
        pixels = a.shape[0] * (case.x if transposed else case.dy)[0, 0].numel()
        row[f"{name}_rule"] = conv_aot.tile_for(plan.block_n, plan.tiles.shape[0] * -(-pixels // 128), info.sms)
    return row | eager(case)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--eager", action="store_true", help="only the eager calls, native node and Python path")
    ap.add_argument("--wgrad", action="store_true", help="only the filter gradient: over the present blocks "
                    "against cuDNN's dense one")
    args = ap.parse_args()
    kernels, info = library(), device_info(torch.cuda.current_device())
    if kernels is None and not args.wgrad:
        sys.exit("no kernel library: set BLOCKSPARSE_KERNELS (python -m blocksparse.aot --out DIR --library)")
    rows = []
    for dt, shape, bs, d in ci.cases(False, False):
        if dt != "bf16" or shape not in SHAPES:
            continue
        row = dict(dtype=dt, shape=shape, bs=bs, d=d)
        try:
            case = ci.Case(dt, shape, bs, d, "cuda", 0)
            row |= wgrad(case) if args.wgrad else measure(case, kernels, info, args.eager)
        except Exception as exc:  # a failing layer must not stop the others
            row["error"] = repr(exc)[:300]
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(args.out, "conv-launch.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
