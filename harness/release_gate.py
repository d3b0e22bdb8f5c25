"""The release gate: read the matrix report (``reports/summary.json``) and decide what may ship.

The report is written by ``make matrix`` (its form: ``harness/__init__.py``)::

    {"commit": "<HEAD of the tested tree>", "dirty": false, "finished": "...",
     "cells": {"tf2.21-cu12.5-py3.11": {"status": "passed", "passed": 812, "skipped": 40,
                                        "regressions": [], "known": [], "fixed": [], "flaky": [],
                                        "wheels": [{"path": "dist/...", "sha256": "..."}], ...}}}

A release goes ahead only when the report vouches for the commit being released and its whole
matrix (`stale_reason`: same ``commit``, a clean tree, a finished run with a result for every
gating cell of matrix.yaml, each built for matrix.yaml's GPU targets and run on the whole test
suite), and no cell regressed, failed or passed without a single test passing (`gate`).  Each
status is sorted by :data:`STATUS_ACTIONS`; a status missing there stops the release, naming it,
because a gate that guesses is no gate.
"""
import json
from dataclasses import dataclass, replace
from pathlib import PurePath

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from .errors import GateError
from .summary import CellResult, Summary, coverage_gaps, status_conflicts

__all__ = ["RELEASE", "NOT_RELEASED", "BLOCKS", "STATUS_ACTIONS", "CellResult", "Summary",
           "GateResult", "load_summary", "stale_reason", "gate"]

#: The cell passed: its wheel is released.
RELEASE = "release"
#: The cell produced nothing to release, and that is allowed (said in the output).
NOT_RELEASED = "not released"
#: The release must stop.
BLOCKS = "blocks"

#: What each cell status means for a release.  Extend it when the harness learns a new outcome.
STATUS_ACTIONS = {
    "passed": RELEASE,
    "built": RELEASE,                 # a compile-only cell: built, not testable where it ran
    "skipped": NOT_RELEASED,          # no wheel was built (e.g. no interpreter for the cell)
    "allowed-failure": NOT_RELEASED,  # a cell allowed to fail (a nightly) did fail
    "regressed": BLOCKS,
    "known-fixed": BLOCKS,            # a known failure passes: its entry must go first
    "build-failed": BLOCKS,
    "error": BLOCKS,                  # the tests could not run to the end
}


@dataclass(frozen=True, kw_only=True)
class GateResult:
    """What the gate let through: cells to release, cells left out (with why), and notes."""

    released: tuple
    left_out: tuple = ()
    notes: tuple = ()


def load_summary(path):
    """Read and validate the matrix report at ``path``; None when the file does not exist.

    Raises
    ------
    GateError
        The file is not the report ``make matrix`` writes (the message names the key and cell).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError(f"{path} cannot be read ({type(exc).__name__}: {exc}); re-run `make matrix`") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GateError(f"{path} is not valid JSON ({exc}); re-run `make matrix`") from None
    summary = Summary.from_json(data, path)
    return replace(summary, cells=tuple(sorted(summary.cells, key=lambda c: c.name)))


def stale_reason(summary, head, cells):
    """Why ``summary`` cannot vouch for commit ``head`` and its matrix ``cells`` (matrix.yaml's),
    as a sentence, or None when it can (see `harness.summary.coverage_gaps`)."""
    if summary is None:
        return "there is no matrix report (reports/summary.json)"
    if summary.commit is None:
        return "the matrix report holds no cell result"
    if summary.commit != head:
        return (f"the matrix report tested commit {summary.commit[:12]}, "
                f"but HEAD is {head[:12]}")
    if summary.dirty:
        return "the matrix report was made from a tree with uncommitted changes"
    gaps = coverage_gaps(summary, cells)
    if gaps:
        return "the matrix report does not cover the whole matrix: " + "; ".join(gaps)
    return None


def _prerelease_wheels(cell):
    """The names of the cell's wheels built for a pre-release of TensorFlow (``2.22.0rc0``)."""
    names = []
    for wheel in cell.wheels:
        name = PurePath(wheel["path"]).name
        try:
            if parse_wheel_filename(name)[1].is_prerelease:
                names.append(name)
        except InvalidWheelFilename:
            pass  # the wheels' own check names it
    return names


def gate(summary, cells=()):
    """Sort the report's cells into released and left out, or refuse the release.

    ``cells``: matrix.yaml's (`harness.matrix.Cell`); whether a cell gates is theirs to say (an
    allowed-to-fail cell never blocks and is never published), else the report's ``gating``.

    A cell whose wheel was built for a pre-release of TensorFlow (only ``2.22.0rc0`` tested: its
    wheel is ``2.22.PATCHrc0``) is left out: a release publishes final wheels only.

    Raises
    ------
    GateError
        Any cell regressed, failed to build, has a status not in :data:`STATUS_ACTIONS` or one
        matrix.yaml's cell cannot have (`harness.summary.status_conflicts`), or is ``passed``
        with no test passed; or no cell has anything to release.  Every such cell is
        named in the message.
    """
    # a gating cell reported allowed-failure, a tested one built: matrix.yaml's status wins
    released, left_out, notes, problems = [], [], [], status_conflicts(summary.cells, cells)
    gating = {c.name: c.gating for c in cells}
    for cell in summary.cells:
        action = STATUS_ACTIONS.get(cell.status)
        if action is not None and not gating.get(cell.name, cell.gating):
            # an allowed-to-fail cell (a nightly) never blocks, and is never published
            left_out.append((cell.name, f"{cell.status}, allowed to fail"))
            continue
        if action is None:
            problems.append(f"{cell.name}: unknown status {cell.status!r} "
                            f"(known: {', '.join(sorted(STATUS_ACTIONS))})")
        elif action == BLOCKS:
            detail = f": {', '.join(cell.regressions)}" if cell.regressions else ""
            problems.append(f"{cell.name}: {cell.status}{detail}")
        elif action == RELEASE and cell.regressions:
            # A report that says "passed" but lists regressions is contradicting itself.
            problems.append(f"{cell.name}: status {cell.status!r} but regressions listed: "
                            f"{', '.join(cell.regressions)}")
        elif cell.status == "passed" and cell.passed == 0:
            problems.append(f"{cell.name}: passed, but no test passed ({cell.skipped} skipped): "
                            "nothing vouches for its wheel")
        elif action == RELEASE and (prerelease := _prerelease_wheels(cell)):
            left_out.append((cell.name, f"{cell.status}, but built for a pre-release of "
                                        f"TensorFlow ({', '.join(prerelease)}): only final "
                                        "wheels are published"))
        elif action == RELEASE:
            released.append(cell)
        else:
            left_out.append((cell.name, cell.status))
        if cell.fixed:
            notes.append(f"{cell.name}: known failures now pass, remove them from the list: "
                         f"{', '.join(cell.fixed)}")
        if cell.flaky:
            notes.append(f"{cell.name}: flaky (passed on retry): {', '.join(cell.flaky)}")
        for entry in cell.stale_entries:
            notes.append(f"{cell.name}: stale known failure: entry {entry.get('entry')} "
                         f"({entry.get('test')}): {entry.get('why')}")
    notes += [f"stale known failure: entry {e.get('entry')} ({e.get('test')}): {e.get('why')}"
              for e in summary.stale_entries]
    if problems:
        raise GateError("the matrix report blocks the release:\n  " + "\n  ".join(problems))
    if not released:
        raise GateError("the matrix report has no passed cell: nothing to release")
    return GateResult(released=tuple(released), left_out=tuple(left_out), notes=tuple(notes))
