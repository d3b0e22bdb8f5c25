"""The known-failures pytest plugin: every outcome lands where it belongs, the exit code follows."""
import json

import pytest

from harness.known_failures import parse_known_failures, plugin_json
from harness.pytest_known_failures import classify, nodeid_matches, _Record
from harness.render import ROOT

CELL = "tf2.21-cu12.5-py3.11"
# The plugin is imported already (by these tests), so the inner runs cannot rewrite its asserts.
QUIET = "ignore::pytest.PytestAssertRewriteWarning"

# One module with a test of every kind.  `flaky` fails on its first run only (a file marks it).
TESTS = """
import pathlib, time, pytest

def test_passes():
    pass

def test_known():
    assert 1 == 2, "still broken"

def test_new():
    assert 1 == 3, "newly broken"

def test_fixed():
    pass

def test_flaky():
    mark = pathlib.Path("flaky-ran-once")  # the run's own directory
    first = not mark.exists()
    mark.touch()
    assert not first, "first attempt fails"

def test_hangs():
    time.sleep(60)

def test_skipped():
    pytest.skip("not here")

@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x == 0
"""

ENTRIES = [
    {"test": "test_mod.py::test_known", "kind": "fail", "reason": "known bug"},
    {"test": "test_mod.py::test_fixed", "kind": "fail", "reason": "was broken"},
    {"test": "test_mod.py::test_flaky", "kind": "flaky", "reason": "races"},
    {"test": "test_mod.py::test_hangs", "kind": "hang", "reason": "deadlock", "timeout": 1},
    {"test": "test_mod.py::test_param", "kind": "fail", "reason": "all params"},
]


def run(pytester, tests, entries, *args, cell=CELL):
    """Run the plugin over ``tests`` with ``entries``; (result, {nodeid: outcome}, report)."""
    pytester.makepyfile(test_mod=tests)
    known = pytester.path / "known_failures.json"
    known.write_text(plugin_json(parse_known_failures(entries), source="kf.yaml"))
    out = pytester.path / "outcomes.json"
    cell_args = [f"--cell={cell}"] if cell else []
    result = pytester.runpytest("-p", "harness.pytest_known_failures", "-W", QUIET,
                                f"--known-failures={known}", f"--known-failures-report={out}",
                                *cell_args, *args)
    report = json.loads(out.read_text())
    return result, {k: v["outcome"] for k, v in report["tests"].items()}, report


def test_every_outcome_lands_where_it_belongs(pytester):
    result, outcomes, report = run(pytester, TESTS, ENTRIES)
    assert outcomes == {
        "test_mod.py::test_passes": "passed",
        "test_mod.py::test_known": "known",
        "test_mod.py::test_new": "regression",
        "test_mod.py::test_fixed": "fixed",
        "test_mod.py::test_flaky": "flaky",
        "test_mod.py::test_hangs": "known",
        "test_mod.py::test_skipped": "skipped",
        "test_mod.py::test_param[1]": "known",
        "test_mod.py::test_param[2]": "known",
    }
    tests = report["tests"]
    assert report["cell"] == CELL and report["source"] == "kf.yaml"
    assert tests["test_mod.py::test_fixed"]["entry"]["entry"] == 2
    assert tests["test_mod.py::test_flaky"]["attempts"] == 2
    assert "newly broken" in tests["test_mod.py::test_new"]["message"]
    assert "Timeout" in tests["test_mod.py::test_hangs"]["message"]
    assert result.ret == pytest.ExitCode.TESTS_FAILED == report["exitstatus"]
    result.stdout.fnmatch_lines(["*FIXED test_mod.py::test_fixed: delete entry 2*kf.yaml*",
                                 "*REGRESSION test_mod.py::test_new*newly broken*"])


@pytest.mark.parametrize("keep, code", [
    (["test_passes", "test_known", "test_flaky", "test_hangs", "test_skipped"], 0),
    (["test_passes", "test_new"], 1),
    (["test_passes", "test_fixed"], 1),
], ids=["known-flaky-hang-pass", "regression-fails", "fixed-fails"])
def test_exit_code_follows(pytester, keep, code):
    selected = " or ".join(keep)
    result, outcomes, report = run(pytester, TESTS, ENTRIES, "-k", selected)
    assert set(outcomes) == {f"test_mod.py::{t}" for t in keep}
    assert result.ret == code == report["exitstatus"]


def test_flaky_that_never_passes_is_a_regression(pytester):
    tests = "def test_flaky():\n    assert False, 'always'\n"
    entries = [{"test": "test_mod.py::test_flaky", "kind": "flaky", "reason": "r", "reruns": 3}]
    result, outcomes, report = run(pytester, tests, entries, "--junitxml=junit.xml")
    assert outcomes == {"test_mod.py::test_flaky": "regression"}
    assert report["tests"]["test_mod.py::test_flaky"]["attempts"] == 4
    assert result.ret == 1
    assert result.parseoutcomes() == {"failed": 1, "rerun": 3}
    junit = (pytester.path / "junit.xml").read_text()
    assert junit.count("<testcase ") == 1


def test_flaky_passing_on_a_rerun_is_reported_once(pytester):
    result, outcomes, _ = run(pytester, TESTS, ENTRIES, "-k", "test_flaky", "--junitxml=j.xml")
    assert outcomes == {"test_mod.py::test_flaky": "flaky"}
    assert result.parseoutcomes() == {"passed": 1, "rerun": 1, "deselected": 8}
    junit = (pytester.path / "j.xml").read_text()
    assert junit.count("<testcase ") == 1 and "<failure" not in junit


@pytest.mark.parametrize("cell, expected", [
    ("tf2.16-cu12.3-py3.11", "known"),
    ("tf2.17-cu12.3-py3.11", "known"),
    ("tf2.21-cu12.5-py3.11", "regression"),
    (None, "regression"),
], ids=["tf2.16", "tf2.17", "tf2.21", "no-cell"])
def test_entries_apply_to_their_cells(pytester, cell, expected):
    tests = "def test_old():\n    assert False\n"
    entries = [{"test": "test_mod.py::test_old", "cells": r"tf2\.1[67]", "kind": "fail",
                "reason": "old TF"}]
    _, outcomes, _ = run(pytester, tests, entries, cell=cell)
    assert outcomes == {"test_mod.py::test_old": expected}


def test_cell_from_the_environment(pytester, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_CELL", "tf2.16-cu12.3-py3.11")
    tests = "def test_old():\n    assert False\n"
    entries = [{"test": "test_mod.py::*", "cells": "tf2.16", "kind": "fail", "reason": "r"}]
    _, outcomes, report = run(pytester, tests, entries, cell=None)
    assert outcomes == {"test_mod.py::test_old": "known"}
    assert report["cell"] == "tf2.16-cu12.3-py3.11"


def test_entry_wins_over_the_tests_own_markers(pytester):
    tests = ("import time, pytest\n\n@pytest.mark.timeout(300)\n@pytest.mark.xfail(strict=False)\n"
             "def test_stuck():\n    time.sleep(60)\n")
    entries = [{"test": "test_mod.py::test_stuck", "kind": "hang", "reason": "r", "timeout": 1}]
    result, outcomes, report = run(pytester, tests, entries)
    assert outcomes == {"test_mod.py::test_stuck": "known"}
    assert "Timeout (>1.0s)" in report["tests"]["test_mod.py::test_stuck"]["message"]


def test_unlisted_hang_is_stopped_by_the_default_timeout(pytester):
    tests = "import time\n\ndef test_stuck():\n    time.sleep(60)\n"
    result, outcomes, _ = run(pytester, tests, [], "--timeout=1")
    assert outcomes == {"test_mod.py::test_stuck": "regression"}
    assert result.ret == 1


def test_collection_error_is_a_regression(pytester):
    result, outcomes, report = run(pytester, "import not_a_module_anywhere\n", [])
    assert outcomes == {"test_mod.py": "regression"}
    assert "not_a_module_anywhere" in report["tests"]["test_mod.py"]["message"]
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_an_entry_naming_a_module_excuses_its_import_failure(pytester):
    """The other modules still run (``--continue-on-collection-errors``, as scripts/run_cell.sh
    passes it); an entry naming the module makes its import failure known."""
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    entries = [{"test": "test_mod.py", "kind": "fail", "reason": "needs a newer TensorFlow"}]
    result, outcomes, report = run(pytester, "import not_a_module_anywhere\n", entries,
                                   "--continue-on-collection-errors")
    assert outcomes == {"test_mod.py": "known", "test_ok.py::test_ok": "passed"}
    assert report["tests"]["test_mod.py"]["entry"]["entry"] == 1 and report["stale"] == []
    # the module imports again: its entry matches nothing collected from it, and is stale
    _, outcomes, report = run(pytester, "def test_a():\n    pass\n", entries)
    assert outcomes == {"test_mod.py::test_a": "passed", "test_ok.py::test_ok": "passed"}
    assert [e["entry"] for e in report["stale"]] == [1]


@pytest.mark.parametrize("entry", [{"test": "test_m*.py", "kind": "fail"}, {"test": "test_mod.py", "kind": "hang"}],
                         ids=["glob", "hang"])
def test_only_an_exact_fail_entry_excuses_an_import_failure(pytester, entry):
    entries = [{**entry, "reason": "something else"}]
    _, outcomes, _ = run(pytester, "import not_a_module_anywhere\n", entries, "--continue-on-collection-errors")
    assert outcomes["test_mod.py"] == "regression"


def test_run_cell_keeps_going_past_a_module_that_fails_to_import():
    script = (ROOT / "scripts" / "run_cell.sh").read_text()
    assert "--continue-on-collection-errors" in script


@pytest.mark.parametrize("first", ["test_mod.py::test_known", "test_mod.py::test_*"], ids=["exact", "glob"])
def test_an_entry_shadowed_by_an_earlier_one_is_reported(pytester, first):
    """Only the first entry matching a test applies: a later one that never applies is listed."""
    entries = [{"test": first, "kind": "flaky", "reason": "races"},
               {"test": "test_mod.py::test_known", "kind": "fail", "reason": "broken", "cells": "tf2"}]
    result, outcomes, report = run(pytester, "def test_known():\n    pass\n", entries)
    assert [(e["entry"], e["why"]) for e in report["stale"]] == [
        (2, "shadowed: entry 1 comes first for every test it matches, and only the first matching "
            "entry applies (merge them)")]
    result.stdout.fnmatch_lines(["STALE entry 2 ('test_mod.py::test_known') of kf.yaml: shadowed: *"])


def test_hang_entries_need_pytest_timeout(pytester):
    pytester.makepyfile(test_mod="def test_a():\n    pass\n")
    known = pytester.path / "kf.json"
    known.write_text(plugin_json(parse_known_failures(
        [{"test": "test_mod.py::test_a", "kind": "hang", "reason": "r"}])))
    result = pytester.runpytest("-p", "harness.pytest_known_failures", "-p", "no:timeout",
                                f"--known-failures={known}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entry 1 (kind hang) needs the pytest-timeout plugin*"])


def test_unreadable_entries_are_a_usage_error(pytester):
    pytester.makepyfile(test_mod="def test_a():\n    pass\n")
    result = pytester.runpytest("-p", "harness.pytest_known_failures",
                                "--known-failures=missing.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--known-failures missing.json: cannot read*"])


def test_without_options_the_plugin_stays_out_of_the_way(pytester):
    pytester.makepyfile(test_mod="def test_a():\n    assert False\n")
    result = pytester.runpytest("-p", "harness.pytest_known_failures")
    result.assert_outcomes(failed=1)
    assert "known failures" not in result.stdout.str()


@pytest.mark.parametrize("pattern, nodeid, expected", [
    ("test/t.py::f", "test/t.py::f", True),
    ("test/t.py::f", "test/t.py::f[1-2]", True),
    ("test/t.py::f[1-2]", "test/t.py::f[1-2]", True),
    ("test/t.py::f[1-2]", "test/t.py::f[1-3]", False),
    ("test/t.py::f", "test/t.py::fg", False),
    ("test/t.py::*", "test/t.py::C::g", True),
    ("test/*.py::f*", "test/u.py::fast", True),
    ("test/t.py::f", "test/u.py::f", False),
], ids=["exact", "all-params", "one-param", "other-param", "prefix-only", "glob-class",
        "glob-file", "other-file"])
def test_nodeid_matches(pattern, nodeid, expected):
    assert nodeid_matches(pattern, nodeid) is expected


@pytest.mark.parametrize("record, expected", [
    (_Record(), "passed"),
    (_Record(attempts=2), "flaky"),
    (_Record(failed=True), "regression"),
    (_Record(failed=True, entry={"kind": "fail"}), "known"),
    (_Record(failed=True, entry={"kind": "flaky"}), "regression"),
    (_Record(failed=True, xpass_strict=True, entry={"kind": "hang"}), "fixed"),
    (_Record(xfailed=True, entry={"kind": "fail"}), "known"),
    (_Record(xfailed=True), "skipped"),
    (_Record(skipped=True, entry={"kind": "fail"}), "skipped"),
], ids=["passed", "flaky", "regression", "known", "flaky-always-fails", "fixed",
        "xfailed-listed", "own-xfail", "skipped-listed"])
def test_classify(record, expected):
    assert classify(record) == expected


def test_entries_matching_no_collected_test_are_stale(pytester):
    pytester.makepyfile(test_other="def test_o():\n    pass\n")
    entries = [
        {"test": "test_mod.py::test_renamed", "kind": "fail", "reason": "gone from its file"},
        {"test": "test_gone.py::test_x", "kind": "fail", "reason": "its file is gone"},
        {"test": "test_other.py::test_o", "kind": "fail", "reason": "file not selected"},
        {"test": "test_mod.py::test_new", "kind": "fail", "reason": "another cell",
         "cells": "tf2\\.16"},
        {"test": "test_mod.py::test_new", "kind": "fail", "reason": "matches", "cells": "tf2"},
    ]
    result, _, report = run(pytester, "def test_new():\n    assert False\n", entries,
                            "test_mod.py")
    assert [(e["entry"], e["why"]) for e in report["stale"]] == [
        (1, "matches no test collected from test_mod.py (renamed or removed?)"),
        (2, "test_gone.py does not exist")]
    result.stdout.fnmatch_lines(["STALE entry 1 ('test_mod.py::test_renamed') of kf.yaml: *"])
    # -k deselects after the plugin looked: a deselected test is not stale
    _, _, report = run(pytester, "def test_new():\n    assert False\n", entries[4:],
                       "test_mod.py", "-k", "nothing")
    assert report["stale"] == []
