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
4      release: the matrix report is missing, incomplete or made for another tree;
       ``python -m harness report``: the cell results were tested at different commits
5      release: the gate (a cell regressed, known-fixed, build-failed, error, or passed with
       no test passed); a malformed report or cell result (an unknown status too)
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


def _kind(name, exit_code, doc):
    return type(name, (FatalError,), {"exit_code": exit_code, "__doc__": doc,
                                      "__module__": __name__})


ConfigError = _kind("ConfigError", 2, "A setting is invalid: ``matrix.yaml``, "
                    "``ci/known_failures.yaml``, a command-line option, a make variable, "
                    "``.pypirc``.")
DirtyTreeError = _kind("DirtyTreeError", 3, "The working tree has uncommitted changes: a "
                       "release must come from a commit.")
StaleReportError = _kind("StaleReportError", 4, "``reports/summary.json`` is missing, incomplete "
                         "or was made for another tree, and was not (re)made; or the cell results "
                         "to merge were tested at different commits.")
GateError = _kind("GateError", 5, "The matrix report blocks the release (regressions, failed "
                  "builds, errors, known failures that pass, no test passed) or is malformed "
                  "(an unknown status too).")
ArtifactError = _kind("ArtifactError", 6, "A cell's wheel is missing, ambiguous, conflicting or "
                      "carries the wrong metadata.")
CheckError = _kind("CheckError", 7, "Building the sdist or ``twine check --strict`` failed.")
TagError = _kind("TagError", 8, "A release tag already exists on another commit (bump "
                 "``PATCH``) or could not be made.")
UploadError = _kind("UploadError", 9, "``twine upload`` failed.")
StaleFilesError = _kind("StaleFilesError", 10, "Generated files differ from what ``make "
                        "render`` would write.")
ExecutorUnavailable = _kind("ExecutorUnavailable", 11, "The chosen executor cannot run here "
                            "(e.g. no Docker engine answers).")

#: ``{exit code: meaning}``: the table above, for messages and tests.
EXIT_CODES = {0: "success", CELLS_FAILED: "a gating cell failed",
              **{cls.exit_code: cls.__doc__.split(":")[0].rstrip(".")
                 for cls in (ConfigError, DirtyTreeError, StaleReportError, GateError,
                             ArtifactError, CheckError, TagError, UploadError, StaleFilesError,
                             ExecutorUnavailable)},
              INTERRUPTED: "interrupted"}
