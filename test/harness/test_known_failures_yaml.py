"""ci/known_failures.yaml: schema, errors naming the entry, the JSON handed to the plugin."""
import json

import pytest

from harness.errors import ConfigError
from harness.known_failures import load_known_failures, parse_known_failures, plugin_json
from harness.render import ROOT

GOOD = [
    {"test": "test/test_x.py::test_y", "cells": r"tf2\.1[67]", "kind": "fail",
     "reason": "wrong answer on old TF", "link": "https://example.org/issues/1"},
    {"test": "test/test_x.py::test_*", "kind": "flaky", "reason": "races", "reruns": 3},
    {"test": "test/test_z.py::test_w", "kind": "hang", "reason": "deadlocks"},
]


def test_good_entries():
    fail, flaky, hang = parse_known_failures(GOOD)
    assert (fail.entry, fail.cells, fail.kind, fail.link) == (1, r"tf2\.1[67]", "fail",
                                                              "https://example.org/issues/1")
    assert (flaky.entry, flaky.cells, flaky.reruns) == (2, None, 3)
    assert (hang.entry, hang.timeout) == (3, None)


def test_parametrized_ids_may_hold_spaces():
    """pytest ids of parameters with spaces (``test_p[a b]``) can be listed; blank ends and line
    breaks cannot."""
    (entry,) = parse_known_failures([{"test": "test/test_x.py::test_p[a b]", "kind": "fail", "reason": "r"}])
    assert entry.test == "test/test_x.py::test_p[a b]"
    for bad in (" test/a.py::t", "test/a.py::t ", "test/a.py::t[a\nb]"):
        with pytest.raises(ConfigError, match="test: expected a string"):
            parse_known_failures([{"test": bad, "kind": "fail", "reason": "r"}], source="kf.yaml")


def test_plugin_json_fills_defaults():
    payload = json.loads(plugin_json(parse_known_failures(GOOD), source="kf.yaml"))
    assert payload["source"] == "kf.yaml"
    fail, flaky, hang = payload["entries"]
    assert fail["reruns"] is None and fail["timeout"] is None
    assert flaky["reruns"] == 3 and hang["timeout"] == 60.0


@pytest.mark.parametrize("change, words", [
    ({"kind": "flakey"}, r"entry 1 \(test/a.py::t\): kind: expected one of fail, flaky, hang; "
                         r"got 'flakey' \(did you mean 'flaky'\?\)"),
    ({"cells": "tf2.(1"}, r"entry 1 \(test/a.py::t\): cells: not a valid regular expression"),
    ({"reason": None}, r"entry 1 \(test/a.py::t\): reason: missing"),
    ({"reason": "two\nlines"}, r"reason: expected a string such as 'why, in one line'"),
    ({"test": ""}, r"entry 1: test: expected a string"),
    ({"why": "x"}, r"unknown key 'why'"),
    ({"reruns": 2}, r"reruns: only applies to kind flaky; this entry is kind fail"),
    ({"timeout": 5}, r"timeout: only applies to kind hang"),
    ({"kind": "flaky", "reruns": 0}, r"reruns: expected an integer between 1 and 10, got 0"),
    ({"kind": "hang", "timeout": "1m"}, r"timeout: expected a number, got str '1m'"),
    ({"link": "example.org"}, r"link: expected a string such as 'https://github.com/...'"),
    ({"kind": "hang", "timeout": float("nan")}, r"timeout: expected a number, got float nan"),
    ({"kind": "hang", "timeout": float("inf")}, r"timeout: expected a number, got float inf"),
], ids=["kind", "regex", "no-reason", "multiline", "empty-test", "unknown-key", "reruns-on-fail",
        "timeout-on-fail", "zero-reruns", "timeout-type", "bad-link", "timeout-nan", "timeout-inf"])
def test_bad_entry(change, words):
    entry = {"test": "test/a.py::t", "kind": "fail", "reason": "r", **change}
    entry = {k: v for k, v in entry.items() if v is not None}
    with pytest.raises(ConfigError, match=words) as info:
        parse_known_failures([entry], source="kf.yaml")
    assert str(info.value).startswith("kf.yaml: entry 1")


@pytest.mark.parametrize("first, second", [(None, ""), ("", None), ("", "")], ids=["omitted-empty",
                                                                                    "empty-omitted", "empty-empty"])
def test_an_empty_and_an_omitted_cells_are_the_same_cells(first, second):
    """Both mean every cell: the plugin would apply only the first entry, never the second."""
    entries = [{"test": "test/test_f.py::test_flaky", "kind": "flaky", "reason": "races"},
               {"test": "test/test_f.py::test_flaky", "kind": "fail", "reason": "broken"}]
    for entry, cells in zip(entries, (first, second)):
        if cells is not None:
            entry["cells"] = cells
    with pytest.raises(ConfigError, match=r"kf.yaml: entry 2 \(test/test_f.py::test_flaky\): same test and "
                                          r"cells as entry 1 \(an empty or omitted 'cells' means every "
                                          r"cell\); only the first entry would apply: merge them"):
        parse_known_failures(entries, source="kf.yaml")


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="expected a list of entries, got dict"):
        parse_known_failures({"test": "x"})
    twice = [{"test": "t", "kind": "fail", "reason": "r"}] * 2
    with pytest.raises(ConfigError, match="entry 2 \\(t\\): same test and cells as entry 1"):
        parse_known_failures(twice)
    assert load_known_failures(tmp_path / "absent.yaml") == ()
    assert parse_known_failures(None) == ()
    (tmp_path / "latin1.yaml").write_bytes("# caf\xe9\n- {test: t, kind: fail, reason: r}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="latin1.yaml: cannot be read as UTF-8 text"):
        load_known_failures(tmp_path / "latin1.yaml")


def test_the_project_file_is_valid():
    assert isinstance(load_known_failures(ROOT / "ci" / "known_failures.yaml"), tuple)
