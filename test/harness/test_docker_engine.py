"""The docker executor against a real Docker Engine (``make docker-engine``): a cell with planted
failures in a container, a container killed mid-run, Ctrl-C, and no engine at all.

The image of the tf2.21 / Python 3.11 cell is built from the local Debian base the first time
(minutes) and reused after that; every test checks that no container of ours is left behind.
"""
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness.executors.docker import LABEL, PROJECT_LABEL, DockerExecutor
from harness.matrix import load_matrix
from harness.progress import Progress
from harness.render import ROOT
from harness.run import RunOptions, run_matrix
from harness.source import stage_tree
from harness_support import CELL, EXPECTED, SMOKE_ARCHS, planted_project

# Minutes each (a wheel build, an image build when its recipe is new): far over the default.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(3600)]


def ours(client, project):
    """This test's containers (another checkout may be running cells at the same time)."""
    return client.containers.list(all=True, filters={
        "label": [LABEL, f"{PROJECT_LABEL}={project.resolve()}"]})


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def cell_step(project, step):
    log = project / "reports" / CELL / "log.txt"
    return log.is_file() and f"::cell-step:: {step}" in log.read_text(errors="replace")


def docker_options(cells=f"^{CELL}$", **kw):
    return RunOptions(executor="docker", docker_base="local", cells=cells, archs=SMOKE_ARCHS, **kw)


def test_planted_failures_in_a_container(engine, tmp_path):
    project = planted_project(tmp_path)
    extra = str(project / "checks" / "test_extra.py")  # absolute, outside test/
    out = io.StringIO()
    code = run_matrix(project, docker_options(test_timeout=60,
                                              pytest_args=("test/test_planted.py", extra)),
                      progress=Progress(out, live=False), out=out)
    log = (project / "reports" / CELL / "log.txt").read_text()
    assert code == 1, log
    # The wheel was built in the container, against the container's TensorFlow.
    assert "run_cell: testing /opt/cell/lib/python3.11/site-packages/blocksparse/" in log
    outcomes = json.loads((project / "reports" / CELL / "outcomes.json").read_text())["tests"]
    assert {k: v["outcome"] for k, v in outcomes.items()} == EXPECTED  # as in a virtualenv
    entry = json.loads((project / "reports" / "summary.json").read_text())["cells"][CELL]
    assert entry["status"] == "regressed" and entry["executor"] == "docker"
    assert [e["entry"] for e in entry["fixed_entries"]] == [2]
    assert [e["entry"] for e in entry["stale_entries"]] == [6]
    (wheel,) = entry["wheels"]
    assert re.fullmatch(rf"dist/{re.escape(CELL)}/blocksparse-2\.21\.0-py3-none-manylinux_2_\d+"
                        r"_x86_64\.whl", wheel["path"]), wheel
    assert wheel["sha256"] == hashlib.sha256((project / wheel["path"]).read_bytes()).hexdigest()
    assert (project / wheel["path"]).stat().st_uid == os.getuid()
    assert ours(engine, project) == []
    # The image is tagged by its recipe: asked again, it is reused, nothing is built.
    lines = []
    executor = DockerExecutor(repo=project, base="local")
    executor.check(io.StringIO())
    (cell,) = [c for c in load_matrix(project / "matrix.yaml") if c.name == CELL]
    tag, failed = executor._image(cell, lines.append)
    assert failed is None and tag.startswith(f"blocksparse-cell:{CELL}-")
    assert lines == [f"docker: image {tag} is up to date (built from the same recipe): reused"]


def test_killed_container_is_an_error_and_the_run_goes_on(engine, tmp_path):
    project = stage_tree(ROOT, tmp_path / "project")
    result = {}
    # Two cells: the killed one, then one that carries on (quickly: skipped, as if this machine
    # had no Python 3.13 to copy into the base).
    options = docker_options(cells=r"^tf2\.21-cu12\.5-py3\.1[13]$",
                             pytest_args=("test/test_layout.py",))
    executor = DockerExecutor(repo=project, base="local",
                              find_python=lambda version, log: (None, "none here"))
    thread = threading.Thread(target=lambda: result.update(code=run_matrix(
        project, options, executor=executor, progress=Progress(io.StringIO(), live=False),
        out=io.StringIO())))
    thread.start()
    try:
        wait_for(lambda: cell_step(project, "build"), 900, "the cell's build step")
        (container,) = ours(engine, project)
        container.kill()
    finally:
        thread.join(900)
    assert result["code"] == 1
    summary = json.loads((project / "reports" / "summary.json").read_text())
    killed = summary["cells"][CELL]
    assert killed["status"] == "error"
    assert killed["reason"] == ("the container was stopped by SIGKILL before the cell finished "
                                "(docker kill or stop, or the engine)")
    assert summary["cells"]["tf2.21-cu12.5-py3.13"]["status"] == "skipped"
    assert ours(engine, project) == []


def sigint_default():
    # A background job of a non-interactive shell starts with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give the child what a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_and_removes_the_container(engine, tmp_path):
    project = stage_tree(ROOT, tmp_path / "project")
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness", "--root", str(project), "matrix",
             "--executor=docker", "--docker-base=local", f"--cells=^{CELL}$",
             "--pytest-args=test/test_layout.py"], stdout=out, stderr=subprocess.STDOUT,
            cwd=ROOT, preexec_fn=sigint_default)
        try:
            wait_for(lambda: cell_step(project, "build"), 900, "the cell's build step")
            assert len(ours(engine, project)) == 1
            proc.send_signal(signal.SIGINT)
            assert proc.wait(120) == 130
        finally:
            proc.kill()
    assert "interrupted" in (tmp_path / "out.txt").read_text()
    assert ours(engine, project) == []


def test_no_engine_is_a_clear_error_before_anything_is_touched(tmp_path):
    project = stage_tree(ROOT, tmp_path / "project")
    (project / "reports").mkdir()
    (project / "reports" / "summary.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "harness", "--root", str(project), "matrix", "--executor=docker",
         f"--cells=^{CELL}$"], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert done.returncode == 11, done.stderr
    assert "error: EXECUTOR=docker: no Docker engine answers" in done.stderr
    assert "make docker-engine" in done.stderr
    assert [p.name for p in (project / "reports").iterdir()] == ["summary.json"]
    assert (project / "reports" / "summary.json").read_text() == "{}"
    assert not (project / ".matrix").exists()
