"""Sweep 17's winner in the large pixelfly MLP: pick it, then time the MLP with it installed.

    python bench/persist_ab.py pick persist.jsonl                       # the winner against the table
    python bench/persist_ab.py rounds persist.jsonl LABEL --out DIR     # pixelfly_rounds.py with it
    BLOCKSPARSE_PERSISTENT=off python bench/pixelfly_rounds.py LABEL-off --out DIR   # the baseline

``pick`` sums each persistent tile's time over the sweep's eight (product, direction) rows and
takes the least sum among tiles correct on every row; ``rounds`` puts that tile in
``configs.PERSISTENT_XPROP`` for 16-bit large-token blocks of 128 (the refined pixelfly layers'
key) in this process only, then runs ``pixelfly_rounds.py``.  Run the two rounds in separate
processes so each compiles and caches alone.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from blocksparse.ops.matmul import configs  # noqa: E402
from blocksparse.ops.matmul.configs import XpropConfig  # noqa: E402


def pick(path):
    """``(winner cfg dict, its total µs, the table tile's total µs, per-row lines)``."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by_cfg = {}
    for r in rows:
        key = json.dumps(r["cfg"], sort_keys=True)
        by_cfg.setdefault(key, []).append(r)
    cases = {(tuple(r["problem"]), r["op"]) for r in rows}
    totals = {k: sum(r["us"] for r in rs) for k, rs in by_cfg.items()
              if len(rs) == len(cases) and all(r["ok"] for r in rs)}
    table = [k for k in totals if not json.loads(k).get("PERSIST")]
    persistent = [k for k in totals if json.loads(k).get("PERSIST")]
    if not persistent:
        sys.exit(f"{path}: no persistent tile ran correctly on all {len(cases)} rows")
    best = min(persistent, key=totals.get)
    lines = []
    for r in sorted(by_cfg[best], key=lambda r: (r["problem"], r["op"])):
        base = [t for t in rows if t["problem"] == r["problem"] and t["op"] == r["op"]
                and not t["cfg"].get("PERSIST")]
        lines.append(f"{r['problem']} {r['op']}: {r['us']:.1f} µs against the table's "
                     f"{min(t['us'] for t in base):.1f}")
    return json.loads(best), totals[best], min((totals[k] for k in table), default=float("nan")), lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("pick", "rounds"))
    ap.add_argument("jsonl")
    ap.add_argument("label", nargs="?", default="persistent")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    cfg, total, table, lines = pick(args.jsonl)
    print("winner", cfg, f"{total:.1f} µs over the rows, table tile {table:.1f}", *lines, sep="\n")
    if args.what == "rounds":
        configs.PERSISTENT_XPROP[("16bit", "large")] = {128: XpropConfig(**cfg)}
        import pixelfly_rounds

        sys.argv = [sys.argv[0], args.label, "--out", args.out]
        pixelfly_rounds.main()


if __name__ == "__main__":
    main()
