"""The fused attention's eager calls through the kernel library's compiled specs against Triton's JIT
(GPU): host time, time per call, and both checked against float64.

    python bench/attention_launch.py --out bench/results      # H200: ~2 min (the library: BLOCKSPARSE_KERNELS)

For ``bench/attention.py``'s layouts at 4k tokens (batch 4, 16 heads, bf16, blocks of 128; head
dims 64 and 128) and a few other shapes (blocks of 64, grouped-query heads), ``attention(q, k, v,
layout)`` forward + backward runs as a user writes it, with the launches prepared two ways:

* ``aot``  the kernel library's specs (:mod:`blocksparse.ops.attention.aot`; one C call a launch);
* ``jit``  the same kernels, tiles and arguments through Triton's JIT.

Every case is first checked: outputs and gradients of both paths against float64 dense attention on
two heads of the first batch element.  Then, in ``--rounds`` interleaved rounds: ``host_us``, the
host time of a forward + backward while the GPU is busy (what a call costs the host); ``ms``, a
forward + backward timed with events (``triton.testing.do_bench``), which counts the host's time
where the GPU waits for it.  Writes ``attention-launch-h200.{json,md}`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import attention as bench  # noqa: E402

from blocksparse import _kernels  # noqa: E402
from blocksparse.torch import AttentionLayout  # noqa: E402
from blocksparse.torch._attention import launch  # noqa: E402

#: (layout, S, B, D, heads, kv heads, block size)
CASES = [(name, 4096, 4, d, 16, 16, 128) for d in (64, 128) for name in bench.LAYOUTS]
CASES += [("bigbird", 4096, 4, 64, 16, 16, 64), ("causal", 2048, 8, 128, 16, 4, 128), ("fixed", 1024, 2, 64, 8, 8, 128)]


class Case(bench.Problem):
    """A problem of ``bench/attention.py`` with its own heads, key/value heads and block size."""

    def __init__(self, name, S, B, D, heads, kv_heads, bs):
        super().__init__(name, S, B, D, "cuda", heads=heads)
        if bs != bench.BS or kv_heads != heads:
            self.layout_np = bench.make_layout(name, S // bs)
            self.layout = AttentionLayout(self.layout_np, bs)
            self.k = self.k[:, :kv_heads].detach().clone().requires_grad_()
            self.v = self.v[:, :kv_heads].detach().clone().requires_grad_()
        self.bs = bs

    def keep(self):
        lay = torch.as_tensor(self.layout_np, device=self.device, dtype=torch.bool)
        keep = lay.repeat_interleave(self.bs, 0).repeat_interleave(self.bs, 1)
        return keep & torch.ones_like(keep).tril() if self.causal else keep

    def reference(self):
        """float64 outputs and gradients of batch 0's first query heads (two, or one key/value
        head's group) and their key/value heads."""
        group = self.q.shape[1] // self.k.shape[1]
        nq = max(2, group)
        q = self.q[:1, :nq].detach().double().requires_grad_()
        k, v = (t[:1, :nq // group].detach().double().requires_grad_() for t in (self.k, self.v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                                             v.repeat_interleave(group, 1), attn_mask=self.keep(),
                                                             scale=self.D ** -0.5)
        return [o.detach()] + list(torch.autograd.grad(o, (q, k, v), self.do[:1, :nq].double()))


def use(path, kernels):
    """Make the launches prepare on ``path`` (``"aot"``: the library; ``"jit"``: Triton)."""
    launch._plans.clear()
    launch._launch.library = (lambda: kernels) if path == "aot" else (lambda: None)


def paths(case):
    """The prepared launches' paths of the case's last call, e.g. ``"aot aot aot"``."""
    return " ".join(r.path for plan in launch._plans.values() for r in plan)


def host_us(fn, calls=20):
    torch.cuda._sleep(int(2e9))  # the GPU busy: the host never waits for it
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return elapsed


def run_case(spec, kernels, rounds):
    case = Case(*spec)
    row = dict(zip(("layout", "S", "B", "D", "heads", "kv_heads", "block_size"), spec))
    ref = case.reference()

    def step():
        case.ours().backward(case.do)

    for path in ("aot", "jit"):
        use(path, kernels)
        got = bench.run_grads(case.ours, case)
        errs = bench.errors([g[:1, :r.shape[1]] for g, r in zip(got, ref)], ref)
        row[f"{path}_errors"] = [round(e, 5) for e in errs]
        row[f"{path}_ok"] = bench.within(errs)
        row[f"{path}_launches"] = paths(case)
    times = {p: {"host_us": [], "ms": []} for p in ("aot", "jit")}
    for r in range(rounds):
        for path in ("aot", "jit") if r % 2 == 0 else ("jit", "aot"):
            use(path, kernels)
            step()
            for t in case.leaves:
                t.grad = None
            times[path]["host_us"].append(host_us(step))
            times[path]["ms"].append(bench.time_ms(step, case.leaves, first=r == 0))
    for path, t in times.items():
        row[f"{path}_host_us"] = round(statistics.median(t["host_us"]), 1)
        row[f"{path}_ms"] = round(statistics.median(t["ms"]), 4)
    row["aot_over_jit"] = round(row["aot_ms"] / row["jit_ms"], 3)
    return row


def markdown(meta, rows):
    out = [f"# Fused attention: compiled specs vs Triton's JIT, eager calls ({meta['gpu']}, {meta['date']})", "",
           f"torch {meta['torch']}, triton {meta['triton']}; bf16; forward + backward of `attention(q, k, v, layout)` "
           "as a user calls it. `host µs`: the host's time for one call while the GPU is busy; `ms`: one call "
           "timed with events (do_bench median), which counts the host where the GPU waits for it; medians of "
           f"{meta['rounds']} interleaved rounds. `launches`: the paths the call's launches took. Checked: both "
           "paths' outputs and gradients against float64 on two heads.", "",
           "| layout | S x B | D | heads (kv) | block | aot host µs | jit host µs | aot ms | jit ms | aot / jit | "
           "launches (aot run) | checked |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['layout']} | {r['S']} x {r['B']} | {r['D']} | | | | | | | | {r['error'][:80]} | |")
            continue
        ok = "ok" if r["aot_ok"] and r["jit_ok"] else "FAIL"
        out.append(f"| {r['layout']} | {r['S']} x {r['B']} | {r['D']} | {r['heads']} ({r['kv_heads']}) | "
                   f"{r['block_size']} | {r['aot_host_us']} | {r['jit_host_us']} | {r['aot_ms']} | {r['jit_ms']} | "
                   f"{r['aot_over_jit']} | {r['aot_launches']} | {ok} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    kernels = _kernels.load()
    if kernels is None:
        sys.exit("no kernel library: set BLOCKSPARSE_KERNELS to a build (python -m blocksparse.aot --library)")
    import triton

    meta = dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
                triton=triton.__version__, rounds=args.rounds, library=kernels.path)
    rows = []
    for spec in CASES:
        try:
            rows.append(run_case(spec, kernels, args.rounds))
        except Exception as exc:  # keep the others
            rows.append(dict(zip(("layout", "S", "B", "D"), spec), error=repr(exc)[:300]))
        print(json.dumps(rows[-1]), flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "attention-launch-h200.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        with open(os.path.join(args.out, "attention-launch-h200.md"), "w") as f:
            f.write(markdown(meta, rows))
    failed = [r for r in rows if "error" in r or not (r["aot_ok"] and r["jit_ok"])]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
