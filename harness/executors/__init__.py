"""Executors: where a cell's environment comes from.  Both run the same ``scripts/run_cell.sh``.

An executor gets a `CellJob` (the cell, the staged sources, where the wheel and the reports must
end up) and a ``log`` callback that receives every output line as it comes; it returns a
`CellRun`.  ``local`` makes a virtualenv per cell; ``docker`` builds the cell's rendered image and
runs the script in a container with the GPUs attached.

The staged directory holds ``src/`` (a copy of the working tree) and ``known_failures.json``.
"""
from dataclasses import dataclass
from typing import Callable, Protocol

from ..errors import ConfigError

__all__ = ["EXECUTORS", "SCRIPT", "STEP_MARKER", "BUILD_FAILED", "INSTALL_FAILED", "TIMED_OUT",
           "CellJob", "CellRun", "Executor", "make_executor"]

EXECUTORS = ("local", "docker")
#: The in-environment script, relative to the source tree.
SCRIPT = "scripts/run_cell.sh"
#: Lines of the script's output that start with this name its current step.
STEP_MARKER = "::cell-step:: "
#: Exit statuses of the script besides pytest's own (see its header).
BUILD_FAILED, INSTALL_FAILED = 10, 11
TIMED_OUT = (124, 137)  # coreutils `timeout`: stopped, or killed after the grace period


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
    """What an executor reports back; at most one of the three fields says what happened.

    ``returncode``: the script's exit status.  ``skipped``: why the cell cannot run here (not a
    failure, e.g. its Python is missing).  ``setup_error``: the environment could not be made.
    """

    returncode: int = None
    skipped: str = None
    setup_error: str = None


class Executor(Protocol):
    name: str

    def run(self, job: CellJob, log: Callable[[str], None]) -> CellRun:
        """Prepare the cell's environment, run the script in it, leave the outputs in place."""


def make_executor(name, *, repo, work_dir, pins, fresh=False):
    """The executor called ``name`` (one of `EXECUTORS`)."""
    if name == "local":
        from .local import LocalExecutor
        return LocalExecutor(work_dir=work_dir, pins=pins, fresh=fresh)
    if name == "docker":
        from .docker import DockerExecutor
        return DockerExecutor(repo=repo)
    raise ConfigError(f"EXECUTOR must be one of {', '.join(EXECUTORS)}; got {name!r}")
