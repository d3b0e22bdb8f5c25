"""Cell results and the matrix report: ``summary.json``, ``matrix.md``, ``index.html``.

A cell's result (`harness.summary.CellResult`) is built from what its executor reported
(`CellRun`) and what its pytest run left in ``reports/<cell>/outcomes.json`` (every test sorted by
`harness.pytest_known_failures`); it is saved as ``reports/<cell>/result.json``, and the summary
is the collection of those, so the per-cell jobs of CI can be merged later
(``python -m harness report``).
"""
import json
import os
from dataclasses import replace
from pathlib import Path

from .errors import CELLS_FAILED, GateError
from .executors import BUILD_FAILED, INSTALL_FAILED, TESTS_KILLED, TIMED_OUT
from .summary import (FAILING, STATUSES, CellResult, Summary, coverage_gaps, status_conflicts,
                      wheel_record)
from .templating import template_env

__all__ = ["STATUSES", "FAILING", "cell_result", "summarize", "exit_code", "write_reports",
           "write_result", "load_results", "render_markdown", "render_html"]

_CATEGORIES = (("regression", "regressions"), ("known", "known"), ("fixed", "fixed"),
               ("flaky", "flaky"))
_PYTEST_EXIT = {2: "interrupted (collection errors?)", 3: "internal error", 4: "usage error",
                5: "no tests collected"}


def _rel(path, root):
    return os.path.relpath(path, root)


def _read_outcomes(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cell_result(cell, run, *, root, reports, dist, duration, run_timeout=None, commit=None,
                dirty=None, pytest_args=()):
    """The `CellResult` of one cell.

    Parameters
    ----------
    cell : Cell
    run : CellRun
        What the executor reported.
    root : Path
        The project root; paths in the result are relative to it.
    reports, dist : Path
        The cell's report and wheel directories.
    duration : float
        Seconds the cell took.
    commit, dirty : str, bool
        The tested tree (`harness.git.state`).
    pytest_args : tuple
        The tests the cell ran (``()``: the whole suite).
    """
    reports, dist = Path(reports), Path(dist)
    tests = {"passed": 0, "skipped": 0, **{key: [] for _, key in _CATEGORIES}, "details": {},
             "fixed_entries": [], "stale_entries": []}
    status, reason = _status(cell, run, reports / "outcomes.json", tests, run_timeout)
    outcome = None
    if not cell.gating and status in FAILING:
        outcome, status = status, "allowed-failure"
    return CellResult(
        name=cell.name, status=status, outcome=outcome, reason=reason,
        **{k: tuple(v) if isinstance(v, list) else v for k, v in tests.items()},
        tensorflow=cell.tensorflow, python=cell.python, cuda=cell.cuda, cudnn=cell.cudnn,
        archs=tuple(cell.archs), image=cell.image, matrix_status=cell.status,
        gating=cell.gating, wheels=tuple(wheel_record(p, root) for p in sorted(dist.glob("*.whl"))),
        commit=commit, dirty=dirty, pytest_args=tuple(pytest_args),
        log=_rel(reports / "log.txt", root),
        junit=_rel(reports / "junit.xml", root) if (reports / "junit.xml").is_file() else None,
        duration_s=round(duration, 1))


def _status(cell, run, outcomes_path, entry, run_timeout):
    """``(status, reason)``; fills the test lists of ``entry`` from the outcomes file."""
    if run.skipped:
        return "skipped", run.skipped
    if run.setup_error:
        return "error", f"environment: {run.setup_error}"
    if run.error:
        return "error", run.error
    rc = run.returncode
    if rc == BUILD_FAILED:
        return "build-failed", "the wheel did not build (see the log)"
    if rc == INSTALL_FAILED:
        return "build-failed", "the wheel did not install (see the log)"
    if rc == TIMED_OUT:
        limit = f" of {run_timeout} s" if run_timeout else ""
        return "error", f"the test run exceeded its time limit{limit} and was stopped"
    if rc == TESTS_KILLED:
        return "error", "pytest was killed by a signal (out of memory?); see the log"
    if not cell.tested:
        return ("built", "compile-only cell: wheel built, tests not run") if rc == 0 else \
            ("error", f"the cell script failed (exit {rc})")
    outcomes = _read_outcomes(outcomes_path)
    if outcomes is None:
        return "error", f"the test run did not finish (exit {rc}); see the log"
    _sort_tests(outcomes, entry)
    if entry["regressions"]:
        return "regressed", (f"{len(entry['regressions'])} test(s) failed that are not known "
                             f"failures")
    if entry["fixed"]:
        return "known-fixed", (f"{len(entry['fixed'])} known failure(s) passed: delete their "
                               f"entries from {outcomes.get('source') or 'the known failures'}")
    if rc not in (0, 1):
        return "error", f"pytest exit status {rc}: {_PYTEST_EXIT.get(rc, 'unexpected')}"
    # pytest exits 1 after any collection error, one that an entry naming the module excuses too
    if rc == 1 and not any("::" not in t for t in entry["known"]):
        return "error", "pytest failed but recorded no failing test; see the log"
    return "passed", None


def _sort_tests(outcomes, entry):
    fixed_entries = {}
    for nodeid, info in sorted(outcomes.get("tests", {}).items()):
        outcome = info.get("outcome")
        if outcome in ("passed", "skipped"):
            entry[outcome] += 1
            continue
        key = dict(_CATEGORIES).get(outcome)
        if key is None:
            continue
        entry[key].append(nodeid)
        known = info.get("entry")
        entry["details"][nodeid] = {"outcome": outcome, "message": info.get("message") or "",
                                    "entry": known, "attempts": info.get("attempts", 1)}
        if outcome == "fixed" and known is not None:
            fixed_entries[known["entry"]] = known
    entry["fixed_entries"] = [fixed_entries[k] for k in sorted(fixed_entries)]
    entry["stale_entries"] = list(outcomes.get("stale", []))


def summarize(results, *, commit, dirty, matrix, stale_entries=(), **info):
    """The `Summary` of ``results`` (``{name: CellResult}``, in matrix order); ``ok`` unless a cell
    that matrix.yaml makes gating failed (a result of a cell it does not list: its own ``gating``)
    or a result's status contradicts matrix.yaml (`status_conflicts`: also listed as incomplete).

    ``commit`` is ``git rev-parse HEAD`` of the tested tree; ``dirty`` says whether the tree
    differed from it.  ``matrix`` are the cells of matrix.yaml: ``incomplete`` says how the
    report falls short of them (`coverage_gaps`).  ``stale_entries`` are known-failure entries
    that match no cell of the matrix; ``info`` adds top-level fields (executor, selection ...).
    """
    gating = {c.name: c.gating for c in matrix}  # matrix.yaml decides, whatever a result says
    # a gating cell reported allowed-failure, a tested one built: not a result for that cell
    conflicts = status_conflicts(results.values(), matrix)
    ok = not conflicts and not any(r.status in FAILING and gating.get(name, r.gating)
                                   for name, r in results.items())
    info = {k: tuple(v) if isinstance(v, list) else v for k, v in info.items()}
    summary = Summary(commit=commit, dirty=dirty, ok=ok, cells=tuple(results.values()),
                      stale_entries=tuple(stale_entries), **info)
    return replace(summary, incomplete=coverage_gaps(summary, matrix) + tuple(conflicts))


def exit_code(summary):
    """0 when no gating cell failed, else `CELLS_FAILED`."""
    return 0 if summary.ok else CELLS_FAILED


def load_results(reports_dir, names):
    """``{cell: CellResult}`` from ``reports/<cell>/result.json`` of the cells ``names`` that have
    one, in that order; a malformed file (an unknown status too) is a `GateError` naming it."""
    found = {}
    for name in names:
        path = Path(reports_dir) / name / "result.json"
        if path.is_file():
            found[name] = CellResult.from_json(name, read_json(path), path)
    return found


def read_json(path):
    """The JSON value in the file ``path``; a file that cannot be read or parsed is a `GateError`
    naming it (exit code 5)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GateError(f"{path}: not a readable JSON report ({type(exc).__name__}: {exc})") from None


def _view(summary, reports_dir):
    """Template variables; links are relative to the reports directory."""
    root = Path(reports_dir).parent
    cells = []
    for cell in summary.cells:
        links = {"log": cell.log, "junit": cell.junit}
        # every key present (None where the result names no file): the templates test them
        links = {k: os.path.relpath(root / v, reports_dir) if v else None for k, v in links.items()}
        wheels = [os.path.relpath(root / w["path"], reports_dir) for w in cell.wheels]
        cells.append({"cell": cell, "links": links, "wheel_links": wheels})
    stale = [*summary.stale_entries,
             *({**e, "cell": c.name} for c in summary.cells for e in c.stale_entries)]
    return {"summary": summary, "cells": cells, "stale": stale}


def render_markdown(summary, reports_dir):
    return template_env().get_template("matrix.md.j2").render(**_view(summary, reports_dir))


def render_html(summary, reports_dir):
    return template_env().get_template("index.html.j2").render(**_view(summary, reports_dir))


def write_result(reports_dir, result):
    """``reports/<cell>/result.json``."""
    path = Path(reports_dir) / "result.json"
    path.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")


def write_reports(reports_dir, summary):
    """Write ``summary.json``, ``matrix.md`` and ``index.html`` into ``reports_dir`` (all three rendered
    before any is written: a report the templates cannot show leaves no summary behind)."""
    reports_dir = Path(reports_dir)
    texts = {"summary.json": summary.dumps(), "matrix.md": render_markdown(summary, reports_dir),
             "index.html": render_html(summary, reports_dir)}
    reports_dir.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (reports_dir / name).write_text(text, encoding="utf-8")
