"""Eager per-call time of the norms, the LSTM gates and the transformer ops as users call them,
against the PyTorch code they replace, in one run.

    python bench/eager_ops.py --out bench/results/raw     # a GPU: about a minute
    python bench/eager_ops.py --out /tmp/eager --cpu      # smoke run: tiny shapes on the CPU

Cases (bf16 on a GPU; float32, tiny, on the CPU):

* ``layer_norm`` of ``(N, 1024)`` activations, N = 64 and 4096, with a gain and a bias, against
  ``torch.nn.functional.layer_norm``;
* ``fused_lstm_gates`` of a merged ``(N, 4K)`` gate tensor, K = 1024, against the unfused sequence
  (``chunk``, ``sigmoid``, ``tanh``, products);
* one attention step with ``BlocksparseTransformer`` (``query_key_op``, ``masked_softmax``,
  ``weight_value_op``; a causal layout of 64-blocks, 4 heads of 64, 2 x ctx tokens, ctx = 512 and
  4096) against ``scaled_dot_product_attention`` with the same block mask as a dense boolean mask.

Each callable is first checked against float64 (the formulas of :mod:`blocksparse.testing`: the
forward's output and the first input's gradient).  Then, per mode -- ``fwd`` (under ``no_grad``)
and ``fwd+bwd`` (``backward`` of the output with a fixed output gradient) -- ``eager_us`` is the
wall time of ``--calls`` back-to-back calls between two synchronisations, divided by their
number: what a training loop sees, the larger of host and GPU time.  ``fwd`` also gets ``host_us``:
the same calls while a sleep kernel queued first keeps the GPU busy, so no call waits for it (host
time alone).  Each metric is the median of ``--rounds`` rounds that interleave ours and PyTorch's.
Writes ``eager-ops-<device>.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402
from blocksparse.testing import attention as attention_ref  # noqa: E402
from blocksparse.testing import norms as norms_ref  # noqa: E402
from blocksparse.torch import BlocksparseTransformer, fused_lstm_gates, layer_norm  # noqa: E402

MODES = ("fwd", "fwd+bwd")


class Case:
    """One op at one size: ``ours`` and ``torch`` take the leaves and return a tuple of outputs;
    ``reference(*leaves64, *douts64)`` returns the float64 outputs and the first leaf's gradient."""

    def __init__(self, name, leaves, ours, torch_fn, reference):
        self.name, self.leaves, self.ours, self.torch, self.reference = name, leaves, ours, torch_fn, reference
        self.douts = [torch.randn_like(o.detach()) for o in ours(*leaves)]


def layer_norm_case(n, c, dtype, device):
    x, g, b = (torch.randn(shape, device=device).to(dtype).requires_grad_() for shape in ((n, c), (c,), (c,)))

    def reference(x, g, b, dy):
        (dx, _, _) = norms_ref.layer_norm_grad(dy, x, g, b, epsilon=1e-5, xp=torch)
        return (norms_ref.layer_norm(x, g, b, epsilon=1e-5, xp=torch),), dx

    return Case(f"layer_norm {n}x{c}", (x, g, b), lambda x, g, b: (layer_norm(x, g, b, epsilon=1e-5),),
                lambda x, g, b: (F.layer_norm(x, (c,), g, b, eps=1e-5),), reference)


def _gates(c, h):
    i, j, f, o = h.chunk(4, 1)
    c_next = torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(j)
    return c_next, torch.sigmoid(o) * torch.tanh(c_next)


def lstm_case(n, k, dtype, device):
    c, h = (torch.randn(shape, device=device).to(dtype).requires_grad_() for shape in ((n, k), (n, 4 * k)))

    def reference(c, h, dc_next, dh_next):
        dc, _, _ = norms_ref.lstm_gates_grad(dc_next, dh_next, c, h, xp=torch)
        return norms_ref.lstm_gates(c, h, xp=torch), dc

    return Case(f"lstm_gates {n}x{k}", (c, h), fused_lstm_gates, _gates, reference)


def attention_case(ctx, heads, head_dim, bs, dtype, device, batch=2):
    blocks = ctx // bs
    bst = BlocksparseTransformer(np.tril(np.ones((blocks, blocks), bool)), bs, heads=heads)
    mask = torch.from_numpy(np.kron(np.tril(np.ones((blocks, blocks), bool)), np.ones((bs, bs), bool))).to(device)
    q, k, v = (torch.randn(batch, ctx, heads * head_dim, device=device).to(dtype).requires_grad_() for _ in range(3))
    scale = head_dim ** -0.5

    def ours(q, k, v):
        return (bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), scale=scale), v),)

    def dense(q, k, v):
        q4, k4, v4 = (t.unflatten(2, (heads, head_dim)).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale)
        return (o.transpose(1, 2).flatten(2),)

    def reference(q, k, v, do):
        o, dq, _, _ = attention_ref.attention(bst.layout, *(t.cpu().numpy() for t in (q, k, v, do)), scale)
        return (torch.from_numpy(o),), torch.from_numpy(dq)

    return Case(f"attention step {batch}x{ctx}", (q, k, v), ours, dense, reference)


def check(case, fn):
    """The largest relative error of ``fn``'s outputs and first-leaf gradient against float64."""
    outs = fn(*case.leaves)
    (grad,) = torch.autograd.grad(outs, case.leaves[:1], case.douts)
    wants, want_grad = case.reference(*(t.detach().double() for t in (*case.leaves, *case.douts)))
    pairs = [*zip(outs, wants), (grad, want_grad)]
    return max(common.rel_err(got.detach().cpu(), want.cpu()) for got, want in pairs)


def _calls(case, fn, mode):
    if mode == "fwd":
        def call():
            with torch.no_grad():
                fn(*case.leaves)
    else:
        def call():
            torch.autograd.backward(fn(*case.leaves), case.douts)
    return call


def eager_us(call, calls, sync):
    for _ in range(3):
        call()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def host_us(call, calls):
    """Host time of ``calls`` calls while the GPU is kept busy (nothing waits for it)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(5e6 * calls))  # about 3 ms a call at 1.7 GHz: longer than the calls' host time
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def run(cases, rounds, calls, gpu):
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    rows = []
    for case in cases:
        errors = {impl: check(case, fn) for impl, fn in (("ours", case.ours), ("torch", case.torch))}
        tol = common.tolerance(case.leaves[0].dtype)
        for mode in MODES:
            samples = {impl: {"eager_us": [], "host_us": []} for impl in errors}
            for _ in range(rounds):
                for impl, fn in (("ours", case.ours), ("torch", case.torch)):
                    call = _calls(case, fn, mode)
                    samples[impl]["eager_us"].append(eager_us(call, calls, sync))
                    if gpu and mode == "fwd":
                        samples[impl]["host_us"].append(host_us(call, calls))
            for impl, metrics in samples.items():
                row = dict(case=case.name, impl=impl, mode=mode, rel_err=errors[impl], ok=errors[impl] <= tol,
                           **{k: round(statistics.median(v), 1) for k, v in metrics.items() if v})
                rows.append(row)
                print(row, flush=True)
    return rows


def markdown(meta, rows):
    out = [f"# Eager calls on {meta['device']}", "",
           f"torch {meta['torch']}, {meta['date']}, {meta['dtype']}; µs per call, the median of {meta['rounds']} "
           f"interleaved rounds of {meta['calls']} calls; `host` = host time alone (forward). Produced by "
           "`bench/eager_ops.py`.", "",
           "| case | mode | ours eager | torch eager | ours host | torch host | ours / torch |", "|---" * 7 + "|"]
    index = {(r["case"], r["mode"], r["impl"]): r for r in rows}
    for case, mode in dict.fromkeys((r["case"], r["mode"]) for r in rows):
        ours, base = index.get((case, mode, "ours"), {}), index.get((case, mode, "torch"), {})
        ratio = ours["eager_us"] / base["eager_us"] if ours.get("eager_us") and base.get("eager_us") else float("nan")
        cells = [f"{ours.get('eager_us', '-')}{'' if ours.get('ok') else ' !'}", base.get("eager_us", "-"),
                 ours.get("host_us", "-"), base.get("host_us", "-"), f"{ratio:.2f}"]
        out.append(f"| {case} | {mode} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out + ["", "`!`: outside the dtype's tolerance against float64 (none expected).", ""])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/raw")
    ap.add_argument("--cpu", action="store_true", help="tiny float32 shapes on the CPU (a smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; CPU 1)")
    ap.add_argument("--calls", type=int, default=None, help="calls per timing (default 200; CPU 2)")
    args = ap.parse_args()
    gpu = not args.cpu
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    rounds, calls = args.rounds or (5 if gpu else 1), args.calls or (200 if gpu else 2)
    torch.manual_seed(0)
    if gpu:
        cases = [layer_norm_case(64, 1024, dtype, device), layer_norm_case(4096, 1024, dtype, device),
                 lstm_case(64, 1024, dtype, device), lstm_case(4096, 1024, dtype, device),
                 attention_case(512, 4, 64, 64, dtype, device), attention_case(4096, 4, 64, 64, dtype, device)]
    else:
        cases = [layer_norm_case(8, 32, dtype, device), lstm_case(8, 16, dtype, device),
                 attention_case(32, 2, 16, 16, dtype, device)]
    meta = dict(device=torch.cuda.get_device_name() if gpu else "CPU", torch=torch.__version__,
                date=time.strftime("%Y-%m-%d"), dtype=str(dtype).replace("torch.", ""), rounds=rounds, calls=calls)
    stem = "eager-ops-" + ("h200" if gpu and "H200" in meta["device"] else "gpu" if gpu else "cpu")
    rows = run(cases, rounds, calls, gpu)
    common.result_writer(args.out, stem, meta, markdown)(rows)
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows)} rows, {len(bad)} outside tolerance -> {args.out}/{stem}.md")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
