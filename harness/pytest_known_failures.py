"""pytest plugin: apply the known-failure entries of one matrix cell and sort every outcome.

A single file that needs only the standard library and pytest (plus pytest-timeout for the
timeouts), so that a cell environment -- TensorFlow, the wheel, pytest -- can load it: the cell
script copies it beside the tests and runs ``pytest -p pytest_known_failures``.

Options
-------
``--known-failures=PATH``
    JSON written by the harness from ``ci/known_failures.yaml``::

        {"source": "ci/known_failures.yaml",
         "entries": [{"entry": 1, "test": "test/test_x.py::test_y", "cells": "tf2\\.1[67]",
                      "kind": "fail", "reason": "...", "link": null,
                      "reruns": null, "timeout": null}]}

``--cell=NAME``
    The running cell (default: the ``BLOCKSPARSE_CELL`` environment variable).  An entry whose
    ``cells`` regex is not found in this name (``re.search``) is ignored; an entry without
    ``cells`` applies everywhere.
``--known-failures-report=PATH``
    Where to write the sorted outcomes as JSON (see `write_report`).

What an entry does to the tests it matches (``test`` is a node id; a glob is allowed, and a node
id without parameters also matches all its parametrized cases):

- ``fail``: a strict xfail.  Failing is *known*; passing fails the run as *fixed* (delete
  the entry).
- ``hang``: a strict xfail plus a short per-test timeout (``timeout``, default 60 s), so the hang
  cannot stall the cell; hanging (or failing) is *known*, passing is *fixed*.
- ``flaky``: up to ``reruns`` re-runs (default 2).  Passing on a re-run is *flaky*; passing at
  once is *passed*; failing every attempt is a *regression* -- the entry excuses an intermittent
  failure, not a test that no longer passes.

Every test ends up in exactly one of: passed, regression (fails, not listed), known (fails,
listed), fixed (listed, but passed), flaky (passed on a re-run), skipped.  A module that fails
to import is a regression under its path, or *known* when an entry names the module itself
(``test: "test/test_x.py"``, kind ``fail``).

An entry that applies to the cell but matches no collected test is *stale* (listed under
``"stale"`` in the report) when its test file was collected (the test is gone from it) or does
not exist at all; an entry for a file this run did not select is not judged.  Only the first
entry that matches a test applies to it: a later entry whose every test an earlier one takes is
listed as stale too (*shadowed*), naming the entries that take them.
"""
import fnmatch
import glob
import json
import os
import re
from dataclasses import dataclass

import pytest
from _pytest.runner import runtestprotocol  # no public API runs one item more than once

__all__ = ["KINDS", "OUTCOMES", "DEFAULT_RERUNS", "DEFAULT_HANG_TIMEOUT", "nodeid_matches",
           "cell_matches", "classify"]

KINDS = ("fail", "flaky", "hang")
OUTCOMES = ("passed", "regression", "known", "fixed", "flaky", "skipped")
DEFAULT_RERUNS = 2
DEFAULT_HANG_TIMEOUT = 60.0
CELL_ENV = "BLOCKSPARSE_CELL"

_XPASS_STRICT = "[XPASS(strict)]"


def nodeid_matches(pattern, nodeid):
    """Whether a known-failure ``test`` pattern matches a node id.

    Exact node ids match themselves (brackets in parameter ids are not glob classes); a node id
    without parameters matches all its parametrized cases; otherwise ``fnmatch`` rules apply.

    >>> nodeid_matches("test/t.py::f", "test/t.py::f[a-b]")
    True
    >>> nodeid_matches("test/t.py::*", "test/t.py::g")
    True
    >>> nodeid_matches("test/t.py::f", "test/t.py::fg")
    False
    """
    return (nodeid == pattern or nodeid.startswith(pattern + "[")
            or fnmatch.fnmatchcase(nodeid, pattern))


def cell_matches(cells, cell):
    """Whether an entry's ``cells`` regex (None: every cell) selects ``cell``."""
    if cells is None:
        return True
    return cell is not None and re.search(cells, cell) is not None


@dataclass
class _Record:
    """What happened to one test across its phases and attempts."""

    failed: bool = False
    xpass_strict: bool = False
    xfailed: bool = False
    skipped: bool = False
    attempts: int = 1
    message: str = ""
    entry: dict = None


def classify(record):
    """Sort one test's record into one of `OUTCOMES` (pure)."""
    entry = record.entry
    if record.failed:
        if record.xpass_strict and entry is not None:
            return "fixed"
        if entry is not None and entry["kind"] != "flaky":
            return "known"
        return "regression"
    if record.xfailed:
        # Our entries are strict xfails; an xfail the test declares itself is the test's business.
        return "known" if entry is not None else "skipped"
    if record.skipped:
        return "skipped"
    return "flaky" if record.attempts > 1 else "passed"


def pytest_addoption(parser):
    group = parser.getgroup("known-failures", "known failures of a matrix cell")
    group.addoption("--known-failures", metavar="PATH", default=None,
                    help="JSON list of known-failure entries (written by the harness)")
    group.addoption("--cell", metavar="NAME", default=None,
                    help=f"the running matrix cell (default: ${CELL_ENV})")
    group.addoption("--known-failures-report", metavar="PATH", default=None,
                    help="write every test's sorted outcome to this JSON file")


def pytest_configure(config):
    path = config.getoption("known_failures")
    report = config.getoption("known_failures_report")
    if path is None and report is None:
        return
    cell = config.getoption("cell") or os.environ.get(CELL_ENV) or None
    entries, source = [], None
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise pytest.UsageError(f"--known-failures {path}: cannot read ({e})") from None
        source = data.get("source", path)
        entries = [e for e in data.get("entries", []) if cell_matches(e.get("cells"), cell)]
        for e in entries:
            if e.get("kind") not in KINDS:
                raise pytest.UsageError(f"{source}: entry {e.get('entry')}: kind must be one of "
                                        f"{', '.join(KINDS)}; got {e.get('kind')!r}")
    config.pluginmanager.register(_KnownFailures(config, cell, entries, source, report),
                                  "known-failures-session")


def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


class _KnownFailures:
    """The per-session part: marks matching items, re-runs flaky ones, records outcomes."""

    def __init__(self, config, cell, entries, source, report_path):
        self.config = config
        self.cell = cell
        self.entries = entries
        self.source = source or "known failures"
        self.report_path = report_path
        self.entry_of = {}  # node id -> the entry that applies to it
        self.records = {}  # node id -> _Record, for every test (or module) that reported
        self.stale = []  # entries that match no collected test (see the module docstring)

    def _record(self, nodeid):
        if nodeid not in self.records:
            self.records[nodeid] = _Record(entry=self.entry_of.get(nodeid))
        return self.records[nodeid]

    def _entry_for(self, nodeid):
        return next((e for e in self.entries if nodeid_matches(e["test"], nodeid)), None)

    @pytest.hookimpl(tryfirst=True)  # every collected item, before -k / -m deselect some
    def pytest_collection_modifyitems(self, items):
        has_timeout = self.config.pluginmanager.hasplugin("timeout")
        self.stale = _stale_entries(self.entries, [item.nodeid for item in items],
                                    str(self.config.rootpath))
        shadowed_by = {}  # entry number -> the earlier entries that took its tests
        for item in items:
            matching = [e for e in self.entries if nodeid_matches(e["test"], item.nodeid)]
            if not matching:
                continue
            entry = self.entry_of[item.nodeid] = matching[0]
            for other in matching[1:]:
                shadowed_by.setdefault(other["entry"], set()).add(entry["entry"])
            why = f"known failure ({self.source} entry {entry['entry']}): {entry['reason']}"
            # Prepended, so the entry wins over a marker the test carries itself.
            if entry["kind"] in ("fail", "hang"):
                item.add_marker(pytest.mark.xfail(reason=why, strict=True), append=False)
            if entry["kind"] == "hang":
                if not has_timeout:
                    raise pytest.UsageError(f"{self.source} entry {entry['entry']} (kind hang) "
                                            f"needs the pytest-timeout plugin")
                timeout = entry.get("timeout") or DEFAULT_HANG_TIMEOUT
                # The signal method interrupts the test itself, so the xfail can record it.
                item.add_marker(pytest.mark.timeout(timeout, method="signal"), append=False)
        applied = {e["entry"] for e in self.entry_of.values()}
        self.stale += [{**e, "why": f"shadowed: entry {', '.join(map(str, sorted(shadowed_by[e['entry']])))} "
                                    "comes first for every test it matches, and only the first "
                                    "matching entry applies (merge them)"}
                       for e in self.entries if e["entry"] in shadowed_by and e["entry"] not in applied]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        entry = self.entry_of.get(item.nodeid)
        if entry is None or entry["kind"] != "flaky":
            return None
        attempts = 1 + (entry.get("reruns") or DEFAULT_RERUNS)
        hook = item.ihook
        hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for attempt in range(1, attempts + 1):
            reports = runtestprotocol(item, nextitem=nextitem, log=False)
            if attempt < attempts and any(r.failed for r in reports):
                # Only the failed phase is shown (as a re-run): junit keeps one test case.
                for r in reports:
                    if r.failed:
                        r.outcome = "rerun"
                        hook.pytest_runtest_logreport(report=r)
                continue
            for r in reports:
                hook.pytest_runtest_logreport(report=r)
            self._record(item.nodeid).attempts = attempt
            break
        hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def pytest_runtest_logreport(self, report):
        if report.outcome == "rerun":
            return
        rec = self._record(report.nodeid)
        if report.failed:
            rec.failed = True
            longrepr = report.longrepr
            if report.when == "call" and isinstance(longrepr, str) \
                    and longrepr.startswith(_XPASS_STRICT):
                rec.xpass_strict = True
            rec.message = rec.message or _message(report)
        elif report.skipped:
            if hasattr(report, "wasxfail"):
                rec.xfailed = True
                rec.message = rec.message or _message(report)
            else:
                rec.skipped = True

    def pytest_collectreport(self, report):
        if report.failed:
            rec = self._record(report.nodeid or "<collection>")
            # an entry of kind fail naming the module itself (no glob) excuses its import failure
            rec.entry = rec.entry or next((e for e in self.entries if e["kind"] == "fail"
                                           and e["test"] == report.nodeid), None)
            rec.failed = True
            rec.message = _message(report)

    def outcomes(self):
        """``{nodeid: {"outcome", "entry", "attempts", "message"}}`` for every test that ran."""
        return {nodeid: {"outcome": classify(rec), "entry": rec.entry, "attempts": rec.attempts,
                         "message": rec.message}
                for nodeid, rec in sorted(self.records.items())}

    def pytest_terminal_summary(self, terminalreporter):
        counts = {}
        for info in self.outcomes().values():
            counts[info["outcome"]] = counts.get(info["outcome"], 0) + 1
        tr = terminalreporter
        tr.section(f"known failures: cell {self.cell or '(none)'}")
        tr.line(", ".join(f"{counts.get(o, 0)} {o}" for o in OUTCOMES))
        for entry in self.stale:
            tr.line(f"STALE entry {entry['entry']} ({entry['test']!r}) of {self.source}: "
                    f"{entry['why']}", yellow=True)
        for nodeid, info in self.outcomes().items():
            if info["outcome"] == "fixed":
                e = info["entry"]
                tr.line(f"FIXED {nodeid}: delete entry {e['entry']} ({e['test']!r}) "
                        f"from {self.source}", yellow=True)
            elif info["outcome"] == "regression":
                tr.line(f"REGRESSION {nodeid}: {info['message']}", red=True)

    def pytest_sessionfinish(self, session, exitstatus):
        if self.report_path:
            write_report(self.report_path, cell=self.cell, source=self.source,
                         exitstatus=int(exitstatus), tests=self.outcomes(), stale=self.stale)


def _stale_entries(entries, nodeids, rootdir):
    """The ``entries`` no node id matches whose file was collected or does not exist."""
    files = {n.split("::")[0] for n in nodeids}
    stale = []
    for entry in entries:
        if any(nodeid_matches(entry["test"], n) for n in nodeids):
            continue
        path = entry["test"].split("::")[0]
        if any(fnmatch.fnmatchcase(f, path) for f in files):
            why = f"matches no test collected from {path} (renamed or removed?)"
        elif not glob.glob(os.path.join(rootdir, path)):
            why = f"{path} does not exist"
        else:
            continue  # the file exists but this run did not select it
        stale.append({**entry, "why": why})
    return stale


def write_report(path, *, cell, source, exitstatus, tests, stale=()):
    """Write ``{"cell", "source", "exitstatus", "tests": {nodeid: {...}}, "stale": [...]}``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"cell": cell, "source": source, "exitstatus": exitstatus, "tests": tests,
                   "stale": list(stale)}, f, indent=1, sort_keys=True)


def _message(report):
    """A one-line reason: the exception of a failed (or xfailed) test, else the report's text."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0][:300] if crash.message.strip() else ""
    text = getattr(report, "wasxfail", None) or str(report.longrepr or "")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
