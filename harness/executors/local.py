"""The local executor: a virtualenv per cell, made with the cell's own ``python3.X``.

The environment (``<work_dir>/<cell>/venv``) holds TensorFlow's CPU build and the test tools --
nothing from the development environment.  It is reused while its requirement list is
unchanged (a stamp file records it), since installing TensorFlow is most of a cell's time;
``fresh=True`` makes it anew.
"""
import os
import shutil
from pathlib import Path

from ..environment import cell_requirements, unavailable_reason
from ..interpreters import PYTHON_SETUP_VARIABLES, find_python, run_streaming
from . import SCRIPT, CellRun, signal_text

__all__ = ["LocalExecutor", "run_streaming"]

_STAMP = "cell-requirements.txt"


class LocalExecutor:
    """Runs cells in virtualenvs on this machine.

    Parameters
    ----------
    work_dir : Path
        Root of the per-cell environments (``.matrix``).
    pins : dict
        The pinned cell tools (`harness.environment.read_pins`).
    fresh : bool
        Recreate every environment instead of reusing a matching one.
    runner, which
        Process runner (`run_streaming`'s signature) and interpreter lookup (`shutil.which`);
        tests pass recording fakes.
    """

    name = "local"

    def check(self, out):
        """Nothing to check: each cell's interpreter is looked up when the cell runs."""

    def __init__(self, *, work_dir, pins, fresh=False, runner=run_streaming, which=shutil.which):
        self.work_dir = Path(work_dir)
        self.pins = pins
        self.fresh = fresh
        self.runner = runner
        self.which = which

    def _call(self, argv, log, env=None):
        lines = []

        def sink(line):
            lines.append(line)
            log(line)

        return self.runner([str(a) for a in argv], env=env, cwd=None, on_line=sink), lines

    def _environment(self, cell, exe, venv, log):
        """Make (or reuse) the cell's virtualenv; a `CellRun` when that fails, else None."""
        requirements = cell_requirements(cell, "cpu", self.pins)
        wanted = "\n".join(requirements) + "\n"
        stamp = venv / _STAMP
        python = venv / "bin" / "python"
        if not self.fresh and python.exists() and stamp.is_file() \
                and stamp.read_text(encoding="utf-8") == wanted:
            log(f"local: reusing {venv} ({', '.join(requirements)})")
            return None
        if venv.exists():
            shutil.rmtree(venv)
        log(f"local: creating {venv}")
        rc, _ = self._call([exe, "-m", "venv", venv], log)
        if rc != 0:
            return CellRun(setup_error=f"python{cell.python} -m venv failed (exit {rc})")
        rc, lines = self._call([python, "-m", "pip", "install", "--disable-pip-version-check",
                                *requirements], log)
        if rc != 0:
            shutil.rmtree(venv, ignore_errors=True)
            why = unavailable_reason(requirements[0], cell.python, "\n".join(lines))
            if why:
                return CellRun(skipped=why)
            return CellRun(setup_error=f"installing the cell environment failed (pip exit {rc})")
        stamp.write_text(wanted, encoding="utf-8")
        return None

    def run(self, job, log):
        cell = job.cell
        python, why = find_python(cell.python, which=self.which, runner=self.runner, log=log)
        if python is None:
            return CellRun(skipped=why)
        exe = python.executable
        venv = self.work_dir / cell.name / "venv"
        failed = self._environment(cell, exe, venv, log)
        if failed is not None:
            return failed
        env = {k: v for k, v in os.environ.items() if k not in PYTHON_SETUP_VARIABLES}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(job.script_env(python=venv / "bin" / "python", src=job.stage / "src",
                                  dist=job.dist, reports=job.reports,
                                  known_failures=job.stage / "known_failures.json"))
        script = job.stage / "src" / SCRIPT
        rc = self.runner(["bash", str(script), *job.pytest_args], env=env, cwd=str(job.stage),
                         on_line=log)
        if rc < 0:
            return CellRun(error=f"the cell script was killed by {signal_text(-rc)} before it "
                                 f"finished")
        return CellRun(returncode=rc)
