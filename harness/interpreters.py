"""Finding a cell's Python on this machine, and running a command line by line.

Both executors need the cell's ``python3.X``: the local executor makes its virtualenv with it,
the docker executor copies it into the image of a cell whose Python the base image lacks.
"""
import os
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["Interpreter", "PROBE", "PYTHON_SETUP_VARIABLES", "find_python", "run_streaming"]

#: Prints the version, the real executable (not a launcher) and the installation's prefix.
PROBE = ("import sys; print('%d.%d' % sys.version_info[:2]); print(sys.executable); "
         "print(sys.base_prefix)")
#: Variables of the caller that would make another Python import this one's setup (a source tree on
#: ``PYTHONPATH``, its virtualenv, its startup file): a cell's environment, or any fresh one, drops them.
PYTHON_SETUP_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE")


@dataclass(frozen=True)
class Interpreter:
    """A Python found on this machine."""

    version: str      # "3.12"
    executable: str   # its own sys.executable
    prefix: str       # its installation (sys.base_prefix)


def run_streaming(argv, *, env=None, cwd=None, on_line):
    """Run ``argv``, each line of its stdout and stderr to ``on_line``; returns the exit status
    (negative: killed by that signal)."""
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


def find_python(version, *, which=shutil.which, runner=run_streaming, log=lambda line: None):
    """``(Interpreter, None)`` for a working ``python<version>`` on PATH, else ``(None, why)``.

    A pyenv shim runs only the versions pyenv has selected, so the probe names the wanted one
    (``PYENV_VERSION``; ignored where pyenv is not involved) and keeps the real path.
    """
    exe = which(f"python{version}")
    if exe is None:
        return None, f"python{version} not found on PATH"
    lines = []

    def sink(line):
        lines.append(line)
        log(line)

    rc = runner([str(exe), "-c", PROBE], env={**os.environ, "PYENV_VERSION": version}, cwd=None,
                on_line=sink)
    if rc != 0 or len(lines) < 3 or lines[-3].strip() != version:
        return None, f"python{version} on PATH ({exe}) does not run as Python {version}"
    return Interpreter(version, lines[-2].strip(), lines[-1].strip()), None
