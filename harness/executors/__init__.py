"""Executors: where a cell's environment comes from.  Both run the same ``scripts/run_cell.sh``.

An executor is first asked to `check` that it can run here (before the run writes anything); then,
per cell, it gets a `CellJob` (the cell, the staged sources, where the wheel and the reports must
end up) and a ``log`` callback that receives every output line as it comes, and returns a
`CellRun`.  ``local`` makes a virtualenv per cell; ``docker`` builds the cell's rendered image and
runs the script in a container.

The staged directory holds ``src/`` (a copy of the working tree) and ``known_failures.json``.
"""
from dataclasses import dataclass
from typing import Callable, Protocol

from ..errors import ConfigError

__all__ = ["EXECUTORS", "SCRIPT", "STEP_MARKER", "BUILD_FAILED", "INSTALL_FAILED", "TESTS_KILLED",
           "TIMED_OUT", "CellJob", "CellRun", "Executor", "make_executor", "signal_text"]

EXECUTORS = ("local", "docker")
#: The in-environment script, relative to the source tree.
SCRIPT = "scripts/run_cell.sh"
#: Lines of the script's output that start with this name its current step.
STEP_MARKER = "::cell-step:: "
#: Exit statuses of the script besides pytest's own (see its header): the wheel did not build,
#: did not install, pytest was killed by a signal, the test run timed out.
BUILD_FAILED, INSTALL_FAILED, TESTS_KILLED, TIMED_OUT = 10, 11, 12, 124


@dataclass(frozen=True, kw_only=True)
class CellJob:
    """One cell's work order: what to run and where its outputs must land on this machine."""

    cell: object
    stage: object        # Path: the staged src/ and known_failures.json
    dist: object         # Path: the cell's wheel goes here (dist/<cell>)
    reports: object      # Path: junit.xml and outcomes.json go here (reports/<cell>)
    pytest_args: tuple = ()
    test_timeout: int = 900
    run_timeout: int = 7200

    def script_env(self, *, python, src, dist, reports, known_failures):
        """The environment variables of ``scripts/run_cell.sh`` (paths as the script sees them)."""
        return {
            "CELL": self.cell.name,
            "CELL_PYTHON": str(python),
            "CELL_SRC": str(src),
            "CELL_DIST": str(dist),
            "CELL_REPORTS": str(reports),
            "CELL_KNOWN_FAILURES": str(known_failures),
            "CELL_COMPILE_ONLY": "0" if self.cell.tested else "1",
            "CELL_TEST_TIMEOUT": str(self.test_timeout),
            "CELL_RUN_TIMEOUT": str(self.run_timeout),
            # The kernel build (AOT compilation) reads the architectures from here.
            "BLOCKSPARSE_CUDA_ARCHS": ",".join(self.cell.archs),
        }


@dataclass(frozen=True, kw_only=True)
class CellRun:
    """What an executor reports back; at most one of the four fields says what happened.

    ``returncode``: the script's exit status.  ``skipped``: why the cell cannot run here (not a
    failure, e.g. its Python is missing).  ``setup_error``: the environment could not be made.
    ``error``: the script did not run to its end (killed, out of memory, the engine went away).
    """

    returncode: int = None
    skipped: str = None
    setup_error: str = None
    error: str = None


def signal_text(number):
    """``"SIGKILL"`` for 9; the number itself for one Python does not know."""
    import signal
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Executor(Protocol):
    name: str

    def check(self, out) -> None:
        """Raise `ExecutorUnavailable` when this executor cannot run here; may print to ``out``
        what it found (e.g. the engine and the base image it will use)."""

    def run(self, job: CellJob, log: Callable[[str], None]) -> CellRun:
        """Prepare the cell's environment, run the script in it, leave the outputs in place."""


def make_executor(name, *, repo, work_dir, pins, fresh=False, docker_base="auto"):
    """The executor called ``name`` (one of `EXECUTORS`)."""
    if name == "local":
        from .local import LocalExecutor
        return LocalExecutor(work_dir=work_dir, pins=pins, fresh=fresh)
    if name == "docker":
        from .docker import DockerExecutor
        return DockerExecutor(repo=repo, work_dir=work_dir, pins=pins, base=docker_base)
    raise ConfigError(f"EXECUTOR must be one of {', '.join(EXECUTORS)}; got {name!r}")
