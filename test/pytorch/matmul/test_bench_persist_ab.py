"""``bench/persist_ab.py pick``: the persistent tile with the least total time over every row,
among those correct on all rows, against the table's tile."""
import json
import random

from bench_scripts import run_bench

TABLE = {"BM": 256, "num_warps": 8, "num_stages": 4, "PERSIST": 0}
FAST = {"BM": 128, "num_warps": 4, "num_stages": 3, "PERSIST": 2, "SUBTILE": True}
WRONG = {"BM": 256, "num_warps": 8, "num_stages": 3, "PERSIST": 1}  # fastest, but wrong on one row
SLOW = {"BM": 128, "num_warps": 8, "num_stages": 5, "PERSIST": 1}


def test_pick_takes_the_fastest_correct_persistent_tile(tmp_path):
    rng = random.Random()
    rows = []
    for problem in (["pixelfly", 8192, 2048, 8192], ["pixelfly", 8192, 8192, 4096]):
        for op in ("fprop", "bprop"):
            base = rng.uniform(100, 300)
            for cfg, factor, ok in ((TABLE, 1.0, True), (FAST, 1.1, True), (WRONG, 0.5, op == "fprop"),
                                    (SLOW, 1.3, True)):
                rows.append(dict(problem=problem, op=op, cfg=cfg, us=base * factor, ok=ok))
    path = tmp_path / "persist.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rng.sample(rows, len(rows))))
    out = run_bench("persist_ab.py", "pick", path).stdout
    winner = json.loads(out.splitlines()[1].replace("'", '"').replace("True", "true"))
    assert winner == FAST
    table = sum(r["us"] for r in rows if r["cfg"] is TABLE)
    fast = sum(r["us"] for r in rows if r["cfg"] is FAST)
    assert f"{fast:.1f} µs over the rows, table tile {table:.1f}" in out
