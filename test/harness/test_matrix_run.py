"""`make matrix` end to end with a fake executor: planning, outputs, summary, exit code."""
import json
import os
import random
import subprocess

import pytest
import yaml

from harness.cli import main
from harness.errors import ConfigError, ExecutorUnavailable, StaleFilesError
from harness.executors import CellRun
from harness.matrix import load_matrix
from harness.release_gate import load_summary, stale_reason
from harness.render import README_BEGIN, README_END
from harness.run import RunOptions, rebuild_report, run_matrix
from harness_support import BUILD, PINS

MATRIX = {"builds": [{**BUILD, "python": ["3.11", "3.13"]},
                     {**BUILD, "tensorflow": "2.20", "python": ["3.12"]}]}


@pytest.fixture
def project(tmp_path):
    """A minimal project: matrix, known failures, pins, README, one source file."""
    root = tmp_path / "project"
    (root / "ci").mkdir(parents=True)
    (root / "requirements").mkdir()
    (root / "test").mkdir()
    (root / "matrix.yaml").write_text(yaml.safe_dump(MATRIX))
    (root / "ci" / "known_failures.yaml").write_text(yaml.safe_dump(
        [{"test": "test/test_a.py::test_old", "kind": "fail", "reason": "old"}]))
    (root / "requirements" / "dev.txt").write_text("\n".join(PINS.values()) + "\n")
    (root / "README.md").write_text(f"{README_BEGIN}\n{README_END}\n")
    (root / "test" / "test_a.py").write_text("def test_ok():\n    pass\n")
    (root / ".venv").mkdir()
    (root / ".venv" / "big").write_text("not for cells")
    return root


class FakeExecutor:
    """Plays a cell: checks the staged input, writes what the script would, returns a result."""

    name = "fake"

    def __init__(self, outcomes):
        self.outcomes = outcomes  # cell name -> (CellRun, tests or None)
        self.jobs = []
        self.checked = False

    def check(self, out):
        self.checked = True

    def run(self, job, log):
        self.jobs.append(job)
        assert (job.stage / "src" / "test" / "test_a.py").is_file()
        assert not (job.stage / "src" / ".venv").exists()
        known = json.loads((job.stage / "known_failures.json").read_text())
        assert known["entries"][0]["test"] == "test/test_a.py::test_old"
        run, tests = self.outcomes[job.cell.name]
        log("::cell-step:: build")
        (job.dist / "blocksparse-2.21.0-py3-none-any.whl").write_bytes(os.urandom(32))
        if tests is not None:
            log("::cell-step:: test")
            (job.reports / "outcomes.json").write_text(json.dumps(
                {"cell": job.cell.name, "source": "ci/known_failures.yaml", "exitstatus": 0,
                 "tests": tests}))
        return run


class FakeProgress:
    def __init__(self):
        self.events = []

    def start(self, total):
        self.events.append(("start", total))

    def start_cell(self, index, name):
        self.events.append(("cell", index, name))

    def step(self, name):
        self.events.append(("step", name))

    def finish_cell(self, status, detail=""):
        self.events.append(("finish", status))

    def message(self, text):
        self.events.append(("message", text))

    def close(self):
        self.events.append(("close",))


def passing(*names):
    return {n: {"outcome": "passed", "entry": None, "attempts": 1, "message": ""} for n in names}


OUTCOMES = {
    "tf2.21-cu12.5-py3.11": (CellRun(returncode=0), passing("test/test_a.py::test_ok")),
    "tf2.21-cu12.5-py3.13": (CellRun(skipped="python3.13 not found on PATH"), None),
    "tf2.20-cu12.5-py3.12": (CellRun(returncode=1), {
        "test/test_a.py::test_ok": {"outcome": "regression", "entry": None, "attempts": 1,
                                    "message": "AssertionError"}}),
}


def test_run_writes_everything_and_fails_on_a_regression(project, capsys):
    executor, progress = FakeExecutor(OUTCOMES), FakeProgress()
    code = run_matrix(project, RunOptions(), executor=executor, progress=progress)
    assert code == 1
    summary = json.loads((project / "reports" / "summary.json").read_text())
    assert summary["commit"] is None and summary["dirty"] is None  # not a git checkout
    assert not summary["ok"] and summary["executor"] == "fake"
    cells = summary["cells"]
    assert list(cells) == list(OUTCOMES)
    assert [c["status"] for c in cells.values()] == ["passed", "skipped", "regressed"]
    assert cells["tf2.20-cu12.5-py3.12"]["regressions"] == ["test/test_a.py::test_ok"]
    assert cells["tf2.21-cu12.5-py3.13"]["reason"] == "python3.13 not found on PATH"
    for name in OUTCOMES:
        assert json.loads((project / "reports" / name / "result.json").read_text()) == cells[name]
        assert "::cell-step:: build" in (project / "reports" / name / "log.txt").read_text()
    assert (project / "reports" / "matrix.md").is_file()
    assert (project / "reports" / "index.html").is_file()
    assert ("step", "test") in progress.events and progress.events[-1] == ("close",)
    assert ("message", "    regression: test/test_a.py::test_ok: AssertionError") in \
        progress.events
    out = capsys.readouterr().out
    assert "matrix: 3 cell(s), executor local, known-failure entries: 1" in out
    assert "matrix: FAILED" in out


def test_selection_and_pytest_args(project):
    executor = FakeExecutor(OUTCOMES)
    options = RunOptions(cells="tf2.21-.*py3.11",
                         pytest_args=(f"{project}/test/test_a.py::test_ok", "-k", "ok"))
    assert run_matrix(project, options, executor=executor, progress=FakeProgress()) == 0
    (job,) = executor.jobs
    assert job.cell.name == "tf2.21-cu12.5-py3.11"
    assert job.pytest_args == ("test/test_a.py::test_ok", "-k", "ok")
    summary = json.loads((project / "reports" / "summary.json").read_text())
    assert list(summary["cells"]) == ["tf2.21-cu12.5-py3.11"] and summary["ok"]


def commit_all(project):
    """Make ``project`` a git repository with one commit; returns its hash."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    if not (project / ".git").exists():
        subprocess.run([*git, "init", "-q"], cwd=project, check=True)
        (project / ".gitignore").write_text(".venv/\nreports/\ndist/\n.matrix/\n")
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "c", "--allow-empty"], cwd=project, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_commit_and_dirty_come_from_git(project):
    head = commit_all(project)
    options = RunOptions(cells="py3.11")
    run_matrix(project, options, executor=FakeExecutor(OUTCOMES), progress=FakeProgress())
    summary = json.loads((project / "reports" / "summary.json").read_text())
    assert (summary["commit"], summary["dirty"]) == (head, False)
    (project / "test" / "test_a.py").write_text("# edited\n")
    run_matrix(project, options, executor=FakeExecutor(OUTCOMES), progress=FakeProgress())
    summary = json.loads((project / "reports" / "summary.json").read_text())
    assert (summary["commit"], summary["dirty"]) == (head, True)


def test_dry_run_touches_nothing(project, capsys):
    executor = FakeExecutor(OUTCOMES)
    assert run_matrix(project, RunOptions(dry_run=True), executor=executor) == 0
    assert executor.jobs == []
    assert not (project / "reports").exists() and not (project / ".matrix").exists()
    out = capsys.readouterr().out
    assert "tf2.20-cu12.5-py3.12" in out and "tensorflow-cpu==2.20.*" in out
    assert "dry run: nothing built, nothing written" in out


def test_checks_come_before_any_work(project):
    executor = FakeExecutor(OUTCOMES)
    with pytest.raises(StaleFilesError, match="stale generated Dockerfiles.*make render"):
        run_matrix(project, RunOptions(executor="docker"), executor=executor)
    with pytest.raises(ConfigError, match="EXECUTOR must be one of local, docker; got 'k8s'"):
        run_matrix(project, RunOptions(executor="k8s"), executor=executor)
    (project / "ci" / "known_failures.yaml").write_text("- test: x\n  kind: sometimes\n")
    with pytest.raises(ConfigError, match="entry 1 \\(x\\): kind: expected one of"):
        run_matrix(project, RunOptions(), executor=executor)
    assert executor.jobs == [] and not (project / "reports").exists()


def test_report_merges_cell_results(project, capsys):
    run_matrix(project, RunOptions(), executor=FakeExecutor(OUTCOMES), progress=FakeProgress())
    (project / "reports" / "summary.json").unlink()
    assert rebuild_report(project) == 1
    summary = json.loads((project / "reports" / "summary.json").read_text())
    assert list(summary["cells"]) == list(OUTCOMES) and summary["executor"] == "fake"


def test_cli_exit_codes(project, capsys):
    assert main(["--root", str(project), "matrix", "--cells", "tf9", "--dry-run"]) == 2
    assert "error: CELLS='tf9' matches no cell" in capsys.readouterr().err
    assert main(["--root", str(project), "render", "--check"]) == 10
    captured = capsys.readouterr()
    assert "stale: docker/generated/Dockerfile.tf2.20-cu12.5-py3.12" in captured.out
    assert "error: 5 generated file(s) differ from matrix.yaml: run `make render`" in captured.err
    assert main(["--root", str(project), "render"]) == 0
    assert main(["--root", str(project), "render", "--check"]) == 0
    assert main(["--root", str(project), "matrix", "--executor", "docker", "--dry-run"]) == 0


def test_stale_known_failures_in_every_report_format(project, capsys):
    (project / "ci" / "known_failures.yaml").write_text(yaml.safe_dump([
        {"test": "test/test_a.py::test_old", "kind": "fail", "reason": "old"},
        {"test": "test/test_a.py::test_ok", "cells": "tf1\\.15", "kind": "fail",
         "reason": "for a TensorFlow no cell has"}]))
    tests = passing("test/test_a.py::test_ok")
    stale_in_cell = {"entry": 1, "test": "test/test_a.py::test_old", "cells": None, "kind": "fail",
                     "reason": "old", "why": "matches no test collected from test/test_a.py"}

    class StaleExecutor(FakeExecutor):
        def run(self, job, log):
            result = super().run(job, log)
            outcomes = json.loads((job.reports / "outcomes.json").read_text())
            outcomes["stale"] = [stale_in_cell]
            (job.reports / "outcomes.json").write_text(json.dumps(outcomes))
            return result

    executor = StaleExecutor({"tf2.21-cu12.5-py3.11": (CellRun(returncode=0), tests)})
    assert run_matrix(project, RunOptions(cells="tf2.21-.*py3.11"), executor=executor,
                      progress=FakeProgress()) == 0  # stale entries are reported, not fatal
    assert "stale: ci/known_failures.yaml entry 2 (test/test_a.py::test_ok): its cells regex " \
           "'tf1\\\\.15' matches no cell of matrix.yaml; fix or delete it" in capsys.readouterr().out
    summary = json.loads((project / "reports" / "summary.json").read_text())
    assert [e["entry"] for e in summary["stale_entries"]] == [2]
    assert summary["cells"]["tf2.21-cu12.5-py3.11"]["stale_entries"] == [stale_in_cell]
    for name in ("matrix.md", "index.html"):
        text = (project / "reports" / name).read_text()
        assert "Stale known failures" in text and "matches no cell of matrix.yaml" in text
        assert "matches no test collected from test/test_a.py" in text


def test_engine_missing_stops_before_earlier_results_are_touched(project):
    run_matrix(project, RunOptions(), executor=FakeExecutor(OUTCOMES), progress=FakeProgress())
    before = {p: p.read_bytes() for p in (project / "reports").rglob("*") if p.is_file()}
    wheel = project / "dist" / "tf2.21-cu12.5-py3.11" / "blocksparse-2.21.0-py3-none-any.whl"
    assert wheel.is_file()

    class NoEngine(FakeExecutor):
        def check(self, out):
            raise ExecutorUnavailable("EXECUTOR=docker: no Docker engine answers")

    executor = NoEngine(OUTCOMES)
    with pytest.raises(ExecutorUnavailable):
        run_matrix(project, RunOptions(), executor=executor, progress=FakeProgress())
    assert executor.jobs == [] and wheel.is_file()
    assert {p: p.read_bytes() for p in (project / "reports").rglob("*") if p.is_file()} == before


def test_bad_input_is_a_clear_error_and_deletes_nothing(project, capsys):
    main(["--root", str(project), "render"])
    dockerfiles = sorted((project / "docker" / "generated").iterdir())
    text = (project / "matrix.yaml").read_text()
    (project / "matrix.yaml").write_text(text + "builds:\n  - tensorflow: '2.21'\n")
    assert main(["--root", str(project), "render"]) == 2
    err = capsys.readouterr().err
    assert "matrix.yaml: not valid YAML: duplicate key 'builds' (first at line" in err
    assert sorted((project / "docker" / "generated").iterdir()) == dockerfiles
    (project / "matrix.yaml").write_text(text)
    (project / "ci" / "known_failures.yaml").write_text(
        "- test: a\n  kind: fail\n  reason: r\n  kind: flaky\n")
    assert main(["--root", str(project), "matrix", "--dry-run"]) == 2
    assert "known_failures.yaml: not valid YAML: duplicate key 'kind'" in capsys.readouterr().err
    (project / "ci" / "known_failures.yaml").write_text("[]\n")
    assert main(["--root", str(project), "matrix", "--dry-run", "--pytest-args", "-k 'a"]) == 2
    assert ("error: PYTEST_ARGS=\"-k 'a\" is not valid shell syntax (No closing quotation)"
            in capsys.readouterr().err)


def test_archs_override_every_cells_kernel_build(project):
    """``make matrix ARCHS=sm_90``: every selected cell builds for those targets (a smoke run),
    matrix.yaml's archs otherwise; a malformed list is refused before any work."""
    from harness.run import Paths, plan

    default = plan(Paths(project), RunOptions())
    assert all(cell.archs == ("sm_80", "sm_90") for cell in default.cells)
    smoke = plan(Paths(project), RunOptions(archs=("sm_90", "compute_80")))
    assert [c.name for c in smoke.cells] == [c.name for c in default.cells]
    assert all(cell.archs == ("sm_90", "compute_80") for cell in smoke.cells)
    with pytest.raises(SystemExit):
        main(["--root", str(project), "matrix", "--archs", "sm90", "--dry-run"])


ALL_PASS = {name: (CellRun(returncode=0), passing("test/test_a.py::test_ok")) for name in OUTCOMES}


def summary_json(project):
    return json.loads((project / "reports" / "summary.json").read_text())


class Interrupted(FakeExecutor):
    """Ctrl-C during the second cell."""

    def run(self, job, log):
        if self.jobs:
            raise KeyboardInterrupt
        return super().run(job, log)


@pytest.mark.parametrize("options, words", [
    (RunOptions(cells=random.choice(["py3.11", "tf2.20", "py3.1[13]"])), "no result for the gating cell(s) "),
    (RunOptions(archs=(random.choice(["sm_90", "sm_100", "compute_80"]),)), "was built for GPU targets"),
    (RunOptions(pytest_args=("test/test_a.py", "-k", random.choice(["ok", "not slow"]))),
     "ran only the tests of PYTEST_ARGS="),
    (None, "the run did not finish"),
], ids=["cells", "archs", "pytest-args", "interrupted"])
def test_a_narrowed_or_unfinished_run_is_marked_and_the_release_refuses_it(project, options, words):
    head = commit_all(project)
    if options is None:
        with pytest.raises(KeyboardInterrupt):
            run_matrix(project, RunOptions(), executor=Interrupted(ALL_PASS), progress=FakeProgress())
    else:
        assert run_matrix(project, options, executor=FakeExecutor(ALL_PASS), progress=FakeProgress()) == 0
    data = summary_json(project)
    assert data["complete"] is False and any(words in gap for gap in data["incomplete"])
    reason = stale_reason(load_summary(project / "reports" / "summary.json"), head,
                          load_matrix(project / "matrix.yaml"))
    assert reason.startswith("the matrix report does not cover the whole matrix") and words in reason


def test_a_whole_run_is_complete(project):
    head = commit_all(project)
    assert run_matrix(project, RunOptions(), executor=FakeExecutor(ALL_PASS), progress=FakeProgress()) == 0
    data = summary_json(project)
    assert data["complete"] is True and data["incomplete"] == [] and data["finished"]
    assert all((c["commit"], c["dirty"], c["pytest_args"]) == (head, False, [])
               for c in data["cells"].values())
    assert stale_reason(load_summary(project / "reports" / "summary.json"), head,
                        load_matrix(project / "matrix.yaml")) is None


def test_report_of_a_missing_cell_is_incomplete(project, capsys):
    head = commit_all(project)
    run_matrix(project, RunOptions(), executor=FakeExecutor(ALL_PASS), progress=FakeProgress())
    assert rebuild_report(project) == 0 and summary_json(project)["complete"] is True
    gone = random.choice(list(ALL_PASS))
    subprocess.run(["rm", "-r", str(project / "reports" / gone)], check=True)
    assert rebuild_report(project) == 1  # CI's merge job fails
    data = summary_json(project)
    assert data["ok"] is True and data["complete"] is False and data["commit"] == head
    assert data["incomplete"] == [f"no result for the gating cell(s) {gone}"]
    assert f"report: incomplete, not releasable: no result for the gating cell(s) {gone}" in \
        capsys.readouterr().out
    assert "not cover the whole matrix" in stale_reason(load_summary(project / "reports" / "summary.json"),
                                                        head, load_matrix(project / "matrix.yaml"))


def test_report_refuses_results_of_different_commits(project, capsys):
    first = commit_all(project)
    run_matrix(project, RunOptions(), executor=FakeExecutor(ALL_PASS), progress=FakeProgress())
    (project / "test" / "test_b.py").write_text("def test_b():\n    pass\n")
    second = commit_all(project)
    cell = random.choice(list(ALL_PASS))
    run_matrix(project, RunOptions(cells=f"^{cell}$"), executor=FakeExecutor(ALL_PASS),
               progress=FakeProgress())
    (project / "reports" / "summary.json").unlink()
    assert main(["--root", str(project), "report"]) == 4
    err = capsys.readouterr().err
    assert "the cell results were tested at different commits" in err
    assert f"{second}: {cell}" in err and f"{first}: " in err
    assert not (project / "reports" / "summary.json").exists()


def test_report_with_an_unknown_status_writes_nothing(project, capsys):
    commit_all(project)
    run_matrix(project, RunOptions(), executor=FakeExecutor(ALL_PASS), progress=FakeProgress())
    cell = random.choice(list(ALL_PASS))
    path = project / "reports" / cell / "result.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": "timed-out"}))
    for name in ("summary.json", "matrix.md", "index.html"):
        (project / "reports" / name).unlink()
    assert main(["--root", str(project), "report"]) == 5
    assert f"cell '{cell}' key 'status' must be one of passed, " in capsys.readouterr().err
    assert not any((project / "reports" / name).exists() for name in ("summary.json", "matrix.md"))


def test_archs_the_kernel_compiler_cannot_build_are_refused(project, capsys):
    arch = random.choice(["sm_75", "sm_70", "compute_90"])
    with pytest.raises(SystemExit) as info:
        main(["--root", str(project), "matrix", "--archs", f"sm_90,{arch}", "--dry-run"])
    assert info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"ARCHS must be a comma-separated list of GPU targets like sm_90,compute_80; got 'sm_90,{arch}'" in err
    assert f"got {arch!r}" in err.split(";", 1)[1]


def test_archs_listed_twice_are_refused_and_the_dry_run_names_the_targets(project, capsys):
    """As matrix.yaml's own archs: a target listed twice is refused; a dry run says what each cell's
    kernels are built for."""
    with pytest.raises(SystemExit) as info:
        main(["--root", str(project), "matrix", "--archs", "sm_90,sm_90", "--dry-run"])
    assert info.value.code == 2 and "listed twice: sm_90" in capsys.readouterr().err
    assert main(["--root", str(project), "matrix", "--dry-run"]) == 0
    assert "GPU targets: sm_80,sm_90\n" in capsys.readouterr().out
    assert main(["--root", str(project), "matrix", "--archs", "sm_90,compute_80", "--dry-run"]) == 0
    assert "GPU targets: sm_90,compute_80 (ARCHS=: every cell; a smoke run, not releasable)" in capsys.readouterr().out


def test_help_tells_the_defaults_and_exit_codes(capsys):
    for command in ("matrix", "render"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "per-test timeout, seconds (default: 900)" in text
    assert "limit of one cell's whole test run, seconds (default: 7200)" in text
    assert f"only report stale files (exit {StaleFilesError.exit_code} if any" in text


@pytest.mark.parametrize("args", [["--run-timeout", "-5"], ["--test-timeout", "0"], ["--dry-run=maybe"],
                                  ["--fresh=sometimes"]])
def test_bad_run_options_are_refused(args, capsys):
    """Limits of 0 or less (``timeout 0`` turns a limit off, a negative one breaks every cell) and
    yes/no words the release tool would refuse too: exit 2 before anything runs."""
    with pytest.raises(SystemExit) as info:
        main(["matrix", *args])
    assert info.value.code == 2 and "error: argument" in capsys.readouterr().err


@pytest.mark.parametrize("word, dry", [("off", False), ("False", False), ("NO", False), ("1", True), ("Yes", True)])
def test_dry_run_takes_the_release_tools_words(word, dry):
    from harness.cli import _parser

    assert _parser().parse_args(["matrix", f"--dry-run={word}"]).dry_run is dry
    assert _parser().parse_args(["matrix", "--dry-run"]).dry_run is True
    assert _parser().parse_args(["matrix"]).dry_run is False
