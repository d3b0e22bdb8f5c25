"""Fatal errors of the harness: each kind has its own exit code and is caught once, in ``main``."""

__all__ = ["FatalError", "ConfigError", "StaleFilesError", "ExecutorUnavailable"]


class FatalError(Exception):
    """An error that stops the harness before or between cells (not a cell's own failure)."""

    #: Process exit code for this kind of error (1 is kept for "some cell failed").
    exit_code = 2


class ConfigError(FatalError):
    """A setting is invalid: ``matrix.yaml``, ``ci/known_failures.yaml``, a command-line option,
    or a release setting (make variable, ``.pypirc``)."""

    exit_code = 2


class StaleFilesError(FatalError):
    """Generated files differ from what ``make render`` would write."""

    exit_code = 3


class ExecutorUnavailable(FatalError):
    """The chosen executor cannot run here (e.g. no Docker engine)."""

    exit_code = 4
