"""``bench/axis0.py --markdown``: the committed (C, N) table is rebuilt from its JSON rows."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_table_pairs_the_layouts_of_each_problem(tmp_path):
    runs = ROOT / "bench" / "results" / "axis0.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "axis0.py"), "--out", str(tmp_path),
                           "--markdown", f"run={runs}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "axis0.md").read_text()
    lines = [l for l in table.splitlines() if l.startswith("| bfloat16") or l.startswith("| float32")]
    assert len(lines) == 5 * 5  # five problems, five timings each, both layouts in one row
    fields = lines[0].split("|")
    assert abs(float(fields[5]) / float(fields[4]) - float(fields[6])) < 0.01  # C/N = (C, N) / (N, C)
