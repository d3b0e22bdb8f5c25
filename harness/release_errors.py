"""Errors of the release tool: one class per way a release stops, each with its own exit code.

They are raised anywhere in the release steps and caught once, in :func:`harness.release.main`,
which prints the message and exits with ``exit_code``.  Messages must never contain credentials.
"""

__all__ = [
    "FatalError", "ConfigError", "DirtyTreeError", "StaleReportError", "GateError",
    "ArtifactError", "CheckError", "TagError", "UploadError",
]


class FatalError(Exception):
    """A release that cannot go on; ``exit_code`` is what the process exits with."""

    exit_code = 1


class ConfigError(FatalError):
    """A setting (make variable, option, .pypirc) has a value the tool does not accept."""

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
