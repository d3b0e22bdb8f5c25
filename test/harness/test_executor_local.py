"""The local executor, on the exact commands it runs (a recording fake runner)."""
from pathlib import Path


from harness.executors import SCRIPT, CellJob
from harness.executors.local import LocalExecutor, run_streaming
from harness_support import make_cells

EXE = "/usr/bin/python3.11"
REAL = "/opt/python/3.11.7/bin/python3.11"  # what the probe reports as sys.executable
from harness.interpreters import PROBE


class FakeRunner:
    """Records every command; answers like the real tools would."""

    def __init__(self, *, version="3.11", pip_lines=(), pip_rc=0, script_rc=0, wanted="3.11"):
        self.calls = []
        self.version_wanted = wanted
        self.version, self.pip_lines, self.pip_rc, self.script_rc = \
            version, pip_lines, pip_rc, script_rc

    def __call__(self, argv, *, env=None, cwd=None, on_line):
        self.calls.append({"argv": argv, "env": env, "cwd": cwd})
        if argv[1:3] == ["-c", PROBE]:
            assert env["PYENV_VERSION"] == self.version_wanted
            on_line(self.version)
            on_line(REAL)
            on_line("/opt/python/3.11.7")
            return 0
        if argv[1:3] == ["-m", "venv"]:
            python = Path(argv[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.touch()
            return 0
        if argv[1:4] == ["-m", "pip", "install"]:
            for line in self.pip_lines:
                on_line(line)
            return self.pip_rc
        if argv[0] == "bash":
            on_line("::cell-step:: build")
            return self.script_rc
        raise AssertionError(f"unexpected command {argv}")

    def argvs(self):
        return [c["argv"] for c in self.calls]


def job_for(cell, tmp_path, *args):
    return CellJob(cell=cell, stage=tmp_path / "stage", dist=tmp_path / "dist" / cell.name,
                   reports=tmp_path / "reports" / cell.name, pytest_args=args,
                   test_timeout=30, run_timeout=600)


def executor(tmp_path, runner, pins, *, which=lambda name: EXE, fresh=False):
    return LocalExecutor(work_dir=tmp_path / "work", pins=pins, fresh=fresh, runner=runner,
                         which=which)


def test_fresh_environment_then_the_script(cell, tmp_path, pins, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("VIRTUAL_ENV", "/work/.venv")
    runner, lines = FakeRunner(script_rc=1), []
    run = executor(tmp_path, runner, pins).run(job_for(cell, tmp_path, "-k", "lut"), lines.append)
    assert run.returncode == 1 and run.skipped is None and run.setup_error is None
    venv = tmp_path / "work" / cell.name / "venv"
    python = str(venv / "bin" / "python")
    assert runner.argvs() == [
        [EXE, "-c", PROBE],
        [REAL, "-m", "venv", str(venv)],
        [python, "-m", "pip", "install", "--disable-pip-version-check",
         "tensorflow-cpu==2.21.*", "pytest==8.4.2", "pytest-timeout==2.4.0",
         "setuptools==80.9.0", "wheel==0.45.1", "triton==3.6.0"],
        ["bash", str(tmp_path / "stage" / "src" / SCRIPT), "-k", "lut"],
    ]
    env = runner.calls[-1]["env"]
    assert env["CELL"] == cell.name and env["CELL_PYTHON"] == python
    assert env["CELL_SRC"] == str(tmp_path / "stage" / "src")
    assert env["CELL_DIST"] == str(tmp_path / "dist" / cell.name)
    assert env["CELL_REPORTS"] == str(tmp_path / "reports" / cell.name)
    assert env["CELL_KNOWN_FAILURES"] == str(tmp_path / "stage" / "known_failures.json")
    assert (env["CELL_COMPILE_ONLY"], env["CELL_TEST_TIMEOUT"], env["CELL_RUN_TIMEOUT"]) == \
        ("0", "30", "600")
    assert env["BLOCKSPARSE_CUDA_ARCHS"] == "sm_80,sm_90"
    assert env["PATH"].startswith(str(venv / "bin") + ":")
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env
    assert "::cell-step:: build" in lines and "3.11" in lines and REAL in lines


def test_environment_is_reused_until_requirements_change(cell, tmp_path, pins):
    first = FakeRunner()
    executor(tmp_path, first, pins).run(job_for(cell, tmp_path), lambda line: None)
    again = FakeRunner()
    executor(tmp_path, again, pins).run(job_for(cell, tmp_path), lambda line: None)
    assert [a[1:3] for a in again.argvs()] == [["-c", PROBE],
                                               [str(tmp_path / "stage" / "src" / SCRIPT)]]
    fresh = FakeRunner()
    executor(tmp_path, fresh, pins, fresh=True).run(job_for(cell, tmp_path), lambda line: None)
    assert ["-m", "venv"] in [a[1:3] for a in fresh.argvs()]
    changed = FakeRunner()
    executor(tmp_path, changed, {**pins, "pytest": "pytest==9.0.0"}).run(
        job_for(cell, tmp_path), lambda line: None)
    assert "pytest==9.0.0" in changed.argvs()[2]


def test_missing_interpreter_skips_the_cell(cell, tmp_path, pins):
    runner = FakeRunner()
    run = executor(tmp_path, runner, pins, which=lambda name: None).run(
        job_for(cell, tmp_path), lambda line: None)
    assert run.skipped == "python3.11 not found on PATH" and run.returncode is None
    assert runner.calls == []


def test_broken_interpreter_skips_the_cell(cell, tmp_path, pins):
    run = executor(tmp_path, FakeRunner(version="3.8"), pins).run(job_for(cell, tmp_path),
                                                                  lambda line: None)
    assert run.skipped == f"python3.11 on PATH ({EXE}) does not run as Python 3.11"


def test_tensorflow_without_a_wheel_for_this_python_skips_the_cell(tmp_path, pins):
    (cell,) = make_cells({"tensorflow": "2.16", "cuda": "12.3", "cudnn": "8.9", "python": ["3.13"],
                          "image": "nvidia/cuda:12.3.2-devel-ubuntu22.04"})
    pip = ["ERROR: Could not find a version that satisfies the requirement "
           "tensorflow-cpu==2.16.* (from versions: 2.20.0, 2.21.0)",
           "ERROR: No matching distribution found for tensorflow-cpu==2.16.*"]
    runner = FakeRunner(version="3.13", pip_lines=pip, pip_rc=1, wanted="3.13")
    run = executor(tmp_path, runner, pins, which=lambda n: "/usr/bin/python3.13").run(
        job_for(cell, tmp_path), lambda line: None)
    assert run.skipped == ("tensorflow-cpu==2.16.* has no release installable on Python 3.13 "
                           "(pip: no matching distribution)")
    assert not (tmp_path / "work" / cell.name / "venv").exists()
    assert runner.argvs()[-1][0] != "bash"


def test_network_trouble_is_an_error_not_a_skip(cell, tmp_path, pins):
    pip = ["WARNING: Retrying ... NewConnectionError('Failed to establish a new connection')",
           "ERROR: No matching distribution found for tensorflow-cpu==2.21.*"]
    run = executor(tmp_path, FakeRunner(pip_lines=pip, pip_rc=1), pins).run(
        job_for(cell, tmp_path), lambda line: None)
    assert run.skipped is None
    assert run.setup_error == "installing the cell environment failed (pip exit 1)"


def test_compile_only_cell_tells_the_script(tmp_path, pins):
    (cell,) = make_cells({"status": "compile-only"})
    runner = FakeRunner()
    executor(tmp_path, runner, pins).run(job_for(cell, tmp_path), lambda line: None)
    assert runner.calls[-1]["env"]["CELL_COMPILE_ONLY"] == "1"


def test_run_streaming_hands_over_lines(tmp_path):
    lines = []
    rc = run_streaming(["bash", "-c", "echo one; echo two >&2; exit 3"], on_line=lines.append)
    assert rc == 3 and lines == ["one", "two"]
    assert run_streaming([str(tmp_path / "absent")], on_line=lines.append) == 127
    assert lines[-1].startswith("cannot run")
