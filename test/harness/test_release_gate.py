"""The release gate: reading reports/summary.json, staleness, and which cells may ship."""
import json

import pytest

from harness.errors import GateError
from harness.release_gate import gate, load_summary, stale_reason

HEAD = "a" * 40


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
], ids=["json", "top", "no-commit", "no-dirty", "dirty-str", "cells-list", "cell-str",
        "no-status", "negative", "bool-count", "regressions-str", "gating-str"])
def test_malformed_report_names_the_key(tmp_path, data, words):
    with pytest.raises(GateError, match="summary.json") as info:
        load_summary(write(tmp_path, data))
    assert words in str(info.value)


def test_stale_reasons(tmp_path):
    assert "no matrix report" in stale_reason(None, HEAD)
    other = summary_of(tmp_path, {}, commit="b" * 40)
    assert stale_reason(other, HEAD) == (f"the matrix report tested commit {'b' * 12}, "
                                         f"but HEAD is {'a' * 12}")
    assert "uncommitted changes" in stale_reason(summary_of(tmp_path, {}, dirty=True), HEAD)
    assert stale_reason(summary_of(tmp_path, {}), HEAD) is None


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
    (cell("exploded"), "unknown status 'exploded'"),
    (cell("passed", regressions=["t.py::x"]), "status 'passed' but regressions listed: t.py::x"),
], ids=["regressed", "build-failed", "known-fixed", "error", "unknown-status",
        "passed-with-regressions"])
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

