"""One real cell, end to end: the local executor runs scripts/run_cell.sh, which builds the real
wheel, installs it, and runs planted tests against it with the known failures applied.

No download: the cell's virtualenv is made here beforehand and sees the development
environment's packages (TensorFlow, pytest ...) through a .pth file, so the executor takes its
"reuse" path.  Everything after that -- build, install, test, reports -- is the real thing.
"""
import hashlib
import io
import json
import re
import shutil
import subprocess
import sysconfig

import pytest

from harness.environment import cell_requirements, read_pins
from harness.matrix import load_matrix
from harness.progress import Progress
from harness.run import RunOptions, run_matrix
from harness_support import CELL, EXPECTED, SMOKE_ARCHS, planted_project


@pytest.mark.slow
def test_one_cell_end_to_end(tmp_path):
    python = shutil.which("python3.11")
    if python is None:
        pytest.skip("python3.11 not on PATH")
    project = planted_project(tmp_path)
    (cell,) = [c for c in load_matrix(project / "matrix.yaml") if c.name == CELL]
    venv = project / ".matrix" / CELL / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    (next(venv.glob("lib/python3.11/site-packages")) / "dev-environment.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    pins = read_pins(project / "requirements" / "dev.txt")
    (venv / "cell-requirements.txt").write_text("\n".join(cell_requirements(cell, "cpu", pins))
                                                + "\n")

    out = io.StringIO()
    extra = str(project / "checks" / "test_extra.py")  # absolute, outside test/
    options = RunOptions(cells=f"^{CELL}$", test_timeout=60, archs=SMOKE_ARCHS,
                         pytest_args=("test/test_planted.py", extra))
    code = run_matrix(project, options, progress=Progress(out, live=False), out=out)

    log = (project / "reports" / CELL / "log.txt").read_text()
    assert "local: reusing" in log
    assert f"run_cell: testing {venv}/lib/python3.11/site-packages/blocksparse/__init__.py" in log
    entry = json.loads((project / "reports" / "summary.json").read_text())["cells"][CELL]
    assert code == 1, log
    outcomes = json.loads((project / "reports" / CELL / "outcomes.json").read_text())["tests"]
    assert {k: v["outcome"] for k, v in outcomes.items()} == EXPECTED  # as in a container
    assert entry["status"] == "regressed", log
    assert entry["regressions"] == ["test/test_planted.py::test_new"]
    assert entry["known"] == ["test/test_planted.py::test_hangs",
                              "test/test_planted.py::test_known"]
    assert entry["fixed"] == ["test/test_planted.py::test_fixed"]
    assert [e["entry"] for e in entry["fixed_entries"]] == [2]
    assert entry["flaky"] == ["test/test_planted.py::test_flaky"]
    assert (entry["passed"], entry["skipped"]) == (2, 0)
    assert [e["entry"] for e in entry["stale_entries"]] == [6]
    # the platform wheel with the TensorFlow op library (its tag follows the library's glibc needs)
    (wheel,) = entry["wheels"]
    assert re.fullmatch(rf"dist/{re.escape(CELL)}/blocksparse-2\.21\.0-py3-none-manylinux_2_\d+_x86_64\.whl",
                        wheel["path"]), wheel
    assert wheel["sha256"] == hashlib.sha256((project / wheel["path"]).read_bytes()).hexdigest()
    assert (entry["commit"], entry["pytest_args"]) == (None, ["test/test_planted.py", "checks/test_extra.py"])
    junit = (project / "reports" / CELL / "junit.xml").read_text()
    assert junit.count("<testcase ") == 7 and f'name="{CELL}"' in junit
    assert not (project / "test" / "flaky-ran-once").exists()  # tests ran from a copy
    steps = [line.split(" · ")[1] for line in out.getvalue().splitlines() if " · " in line]
    assert steps == ["setup", "build", "install", "test"]
