"""The release gate: reading reports/summary.json, staleness, and which cells may ship."""
import json
import random
import re

import pytest

from harness.errors import GateError
from harness.release_gate import BLOCKS, NOT_RELEASED, STATUS_ACTIONS, gate, load_summary, stale_reason
from harness.render import ROOT
from harness.summary import STATUSES
from harness_support import make_cells

HEAD = "a" * 40
#: matrix.yaml of these tests: two gating cells and an allowed-to-fail nightly.
MATRIX = make_cells({"python": ["3.11", "3.13"]}, {"tensorflow": "nightly", "status": "allowed-to-fail"})


def cell(status="passed", **extra):
    entry = {"status": status, "passed": 10, "skipped": 1, "regressions": [], "known": [],
             "fixed": [], "flaky": []}
    entry.update(extra)
    return entry


def write(tmp_path, data):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def summary_of(tmp_path, cells, commit=HEAD, dirty=False):
    return load_summary(write(tmp_path, {"commit": commit, "dirty": dirty, "cells": cells}))


def test_load_reads_every_field(tmp_path):
    s = summary_of(tmp_path, {"tf2.21-cu12.5-py3.11": cell(known=["t.py::x"], flaky=["t.py::y"]),
                              "tf2.16-cu12.3-py3.10": cell("skipped", passed=0)})
    assert s.commit == HEAD and s.dirty is False
    assert [c.name for c in s.cells] == ["tf2.16-cu12.3-py3.10", "tf2.21-cu12.5-py3.11"]
    newest = s.cells[1]
    assert (newest.status, newest.passed, newest.skipped) == ("passed", 10, 1)
    assert newest.known == ("t.py::x",) and newest.flaky == ("t.py::y",)


def test_missing_report_is_none(tmp_path):
    assert load_summary(tmp_path / "nope.json") is None


def test_an_unreadable_report_is_a_gate_error(tmp_path):
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    (tmp_path / "dir.json").mkdir()
    for name in ("binary.json", "dir.json"):
        with pytest.raises(GateError, match=f"{name} cannot be read"):
            load_summary(tmp_path / name)


@pytest.mark.parametrize("data, words", [
    ("{not json", "not valid JSON"),
    ([], "object at the top"),
    ({"dirty": False, "cells": {}}, "'commit'"),
    ({"commit": HEAD, "cells": {}}, "'dirty'"),
    ({"commit": HEAD, "dirty": "no", "cells": {}}, "'dirty'"),
    ({"commit": HEAD, "dirty": False, "cells": []}, "'cells'"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": "passed"}}, "cell 'c1' must be an object"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": {"passed": 1}}}, "cell 'c1' has no 'status'"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": cell(passed=-1)}}, "cell 'c1' key 'passed'"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": cell(skipped=True)}}, "key 'skipped'"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": cell(regressions="t::x")}},
     "cell 'c1' key 'regressions'"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": cell(gating="yes")}}, "cell 'c1' key 'gating'"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": cell(archs=None)}}, "cell 'c1' key 'archs'"),
    ({"commit": HEAD, "dirty": False, "cells": {"c1": cell(stale_entries=["x"])}}, "key 'stale_entries'"),
    ({"commit": HEAD, "dirty": False, "stale_entries": ["x"], "cells": {}}, "'stale_entries' must be"),
    ({"commit": HEAD, "dirty": False, "archs": "sm_90", "cells": {}}, "'archs' must be"),
], ids=["json", "top", "no-commit", "no-dirty", "dirty-str", "cells-list", "cell-str",
        "no-status", "negative", "bool-count", "regressions-str", "gating-str", "archs-null", "stale-str",
        "top-stale-str", "top-archs-str"])
def test_malformed_report_names_the_key(tmp_path, data, words):
    with pytest.raises(GateError, match="summary.json") as info:
        load_summary(write(tmp_path, data))
    assert words in str(info.value)


def whole_matrix(top=None, edits=None):
    """A report of every cell of `MATRIX` as a full `make matrix` run makes it; ``top`` changes the
    report's keys, ``edits`` its cells (``{name: {key: value}}``, or ``{name: None}`` to drop one)."""
    cells = {c.name: cell(archs=list(c.archs), gating=c.gating, commit=HEAD, dirty=False)
             for c in MATRIX}
    for name, edit in (edits or {}).items():
        if edit is None:
            del cells[name]
        else:
            cells[name].update(edit)
    return {"commit": HEAD, "dirty": False, "finished": "2025-01-02T03:04:05+00:00", "cells": cells,
            **(top or {})}


def test_stale_reasons(tmp_path):
    assert "no matrix report" in stale_reason(None, HEAD, MATRIX)
    other = load_summary(write(tmp_path, whole_matrix({"commit": "b" * 40})))
    assert stale_reason(other, HEAD, MATRIX) == (f"the matrix report tested commit {'b' * 12}, "
                                                 f"but HEAD is {'a' * 12}")
    dirty = load_summary(write(tmp_path, whole_matrix({"dirty": True})))
    assert "uncommitted changes" in stale_reason(dirty, HEAD, MATRIX)
    assert stale_reason(load_summary(write(tmp_path, whole_matrix())), HEAD, MATRIX) is None
    # the allowed-to-fail nightly may be missing: it is never published
    nightly = load_summary(write(tmp_path, whole_matrix(edits={"tfnightly-cu12.5-py3.11": None})))
    assert stale_reason(nightly, HEAD, MATRIX) is None


SMOKE_ARCHS = random.choice([["sm_90"], ["sm_80", "compute_80"], ["sm_100"]])
TESTS = random.choice([["test/test_layout.py"], ["-k", "lut"], ["test/tf", "-x"]])


@pytest.mark.parametrize("top, edits, words", [
    ({"finished": None}, None, "the run did not finish"),
    (None, {"tf2.21-cu12.5-py3.13": None}, "no result for the gating cell(s) tf2.21-cu12.5-py3.13"),
    (None, {"tf2.21-cu12.5-py3.11": {"archs": SMOKE_ARCHS}},
     f"tf2.21-cu12.5-py3.11 was built for GPU targets {','.join(SMOKE_ARCHS)}, not matrix.yaml's "
     "sm_80,sm_90 (ARCHS=)"),
    (None, {"tf2.21-cu12.5-py3.13": {"pytest_args": TESTS}},
     "tf2.21-cu12.5-py3.13 ran only the tests of PYTEST_ARGS="),
    (None, {"tf2.21-cu12.5-py3.13": {"commit": "c" * 40}},
     f"tf2.21-cu12.5-py3.13 was tested at commit {'c' * 40}"),
    ({"cells": {**whole_matrix()["cells"], "tf2.20-cu12.5-py3.11": cell()}}, None,
     "cell(s) tf2.20-cu12.5-py3.11 are not in matrix.yaml"),
], ids=["unfinished", "cells-subset", "archs", "pytest-args", "other-commit", "not-in-matrix"])
def test_a_report_of_less_than_the_whole_matrix_is_stale(tmp_path, top, edits, words):
    summary = load_summary(write(tmp_path, whole_matrix(top, edits)))
    reason = stale_reason(summary, HEAD, MATRIX)
    assert reason.startswith("the matrix report does not cover the whole matrix: ")
    assert words in reason


def test_gate_releases_passed_cells_and_says_what_is_left_out(tmp_path):
    s = summary_of(tmp_path, {
        "tf2.21-cu12.5-py3.11": cell(fixed=["t.py::was_known"]),
        "tf2.20-cu12.5-py3.11": cell(flaky=["t.py::wobbly"]),
        "tf2.19-cu12.5-py3.12": cell("built", passed=0),
        "tf2.16-cu12.3-py3.13": cell("skipped", passed=0),
        "tfnightly-cu12.5-py3.11": dict(cell("allowed-failure", regressions=["t.py::nightly"]),
                                        gating=False),
        "tfnightly-cu12.5-py3.12": dict(cell(), gating=False),
    })
    result = gate(s)
    assert [c.name for c in result.released] == ["tf2.19-cu12.5-py3.12", "tf2.20-cu12.5-py3.11",
                                                 "tf2.21-cu12.5-py3.11"]
    assert result.left_out == (("tf2.16-cu12.3-py3.13", "skipped"),
                               ("tfnightly-cu12.5-py3.11", "allowed-failure, allowed to fail"),
                               ("tfnightly-cu12.5-py3.12", "passed, allowed to fail"))
    assert any("t.py::was_known" in n and "remove" in n for n in result.notes)
    assert any("t.py::wobbly" in n for n in result.notes)


@pytest.mark.parametrize("bad, words", [
    (cell("regressed", regressions=["test/test_layout.py::test_lut[32]"]),
     "tf2.20-cu12.5-py3.11: regressed: test/test_layout.py::test_lut[32]"),
    (cell("build-failed", passed=0), "tf2.20-cu12.5-py3.11: build-failed"),
    (cell("known-fixed", fixed=["t.py::y"]), "tf2.20-cu12.5-py3.11: known-fixed"),
    (cell("error", passed=3), "tf2.20-cu12.5-py3.11: error"),
    (cell("passed", regressions=["t.py::x"]), "status 'passed' but regressions listed: t.py::x"),
    (cell("passed", passed=0, skipped=random.randint(0, 900)),
     "tf2.20-cu12.5-py3.11: passed, but no test passed"),
], ids=["regressed", "build-failed", "known-fixed", "error", "passed-with-regressions",
        "no-test-passed"])
def test_gate_refuses(tmp_path, bad, words):
    s = summary_of(tmp_path, {"tf2.21-cu12.5-py3.11": cell(), "tf2.20-cu12.5-py3.11": bad})
    with pytest.raises(GateError, match="blocks the release") as info:
        gate(s)
    assert words in str(info.value)
    assert "tf2.21-cu12.5-py3.11" not in str(info.value)  # only the guilty cell is named


def test_gate_names_every_blocking_cell(tmp_path):
    s = summary_of(tmp_path, {"tf2.21-a": cell("regressed", regressions=["t::a"]),
                              "tf2.20-b": cell("build-failed")})
    message = str(pytest.raises(GateError, gate, s).value)
    assert "tf2.21-a: regressed: t::a" in message and "tf2.20-b: build-failed" in message


def test_gate_needs_something_to_release(tmp_path):
    s = summary_of(tmp_path, {"tf2.16-x": cell("skipped")})
    with pytest.raises(GateError, match="no passed cell"):
        gate(s)



def test_matrix_yaml_says_which_cells_gate(tmp_path):
    """Whether a cell gates is matrix.yaml's to say, whatever the report's ``gating``: its
    allowed-to-fail nightly never blocks (nor ships); a supported cell that regressed blocks."""
    nightly, supported = "tfnightly-cu12.5-py3.11", "tf2.21-cu12.5-py3.11"
    cells = whole_matrix(edits={nightly: {"status": "regressed", "regressions": ["t::n"], "gating": True}})["cells"]
    result = gate(summary_of(tmp_path, cells), MATRIX)
    assert (nightly, "regressed, allowed to fail") in result.left_out
    assert nightly not in [c.name for c in result.released] and supported in [c.name for c in result.released]
    with pytest.raises(GateError, match="blocks the release"):
        gate(summary_of(tmp_path, cells))          # without matrix.yaml, the report's own flag
    cells = whole_matrix(edits={supported: {"status": "regressed", "regressions": ["t::s"], "gating": False}})["cells"]
    with pytest.raises(GateError, match=f"{supported}: regressed: t::s"):
        gate(summary_of(tmp_path, cells), MATRIX)


@pytest.mark.parametrize("reported, words", [
    (dict(status="allowed-failure", outcome="regressed", regressions=["t::s"], gating=False),
     "reported 'allowed-failure' (outcome 'regressed'), but matrix.yaml's status is 'supported'"),
    (dict(status="built", passed=0), "reported 'built' (compile-only, no test ran), but matrix.yaml's "
                                     "status is 'supported': its tests must run"),
], ids=["allowed-failure", "built"])
def test_a_status_that_matrix_yaml_rules_out_blocks_the_release(tmp_path, reported, words):
    supported = "tf2.21-cu12.5-py3.11"
    cells = whole_matrix(edits={supported: reported})["cells"]
    with pytest.raises(GateError, match="blocks the release") as info:
        gate(summary_of(tmp_path, cells), MATRIX)
    assert f"{supported}: {words}" in str(info.value)
    (compile_only,) = make_cells({"status": "compile-only"})  # where "built" is the cell's status
    assert [c.name for c in gate(summary_of(tmp_path, {compile_only.name: cell("built", passed=0)}),
                                 (compile_only,)).released] == [compile_only.name]


def test_a_report_of_no_result_is_stale_not_malformed(tmp_path):
    """What ``harness report`` writes over an empty reports/ (no commit, no tree state) reads as a
    report that vouches for nothing: the release re-runs the matrix (or stops with exit code 4)."""
    summary = load_summary(write(tmp_path, {"commit": None, "dirty": None, "cells": {}}))
    assert summary.commit is None and summary.cells == ()
    assert stale_reason(summary, HEAD, MATRIX) == "the matrix report holds no cell result"
    with pytest.raises(GateError, match="'commit'"):
        load_summary(write(tmp_path, {"commit": None, "dirty": None, "cells": {"c1": cell()}}))


def test_an_unknown_status_is_refused_when_read(tmp_path):
    status = random.choice(["exploded", "timed-out", "Passed", "ok"])
    with pytest.raises(GateError, match="summary.json") as info:
        summary_of(tmp_path, {"tf2.21-cu12.5-py3.11": cell(), "tf2.20-cu12.5-py3.11": cell(status)})
    assert (f"cell 'tf2.20-cu12.5-py3.11' key 'status' must be one of {', '.join(STATUSES)}; "
            f"got {status!r}") in str(info.value)


def test_every_status_has_an_action():
    assert set(STATUS_ACTIONS) == set(STATUSES)


def wheel(path):
    return {"path": path, "sha256": "%064x" % random.getrandbits(256)}


def test_a_cell_built_for_a_tensorflow_prerelease_is_left_out(tmp_path):
    pre = random.choice(["rc0", "rc2", "b1", ".dev20250101"])
    s = summary_of(tmp_path, {
        "tf2.21-cu12.5-py3.11": cell(wheels=[wheel("dist/tf2.21-cu12.5-py3.11/"
                                                   "blocksparse-2.21.0-py3-none-manylinux_2_17_x86_64.whl")]),
        "tf2.22-cu12.5-py3.11": cell(wheels=[wheel(f"dist/tf2.22-cu12.5-py3.11/blocksparse-2.22.0{pre}-"
                                                   "py3-none-manylinux_2_17_x86_64.whl")])})
    result = gate(s)
    assert [c.name for c in result.released] == ["tf2.21-cu12.5-py3.11"]
    assert result.left_out == (("tf2.22-cu12.5-py3.11",
                                f"passed, but built for a pre-release of TensorFlow (blocksparse-2.22.0{pre}-"
                                "py3-none-manylinux_2_17_x86_64.whl): only final wheels are published"),)


def _releasing_step(number):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Releasing\n"):]
    return re.search(rf"^{number}\. (.*?)(?=^\d+\. )", section, re.M | re.S).group(1)


def test_the_readme_states_the_gate():
    """README "Releasing", step 3: every status that stops the release, every one left out, the
    exit code, and the statuses by their real names."""
    step = " ".join(_releasing_step(3).split())
    for status, action in STATUS_ACTIONS.items():
        if action in (BLOCKS, NOT_RELEASED):
            assert f"`{status}`" in step, status
    assert "exit code 5" in step and "no test passed" in step and "pre-release" in step
    named = set(re.findall(r"`([a-z]+(?:-[a-z]+)*)`", step))
    assert named <= set(STATUSES) | {"allowed-to-fail", "compile-only"}, named - set(STATUSES)
