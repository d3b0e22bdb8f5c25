"""Does a process's history change an (N, C) layer norm's forward time? norms.py's cases, in an order,
with the forward's grid (persistent programs a SM, 0: a program a tile) varied before and after."""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import common  # noqa: E402
import norms  # noqa: E402
from blocksparse.ops.norms.configs import NormConfig, layer_norm_config  # noqa: E402
from blocksparse.torch._norms import launch  # noqa: E402


def run(tokens, features, label):
    for n in tokens:
        for c in features:
            case = norms.LayerNormCase(n, c, torch.bfloat16, 1, False, "cuda")
            for impl in ("blocksparse", "torch"):
                ms, _ = norms.time_ms(case, impl, "fwd", 20)
                print(label, n, c, impl, round(ms * 1e3, 1), flush=True)
            del case
            torch.cuda.empty_cache()


def grids(label):
    for n, c in ((16384, 4096), (8192, 8192)):
        x = torch.randn(n, c, device="cuda").bfloat16()
        g, b = torch.randn(c, device="cuda").bfloat16(), torch.randn(c, device="cuda").bfloat16()
        table = layer_norm_config(1, c, 2)
        for pps in (0, 1, 2, 4, 8):
            cfg = NormConfig(table.BN, table.BC, table.num_warps, pps)
            fn = functools.partial(launch.layer_norm_fwd, axis=1, epsilon=1e-5, relu=False, segments=1, cfg=cfg)
            ms = common.time_rotating_ms(lambda: [functools.partial(fn, x.clone(), g, b) for _ in range(2)])
            print(label, n, c, f"grid pps={pps}", round(ms * 1e3, 1), flush=True)
        del x
        torch.cuda.empty_cache()


def case_grids(label, with_dy):
    """The grids on norms.py's operand sets: (x, g, b, dy) cloned per call (``with_dy``), or (x, g, b)."""
    for n, c in ((16384, 4096), (8192, 8192)):
        case = norms.LayerNormCase(n, c, torch.bfloat16, 1, False, "cuda")
        table = layer_norm_config(1, c, 2)
        for pps in (0, 2, 4, 8):
            cfg = NormConfig(table.BN, table.BC, table.num_warps, pps)
            fn = functools.partial(launch.layer_norm_fwd, axis=1, epsilon=1e-5, relu=False, segments=1, cfg=cfg)

            def make():
                sets = [case.operands(True) if with_dy else case.operands(True)[:3] for _ in range(2)]
                return [functools.partial(fn, *s[:3]) for s in sets] + [lambda: sets]

            ms = common.time_rotating_ms(make) * 3 / 2  # the third fn launches nothing
            print(label, "dy" if with_dy else "no-dy", n, c, f"grid pps={pps}", round(ms * 1e3, 1), flush=True)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__" and len(sys.argv) == 1:
    case_grids("case", True)
    case_grids("case", False)
    grids("fresh")
    run([16384], [4096], "norms.py")
    case_grids("case", True)


def profile(label, make):
    """Kernel names and GPU µs of one replay of a GraphTimer's graph."""
    from torch.profiler import ProfilerActivity, profile as prof
    timer = common.GraphTimer(make)
    timer.median_ms(3)
    with prof(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        timer.graph.replay()
        end.record()
        torch.cuda.synchronize()
    print(label, "events around the replay:", round(start.elapsed_time(end) * 1e3, 1), "µs", flush=True)
    evs = sorted((e for e in p.events() if e.device_time_total > 0 or "Graph" in e.name or "cuda" in e.name.lower()),
                 key=lambda e: e.time_range.start)
    t0 = evs[0].time_range.start if evs else 0
    for e in evs:
        print(label, e.name[:60], e.device_type, round(e.time_range.start - t0, 1), round(e.time_range.elapsed_us(), 1),
              flush=True)


def profiles():
    case = norms.LayerNormCase(16384, 4096, torch.bfloat16, 1, False, "cuda")
    profile("norms.py", lambda: [case.call("blocksparse", "fwd", case.operands(True)) for _ in range(2)])
    fn = functools.partial(launch.layer_norm_fwd, axis=1, epsilon=1e-5, relu=False, segments=1)
    profile("launcher", lambda: [functools.partial(fn, *case.operands(True)[:3]) for _ in range(2)])


if __name__ == "__main__" and "--profile" in sys.argv:
    profiles()


def holds():
    """norms.py's case and the launcher, each timed once on a fresh graph (as norms.py does), with the
    GraphTimer's warm-up and hold and without them, alternating."""
    for n, c in ((16384, 4096), (8192, 8192), (8192, 1024)):
        case = norms.LayerNormCase(n, c, torch.bfloat16, 1, False, "cuda")
        fn = functools.partial(launch.layer_norm_fwd, axis=1, epsilon=1e-5, relu=False, segments=1)
        makes = {"norms.py": lambda: [case.call("blocksparse", "fwd", case.operands(True)) for _ in range(2)],
                 "torch": lambda: [case.call("torch", "fwd", case.operands(True)) for _ in range(2)],
                 "launcher": lambda: [functools.partial(fn, *case.operands(True)[:3]) for _ in range(2)]}
        for name, make in makes.items():
            for on in (False, True, False, True):
                saved = common.HOLD_CYCLES, common.WARM_MS
                if not on:
                    common.HOLD_CYCLES, common.WARM_MS = 0, 0
                ms = common.GraphTimer(make).median_ms(20)
                common.HOLD_CYCLES, common.WARM_MS = saved
                print("hold", n, c, name, "on" if on else "off", round(ms * 1e3, 1), flush=True)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__" and "--hold" in sys.argv:
    holds()
