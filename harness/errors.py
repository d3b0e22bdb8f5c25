"""Fatal errors of the harness and the release tool, and the one table of their exit codes.

Each kind of error has its own exit code; they are raised anywhere and caught once, in the
``main`` of ``python -m harness`` and ``python -m harness.release``, which print the message
(never a credential) and exit with ``exit_code``.

=====  ===================================================================================
code   meaning
=====  ===================================================================================
0      success
1      ``make matrix``: a cell that gates the run failed (see ``reports/``)
2      a setting is invalid (``ConfigError``): matrix.yaml, ci/known_failures.yaml, a make
       variable, a command-line option, ``.pypirc``
3      release: the working tree has uncommitted changes
4      release: the matrix report is missing or made for another tree
5      release: the gate (regressions, failed builds, unknown statuses)
6      release: the cells' wheels (missing, conflicting, wrong metadata)
7      release: building the sdist or ``twine check`` failed
8      release: a release tag is on another commit
9      release: ``twine upload`` failed
10     generated files are stale: run ``make render``
11     the executor cannot run here (no Docker engine answers, no base image can be made)
130    interrupted (Ctrl-C)
=====  ===================================================================================
"""

__all__ = ["CELLS_FAILED", "INTERRUPTED", "EXIT_CODES", "FatalError", "ConfigError",
           "DirtyTreeError", "StaleReportError", "GateError", "ArtifactError", "CheckError",
           "TagError", "UploadError", "StaleFilesError", "ExecutorUnavailable"]

#: ``make matrix``: some gating cell failed (not a `FatalError`: the run itself went through).
CELLS_FAILED = 1
#: Ctrl-C (the shell's convention for SIGINT).
INTERRUPTED = 130


class FatalError(Exception):
    """An error that stops the harness or the release (not a cell's own failure)."""

    exit_code = 2


class ConfigError(FatalError):
    """A setting is invalid: ``matrix.yaml``, ``ci/known_failures.yaml``, a command-line option,
    or a release setting (make variable, ``.pypirc``)."""

    exit_code = 2


class DirtyTreeError(FatalError):
    """The working tree has uncommitted changes: a release must come from a commit."""

    exit_code = 3


class StaleReportError(FatalError):
    """``reports/summary.json`` is missing or was made for another tree, and was not (re)made."""

    exit_code = 4


class GateError(FatalError):
    """The matrix report shows regressions, failed builds or outcomes the tool does not know."""

    exit_code = 5


class ArtifactError(FatalError):
    """A cell's wheel is missing, ambiguous, conflicting or carries the wrong metadata."""

    exit_code = 6


class CheckError(FatalError):
    """Building the sdist or ``twine check --strict`` failed."""

    exit_code = 7


class TagError(FatalError):
    """A release tag already exists on another commit (bump ``PATCH``) or could not be made."""

    exit_code = 8


class UploadError(FatalError):
    """``twine upload`` failed."""

    exit_code = 9


class StaleFilesError(FatalError):
    """Generated files differ from what ``make render`` would write."""

    exit_code = 10


class ExecutorUnavailable(FatalError):
    """The chosen executor cannot run here (e.g. no Docker engine answers)."""

    exit_code = 11


#: ``{exit code: meaning}``: the table above, for messages and tests.
EXIT_CODES = {0: "success", CELLS_FAILED: "a gating cell failed",
              **{cls.exit_code: cls.__doc__.split("\n")[0].split(":")[0].rstrip(".")
                 for cls in (ConfigError, DirtyTreeError, StaleReportError, GateError,
                             ArtifactError, CheckError, TagError, UploadError, StaleFilesError,
                             ExecutorUnavailable)},
              INTERRUPTED: "interrupted"}
