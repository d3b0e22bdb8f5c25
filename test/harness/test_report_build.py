"""Cell results and the matrix report, built from recorded executor results and outcomes."""
import hashlib
import json
import os
from dataclasses import replace

import pytest

from harness.errors import GateError
from harness.executors import CellRun
from harness.report import (cell_result, exit_code, load_results, render_html, render_markdown,
                            summarize, write_reports)
from harness_support import make_cells

WHEEL = os.urandom(64)  # the bytes of the cell's wheel (fresh each run)

FAIL_ENTRY = {"entry": 3, "test": "test/test_a.py::test_old", "cells": None, "kind": "fail",
              "reason": "wrong on old TF", "link": "https://example.org/1", "reruns": None,
              "timeout": None}

RECORDED = {  # what the plugin writes for a run with one test of each outcome
    "test/test_a.py::test_ok": {"outcome": "passed", "entry": None, "attempts": 1, "message": ""},
    "test/test_a.py::test_ok2": {"outcome": "passed", "entry": None, "attempts": 1, "message": ""},
    "test/test_a.py::test_gpu": {"outcome": "skipped", "entry": None, "attempts": 1,
                                 "message": "needs a GPU"},
    "test/test_a.py::test_new": {"outcome": "regression", "entry": None, "attempts": 1,
                                 "message": "AssertionError: 1 != 2"},
    "test/test_a.py::test_old": {"outcome": "known", "entry": FAIL_ENTRY, "attempts": 1,
                                 "message": "AssertionError"},
    "test/test_a.py::test_done": {"outcome": "fixed",
                                  "entry": {**FAIL_ENTRY, "entry": 4,
                                            "test": "test/test_a.py::test_done"},
                                  "attempts": 1, "message": "[XPASS(strict)] ..."},
    "test/test_a.py::test_race": {"outcome": "flaky", "entry": None, "attempts": 2, "message": ""},
}


def recorded(tmp_path, tests, exitstatus=1):
    reports = tmp_path / "reports" / "c"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "outcomes.json").write_text(json.dumps(
        {"cell": "c", "source": "ci/known_failures.yaml", "exitstatus": exitstatus,
         "tests": tests}))
    (reports / "junit.xml").write_text("<xml/>")
    return reports


def result(tmp_path, run, tests=None, cell=None, **tree):
    cell = cell or make_cells()[0]
    reports = recorded(tmp_path, tests) if tests is not None else tmp_path / "reports" / "c"
    dist = tmp_path / "dist" / "c"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "blocksparse-2.21.0-py3-none-any.whl").write_bytes(WHEEL)
    return cell_result(cell, run, root=tmp_path, reports=reports, dist=dist, duration=61.26,
                       run_timeout=600, **tree)


def test_every_test_is_sorted(tmp_path):
    entry = result(tmp_path, CellRun(returncode=1), RECORDED)
    assert entry.status == "regressed"
    assert (entry.passed, entry.skipped) == (2, 1)
    assert entry.regressions == ("test/test_a.py::test_new",)
    assert entry.known == ("test/test_a.py::test_old",)
    assert entry.fixed == ("test/test_a.py::test_done",)
    assert entry.flaky == ("test/test_a.py::test_race",)
    assert [e["entry"] for e in entry.fixed_entries] == [4]
    assert entry.details["test/test_a.py::test_new"]["message"] == "AssertionError: 1 != 2"
    assert entry.wheels == ({"path": "dist/c/blocksparse-2.21.0-py3-none-any.whl",
                             "sha256": hashlib.sha256(WHEEL).hexdigest()},)
    assert entry.log == "reports/c/log.txt" and entry.junit == "reports/c/junit.xml"
    assert (entry.tensorflow, entry.python, entry.matrix_status) == ("2.21", "3.11",
                                                                              "supported")
    assert entry.duration_s == 61.3


def test_a_result_records_the_tree_and_the_tests_it_ran(tmp_path):
    commit, args = os.urandom(20).hex(), ("test/test_layout.py", "-k", os.urandom(3).hex())
    entry = result(tmp_path, CellRun(returncode=0), without("regression", "fixed"), commit=commit,
                   dirty=True, pytest_args=args)
    assert (entry.commit, entry.dirty, entry.pytest_args) == (commit, True, args)
    assert json.loads(json.dumps(entry.to_json()))["commit"] == commit
    whole = result(tmp_path, CellRun(returncode=0), without("regression", "fixed"), commit=commit,
                   dirty=False)
    assert whole.pytest_args == ()


def without(*outcomes):
    return {k: v for k, v in RECORDED.items() if v["outcome"] not in outcomes}


@pytest.mark.parametrize("run, tests, status, reason", [
    (CellRun(returncode=0), without("regression", "fixed"), "passed", None),
    (CellRun(returncode=1), without("regression"), "known-fixed",
     "1 known failure(s) passed: delete their entries from ci/known_failures.yaml"),
    (CellRun(returncode=2), {"test/test_b.py": {"outcome": "regression", "entry": None,
                                                "attempts": 1, "message": "ImportError"}},
     "regressed", "1 test(s) failed that are not known failures"),
    (CellRun(returncode=5), {}, "error", "pytest exit status 5: no tests collected"),
    (CellRun(returncode=1), without("regression", "fixed"), "error",
     "pytest failed but recorded no failing test; see the log"),
    (CellRun(returncode=3), None, "error", "the test run did not finish (exit 3); see the log"),
    (CellRun(returncode=10), None, "build-failed", "the wheel did not build (see the log)"),
    (CellRun(returncode=11), None, "build-failed", "the wheel did not install (see the log)"),
    (CellRun(returncode=124), None, "error",
     "the test run exceeded its time limit of 600 s and was stopped"),
    (CellRun(skipped="python3.13 not found on PATH"), None, "skipped",
     "python3.13 not found on PATH"),
    (CellRun(setup_error="pip exit 1"), None, "error", "environment: pip exit 1"),
], ids=["passed", "known-fixed", "collection-error", "no-tests", "inconsistent", "crashed",
        "build-failed", "install-failed", "timed-out", "skipped", "setup-error"])
def test_status(tmp_path, run, tests, status, reason):
    entry = result(tmp_path, run, tests)
    assert (entry.status, entry.reason) == (status, reason)


def test_a_known_import_failure_is_not_an_error(tmp_path):
    """pytest exits 1 after a collection error even when an entry names the module (known)."""
    known_module = {"test/test_b.py": {"outcome": "known", "entry": {**FAIL_ENTRY, "test": "test/test_b.py"},
                                       "attempts": 1, "message": "ImportError"},
                    "test/test_a.py::test_ok": RECORDED["test/test_a.py::test_ok"]}
    entry = result(tmp_path, CellRun(returncode=1), known_module)
    assert (entry.status, entry.passed, entry.known) == ("passed", 1, ("test/test_b.py",))
    unexplained = {"test/test_a.py::test_ok": RECORDED["test/test_a.py::test_ok"]}
    assert result(tmp_path, CellRun(returncode=1), unexplained).status == "error"


def test_compile_only_cell(tmp_path):
    (cell,) = make_cells({"status": "compile-only"})
    assert result(tmp_path, CellRun(returncode=0), cell=cell).status == "built"
    assert result(tmp_path, CellRun(returncode=10), cell=cell).status == "build-failed"


def test_allowed_to_fail_cell_keeps_its_outcome(tmp_path):
    (cell,) = make_cells({"tensorflow": "nightly", "status": "allowed-to-fail"})
    entry = result(tmp_path, CellRun(returncode=1), RECORDED, cell=cell)
    assert (entry.status, entry.outcome, entry.gating) == ("allowed-failure",
                                                                    "regressed", False)
    assert result(tmp_path, CellRun(returncode=0), without("regression", "fixed"),
                  cell=cell).status == "passed"


def test_summary_and_exit_code(tmp_path):
    passed = replace(result(tmp_path, CellRun(returncode=0), without("regression", "fixed")),
                     name="a")
    skipped = replace(result(tmp_path, CellRun(skipped="python3.13 not found on PATH")), name="b")
    summary = summarize({"a": passed, "b": skipped}, commit="abc123", dirty=False, matrix=(),
                        executor="local")
    assert summary.commit == "abc123" and summary.dirty is False and summary.ok
    assert [c.name for c in summary.cells] == ["a", "b"] and exit_code(summary) == 0
    for key in ("status", "passed", "skipped", "regressions", "known", "fixed", "flaky"):
        assert key in summary.to_json()["cells"]["a"]
    regressed = replace(result(tmp_path, CellRun(returncode=1), RECORDED), name="c")
    failed = summarize({"a": passed, "c": regressed}, commit=None, dirty=None, matrix=(),
                       executor="local")
    assert not failed.ok and exit_code(failed) == 1


def test_reports_on_disk(tmp_path):
    regressed = result(tmp_path, CellRun(returncode=1), RECORDED)
    summary = summarize({"tf2.21-cu12.5-py3.11": regressed}, commit="abc123", dirty=True,
                        matrix=make_cells(), executor="local")
    reports = tmp_path / "reports"
    write_reports(reports, summary)
    assert json.loads((reports / "summary.json").read_text()) == summary.to_json()
    md = (reports / "matrix.md").read_text()
    row = ("| `tf2.21-cu12.5-py3.11` | ❌ regressed | 2 | 1 | 1 | 1 | 1 | 1 | 1:01 "
           "| [log](c/log.txt) |")
    assert row in md
    assert "**FAILED**" in md and "with uncommitted changes" in md
    assert "- **regression** `test/test_a.py::test_new` -- AssertionError: 1 != 2" in md
    assert ("- **fixed** `test/test_a.py::test_done` -- passed: delete entry 4 "
            "(`test/test_a.py::test_done`) from the known failures") in md
    assert "- **known** `test/test_a.py::test_old` -- entry 3 (fail): wrong on old TF" in md
    assert "- **flaky** `test/test_a.py::test_race` -- passed on attempt 2" in md
    html = (reports / "index.html").read_text()
    assert '<td class="status s-regressed">regressed</td>' in html
    assert '<a href="c/log.txt">log</a>' in html and '<a href="c/junit.xml">junit</a>' in html
    assert '<a href="../dist/c/blocksparse-2.21.0-py3-none-any.whl">wheel</a>' in html
    assert "delete entry 4" in html and '<a href="https://example.org/1">link</a>' in html


def test_html_escapes_test_output(tmp_path):
    tests = {"test/t.py::test_x[<b>]": {"outcome": "regression", "entry": None, "attempts": 1,
                                         "message": "<script>alert(1)</script>"}}
    summary = summarize({"c": result(tmp_path, CellRun(returncode=1), tests)}, commit="a",
                        dirty=False, matrix=(), executor="local")
    html = render_html(summary, tmp_path / "reports")
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "test_x[<b>]" in render_markdown(summary, tmp_path / "reports")


def test_a_result_without_a_log_renders(tmp_path):
    """A result naming no log file (a hand-made or merged result.json) is shown without a link."""
    entry = replace(result(tmp_path, CellRun(returncode=0), without("regression", "fixed")), log=None, junit=None)
    summary = summarize({"c": entry}, commit="a", dirty=False, matrix=(), executor="local")
    md = render_markdown(summary, tmp_path / "reports")
    assert f"| `{entry.name}` | ✅ passed |" in md and "| 1:01 |  |" in md and "[log]" not in md
    html = render_html(summary, tmp_path / "reports")
    assert ">log</a>" not in html and 'href="None"' not in html


def test_matrix_yaml_says_which_failures_fail_the_report(tmp_path):
    """``ok`` follows matrix.yaml's gating cells, not a result's own ``gating`` flag."""
    (supported, nightly) = make_cells({}, {"tensorflow": "nightly", "status": "allowed-to-fail"})
    regressed = result(tmp_path, CellRun(returncode=1), RECORDED)
    passed = result(tmp_path, CellRun(returncode=0), without("regression", "fixed"))
    flagged = {supported.name: replace(passed, name=supported.name),
               nightly.name: replace(regressed, name=nightly.name, gating=True)}
    assert summarize(flagged, commit="a", dirty=False, matrix=(supported, nightly), executor="local").ok
    assert not summarize(flagged, commit="a", dirty=False, matrix=(), executor="local").ok
    unflagged = {supported.name: replace(regressed, name=supported.name, gating=False)}
    assert not summarize(unflagged, commit="a", dirty=False, matrix=(supported, nightly), executor="local").ok


@pytest.mark.parametrize("status, words", [
    ("allowed-failure", "reported 'allowed-failure' (outcome 'regressed'), but matrix.yaml's status "
                        "is 'supported': the cell gates, it failed"),
    ("built", "reported 'built' (compile-only, no test ran), but matrix.yaml's status is 'supported'"),
], ids=["allowed-failure", "built"])
def test_a_status_that_matrix_yaml_rules_out_fails_the_report(tmp_path, status, words):
    """A supported cell's result cannot say allowed-failure (its failure counts) or built (its
    tests must run), whatever the result file says."""
    (supported,) = make_cells()
    passed = result(tmp_path, CellRun(returncode=0), without("regression", "fixed"))
    claimed = replace(passed, name=supported.name, status=status, gating=False,
                      outcome="regressed" if status == "allowed-failure" else None)
    summary = summarize({supported.name: claimed}, commit=None, dirty=None, matrix=(supported,),
                        executor="local", finished="2025-01-02T03:04:05+00:00")
    assert not summary.ok and exit_code(summary) == 1
    assert any(f"{supported.name}: {words}" in gap for gap in summary.incomplete)
    fine = summarize({supported.name: replace(passed, name=supported.name)}, commit=None, dirty=None,
                     matrix=(supported,), executor="local")
    assert fine.ok


def test_load_results_of_the_matrix_cells_in_its_order(tmp_path):
    for name in ("b", "a", "z"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps({"status": "passed"}))
    assert list(load_results(tmp_path, ["z", "b", "missing"])) == ["z", "b"]


def test_an_unknown_status_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "result.json").write_text(json.dumps({"status": "timed-out"}))
    with pytest.raises(GateError, match=r"c/result.json: cell 'c' key 'status' must be one of "
                                        r"passed, built, .*; got 'timed-out'"):
        load_results(tmp_path, ["c"])


@pytest.mark.parametrize("content", [b'{"status": "pass', b"", b"\xff\xfe{}"], ids=["truncated", "empty", "not-utf8"])
def test_an_unreadable_result_is_an_error_naming_the_file(tmp_path, content):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "result.json").write_bytes(content)
    with pytest.raises(GateError, match=r"c/result.json: not a readable JSON report"):
        load_results(tmp_path, ["c"])


@pytest.mark.parametrize("key, value, expected", [
    ("details", [1], "an object"), ("stale_entries", [1], "a list of objects"), ("duration_s", "abc", "a number"),
    ("log", 5, "a string or null"), ("archs", "sm_90", "a list of strings"), ("dirty", "no", "true, false or null"),
])
def test_a_result_field_of_the_wrong_type_is_an_error(tmp_path, key, value, expected):
    """Every field a report shows or a release reads is type-checked (a wrong one once crashed the
    templates after summary.json had been written)."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "result.json").write_text(json.dumps({"status": "passed", key: value}))
    with pytest.raises(GateError, match=rf"cell 'c' key '{key}' must be {expected}"):
        load_results(tmp_path, ["c"])


def test_the_reports_say_what_makes_them_incomplete(tmp_path):
    """Missing cells, another commit: listed in summary.json (``complete`` false), matrix.md and
    index.html."""
    cells = make_cells({"python": ["3.11", "3.12"]})
    commit = os.urandom(20).hex()
    passed = result(tmp_path, CellRun(returncode=0), without("regression", "fixed"), commit=commit,
                    dirty=False)
    summary = summarize({"tf2.21-cu12.5-py3.11": passed}, commit=commit, dirty=False,
                        matrix=cells, executor="local", finished="2025-01-01T00:00:00+00:00")
    assert summary.ok and not summary.complete
    assert summary.incomplete == ("no result for the gating cell(s) tf2.21-cu12.5-py3.12",)
    reports = tmp_path / "reports"
    write_reports(reports, summary)
    data = json.loads((reports / "summary.json").read_text())
    assert data["complete"] is False and data["incomplete"] == list(summary.incomplete)
    for name in ("matrix.md", "index.html"):
        assert "no result for the gating cell(s) tf2.21-cu12.5-py3.12" in (reports / name).read_text()
    other = replace(passed, name="tf2.21-cu12.5-py3.12", python="3.12")
    whole = summarize({c.name: c for c in (passed, other)}, commit=commit, dirty=False, matrix=cells,
                      executor="local", finished="2025-01-01T00:00:00+00:00")
    assert whole.complete and whole.to_json()["complete"] is True
    write_reports(reports, whole)
    assert "Incomplete" not in (reports / "matrix.md").read_text()
