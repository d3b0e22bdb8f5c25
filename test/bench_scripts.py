"""The benchmark scripts (``bench/``) run as their docstrings say, for the tests of their smoke runs."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def run_bench(script, *args, timeout=600):
    """Run ``bench/<script>`` with ``args`` from the repository root; assert that it exited 0 (the
    tail of its output in the message) and return the finished process."""
    done = subprocess.run([sys.executable, str(BENCH / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
