"""Errors of the release tool: one class per way a release stops, each with its own exit code.

They are raised anywhere in the release steps and caught once, in :func:`harness.release.main`,
which prints the message and exits with ``exit_code``.  Messages must never contain credentials.
The base :class:`FatalError` and :class:`ConfigError` (a setting the tool does not accept, exit
code 2) are the matrix harness's own.
"""

__all__ = [
    "FatalError", "ConfigError", "DirtyTreeError", "StaleReportError", "GateError",
    "ArtifactError", "CheckError", "TagError", "UploadError",
]


from .errors import ConfigError, FatalError  # noqa: F401 -- shared with the matrix harness


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
