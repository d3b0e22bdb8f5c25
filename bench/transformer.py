"""BlocksparseTransformer benchmark on a GPU: the unfused ops (nt -> masked softmax -> nn, and their
backward) vs FlexAttention with the equivalent BlockMask vs dense flash SDPA (causal).

    python bench/transformer.py --out bench/results          (about 3-5 minutes on an H200)
    python bench/transformer.py --out /tmp/t --quick         (one small case per layout, < 1 minute)
    python bench/transformer.py --out /tmp/t --quick --cpu   (Triton's interpreter, tiny sizes: a smoke run)

Cases: bf16, 16 heads, sequence 4096 (batch 4) and 16384 (batch 1), head dim 64 and 128, block
size 64, causal attention inside two block layouts: ``causal`` (every block on or below the
diagonal) and ``local+strided`` (a band of 4 blocks plus every 8th key block column, the shape of
the Sparse-Transformer "fixed" layout).  For each: forward, and forward + backward (dq, dk, dv).

Every case is checked first: our output and dq on two heads against float32 dense attention with
the same mask (outputs NaN-poisoned), and FlexAttention's output against ours.  A case that fails
is recorded with its error and the run goes on; results are written after every case, so an
interrupted run leaves the finished cases.  ``--budget`` seconds stops starting new cases.
Writes ``transformer-h200.json`` and ``transformer-h200.md`` (``--tag`` changes the name) into ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback

CPU = "--cpu" in sys.argv
if CPU:  # before any kernel is decorated
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["BLOCKSPARSE_BACKEND"] = "triton"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402
from blocksparse.torch import BlocksparseTransformer  # noqa: E402

HEADS = 16
BLOCK = 64
SEQS = {4096: 4, 16384: 1}      # sequence -> batch
HEAD_DIMS = (64, 128)
LAYOUTS = ("causal", "local+strided")
CHECK_HEADS = 2                  # heads checked against dense float32 attention


def block_layout(kind, blocks):
    """The ``(blocks, blocks)`` 0/1 layout of ``kind`` (causal inside is applied by the ops)."""
    q, k = np.indices((blocks, blocks))
    if kind == "causal":
        keep = k <= q
    else:  # a band of 4 blocks and every 8th key block column, below the diagonal
        keep = (k <= q) & ((q - k < 4) | (k % 8 == 7))
    return keep.astype(np.int32)


def cases(quick):
    seqs = {64: 1} if CPU else ({4096: 4} if quick else SEQS)
    dims = (16,) if CPU else ((128,) if quick else HEAD_DIMS)
    for seq, batch in seqs.items():
        for d in dims:
            for kind in LAYOUTS:
                yield dict(seq=seq, batch=batch, head_dim=d, layout=kind)


def _split(t, heads):
    """``(N, S, H*D) -> (N, H, S, D)``."""
    n, s, f = t.shape
    return t.view(n, s, heads, f // heads).transpose(1, 2)


class Case:
    def __init__(self, seq, batch, head_dim, layout, heads, block, device):
        self.seq, self.batch, self.d, self.kind, self.heads = seq, batch, head_dim, layout, heads
        self.mask = block_layout(layout, seq // block)
        # causal inside every block (a no-op below the diagonal): autoregress_at_key=0
        self.bst = BlocksparseTransformer(self.mask, block, heads=heads)
        self.scale = head_dim ** -0.5
        g = torch.Generator(device=device).manual_seed(seq + head_dim)
        shape = (batch, seq, heads * head_dim)
        self.q, self.k, self.v, self.do = (torch.randn(shape, device=device, generator=g, dtype=torch.bfloat16)
                                           for _ in range(4))
        self.kept = float(self.mask.sum()) / self.mask.size

    def ours(self, q, k, v):
        p = self.bst.masked_softmax(self.bst.query_key_op(q, k), self.scale, autoregress_at_key=0)
        return self.bst.weight_value_op(p, v)

    def dense_mask(self, device):
        """``(S, S)`` booleans of the kept elements."""
        bs = self.seq // self.mask.shape[0]
        blocks = torch.from_numpy(self.mask).to(device).bool()
        full = blocks.repeat_interleave(bs, 0).repeat_interleave(bs, 1)
        return full & torch.ones_like(full).tril()

    def check(self):
        """Relative errors of our o and dq (first heads) against float32 dense attention."""
        h, d = CHECK_HEADS, self.d
        leaves = [t.detach().clone().requires_grad_() for t in (self.q, self.k, self.v)]
        with common.poisoned_empty():
            out = self.ours(*leaves)
            out.backward(self.do)
        sub = [t[..., :h * d].float().detach().requires_grad_() for t in (self.q, self.k, self.v)]
        s = _split(sub[0], h) @ _split(sub[1], h).transpose(-1, -2) * self.scale
        s = s.masked_fill(~self.dense_mask(s.device), float("-inf"))
        ref = (torch.softmax(s, dim=-1) @ _split(sub[2], h)).transpose(1, 2).reshape(self.batch, self.seq, h * d)
        ref.backward(self.do[..., :h * d].float())
        return {"err_o": common.rel_err(out[..., :h * d], ref), "err_dq": common.rel_err(leaves[0].grad[..., :h * d],
                                                                                       sub[0].grad)}, out

    def fwd_bwd(self, forward):
        leaves = [t.detach().clone().requires_grad_() for t in (self.q, self.k, self.v)]

        def run():
            out = forward(*leaves)
            torch.autograd.grad(out, leaves, self.do)
        return run


_flex_compiled = None


def flex_fns(case):
    """FlexAttention forward with the case's BlockMask on ``(N, S, H*D)`` tensors (compiled on a GPU;
    eager on the CPU, where only the code path is exercised)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = case.q.device
    blocks = torch.from_numpy(case.mask).to(device).bool()
    bs = case.seq // case.mask.shape[0]

    def mask_mod(b, h, q_idx, kv_idx):
        return blocks[q_idx // bs, kv_idx // bs] & (kv_idx <= q_idx)

    block_mask = create_block_mask(mask_mod, None, None, case.seq, case.seq, device=device,
                                   BLOCK_SIZE=min(128, case.seq))
    global _flex_compiled
    if _flex_compiled is None:  # one compiled function: cases of equal shapes share its compilations
        # static kernels per shape (as bench/attention.py: dynamic ones ran slower after a second shape)
        _flex_compiled = flex_attention if CPU else torch.compile(flex_attention, dynamic=False)
    compiled = _flex_compiled

    def forward(q, k, v):
        o = compiled(_split(q, case.heads), _split(k, case.heads), _split(v, case.heads), block_mask=block_mask,
                     scale=case.scale)
        return o.transpose(1, 2).reshape(q.shape)
    return forward


def sdpa_causal(case):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forward(q, k, v):
        with contextlib.nullcontext() if CPU else sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(_split(q, case.heads), _split(k, case.heads), _split(v, case.heads),
                                               is_causal=True, scale=case.scale)
        return o.transpose(1, 2).reshape(q.shape)
    return forward


def timer(fn):
    if not CPU:
        return common.time_ms(fn)
    fn()  # the interpreter's first call compiles nothing; one timed call shows the run works
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def measure(spec):
    row = dict(spec)
    case = Case(**spec, heads=2 if CPU else HEADS, block=16 if CPU else BLOCK, device="cpu" if CPU else "cuda")
    row.update(kept=round(case.kept, 3), heads=case.heads, block=case.bst.block_size)
    errors, out = case.check()
    row.update({k: round(v, 6) for k, v in errors.items()})
    if not all(v < 3 * common.tolerance("bfloat16") for v in errors.values()):
        row["failed"] = "ours differs from dense attention"
        return row
    impls = {"ours": case.ours, "sdpa_causal": sdpa_causal(case)}
    try:
        impls["flex"] = flex_fns(case)
        row["err_flex_vs_ours"] = round(common.rel_err(impls["flex"](case.q, case.k, case.v), out), 6)
    except Exception as exc:  # an old torch, a compile failure: the rest still runs
        row["flex_error"] = f"{type(exc).__name__}: {exc}"
        impls.pop("flex", None)
    for name, forward in impls.items():
        try:
            row[f"{name}_fwd_ms"] = round(timer(lambda: forward(case.q, case.k, case.v)), 4)
            row[f"{name}_fwdbwd_ms"] = round(timer(case.fwd_bwd(forward)), 4)
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
    for base in ("flex", "sdpa_causal"):
        for what in ("fwd", "fwdbwd"):
            if f"ours_{what}_ms" in row and f"{base}_{what}_ms" in row:
                row[f"speedup_vs_{base}_{what}"] = round(row[f"{base}_{what}_ms"] / row[f"ours_{what}_ms"], 3)
    return row


def markdown(meta, rows):
    heads, block = (rows[0].get("heads", "?"), rows[0].get("block", "?")) if rows else ("?", "?")
    lines = [f"# BlocksparseTransformer (unfused ops) on {meta['device']}", "",
             f"{meta['when']}, torch {meta['torch']}, triton {meta['triton']}; bf16, {heads}"
             f" heads, block {block}, causal inside the layout.  ms = median; "
             "speedup = baseline ms / our ms (> 1: we are faster).", "",
             "| S | D | layout (kept) | ours fwd / fwd+bwd | Flex fwd / fwd+bwd | flash SDPA causal fwd / fwd+bwd "
             "| vs Flex | vs SDPA | err o / dq |", "|---|---|---|---|---|---|---|---|---|"]

    def pair(row, name):
        a, b = row.get(f"{name}_fwd_ms"), row.get(f"{name}_fwdbwd_ms")
        return "–" if a is None else f"{a:.3f} / {b:.3f}" if b is not None else f"{a:.3f} / –"

    def ratio(row, base):
        a, b = row.get(f"speedup_vs_{base}_fwd"), row.get(f"speedup_vs_{base}_fwdbwd")
        return "–" if a is None else f"{a:.2f} / {b if b is not None else '–'}"

    for r in rows:
        if "failed" in r or "error" in r:
            lines.append(f"| {r['seq']} | {r['head_dim']} | {r['layout']} | {r.get('failed') or r.get('error')} "
                         "| | | | | |")
            continue
        lines.append(f"| {r['seq']} | {r['head_dim']} | {r['layout']} ({100 * r['kept']:.0f}%) | {pair(r, 'ours')} | "
                     f"{pair(r, 'flex')} | {pair(r, 'sdpa_causal')} | {ratio(r, 'flex')} | {ratio(r, 'sdpa_causal')} "
                     f"| {r['err_o']:.1e} / {r['err_dq']:.1e} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON and Markdown results")
    ap.add_argument("--quick", action="store_true", help="one small case per layout")
    ap.add_argument("--cpu", action="store_true", help="Triton's interpreter on the CPU, tiny sizes (a smoke run)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds after which no new case starts")
    ap.add_argument("--tag", default="transformer-h200", help="file name stem of the results")
    args = ap.parse_args()
    if not CPU and not torch.cuda.is_available():
        sys.exit("no CUDA GPU: run with --cpu for a smoke run through Triton's interpreter")
    import triton

    os.makedirs(args.out, exist_ok=True)
    meta = dict(device="CPU (Triton interpreter)" if CPU else torch.cuda.get_device_name(),
                when=time.strftime("%Y-%m-%d %H:%M"), torch=torch.__version__, triton=triton.__version__)
    rows, start = [], time.time()
    for spec in cases(args.quick):
        if time.time() - start > args.budget:
            rows.append(dict(spec, error=f"not run: the {args.budget:.0f} s budget was spent"))
            continue
        t0 = time.time()
        try:
            row = measure(spec)
        except Exception as exc:  # keep going: one case must not lose the others
            row = dict(spec, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=4))
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(args.out, f"{args.tag}.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        with open(os.path.join(args.out, f"{args.tag}.md"), "w") as f:
            f.write(markdown(meta, rows))
        if not CPU:
            torch.cuda.empty_cache()
    failed = [r for r in rows if "failed" in r or "error" in r]
    print(f"{len(rows) - len(failed)} of {len(rows)} cases measured; results in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
