"""The local executor: a virtualenv per cell, made with the cell's own ``python3.X``.

The environment (``<work_dir>/<cell>/venv``) holds TensorFlow's CPU build and the test tools --
nothing from the development environment.  It is reused while its requirement list is
unchanged (a stamp file records it), since installing TensorFlow is most of a cell's time;
``fresh=True`` makes it anew.
"""
import os
import shutil
import subprocess
from pathlib import Path

from ..environment import cell_requirements
from . import SCRIPT, CellRun

__all__ = ["LocalExecutor", "run_streaming"]

_STAMP = "cell-requirements.txt"
# Environment variables of the caller that would leak another Python setup into the cell.
_SCRUB = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE")
_PROBE = "import sys; print('%d.%d' % sys.version_info[:2]); print(sys.executable)"
_NETWORK_TROUBLE = ("NewConnectionError", "ConnectTimeout", "ReadTimeout", "ProxyError",
                    "Temporary failure in name resolution", "SSLError")


def run_streaming(argv, *, env=None, cwd=None, on_line):
    """Run ``argv``, each line of its stdout and stderr to ``on_line``; returns the exit status."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd, text=True, errors="replace", bufsize=1)
    except OSError as e:
        on_line(f"cannot run {argv[0]}: {e}")
        return 127
    with proc:
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        return proc.wait()


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

    def _interpreter(self, python, log):
        """``(path, None)`` for a working Python ``python``, else ``(None, why)``.

        The path is the interpreter's own ``sys.executable``, not a launcher: a pyenv shim runs
        only the versions pyenv has selected, so the probe names the wanted one
        (``PYENV_VERSION``; ignored where pyenv is not involved) and keeps the real path.
        """
        exe = self.which(f"python{python}")
        if exe is None:
            return None, f"python{python} not found on PATH"
        env = {**os.environ, "PYENV_VERSION": python}
        rc, lines = self._call([exe, "-c", _PROBE], log, env=env)
        if rc != 0 or len(lines) < 2 or lines[-2].strip() != python:
            return None, f"python{python} on PATH ({exe}) does not run as Python {python}"
        return lines[-1].strip(), None

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
            text = "\n".join(lines)
            tf_name = requirements[0].split("=")[0].split("[")[0]
            if f"No matching distribution found for {tf_name}" in text \
                    and not any(word in text for word in _NETWORK_TROUBLE):
                return CellRun(skipped=f"{requirements[0]} has no release installable on Python "
                                       f"{cell.python} (pip: no matching distribution)")
            return CellRun(setup_error=f"installing the cell environment failed (pip exit {rc})")
        stamp.write_text(wanted, encoding="utf-8")
        return None

    def run(self, job, log):
        cell = job.cell
        exe, why = self._interpreter(cell.python, log)
        if exe is None:
            return CellRun(skipped=why)
        venv = self.work_dir / cell.name / "venv"
        failed = self._environment(cell, exe, venv, log)
        if failed is not None:
            return failed
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(job.script_env(python=venv / "bin" / "python", src=job.stage / "src",
                                  dist=job.dist, reports=job.reports,
                                  known_failures=job.stage / "known_failures.json"))
        script = job.stage / "src" / SCRIPT
        rc = self.runner(["bash", str(script), *job.pytest_args], env=env, cwd=str(job.stage),
                         on_line=log)
        return CellRun(returncode=rc)
