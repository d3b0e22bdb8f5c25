"""Shared pieces of the harness tests (import as ``from harness_support import ...``)."""
from pathlib import Path

import yaml

from harness.matrix import parse_matrix
from harness.render import ROOT
from harness.source import stage_tree

GOLDEN = Path(__file__).parent / "golden"

BUILD = {"tensorflow": "2.21", "cuda": "12.5", "cudnn": "9.3", "python": ["3.11"],
         "image": "nvidia/cuda:12.5.1-devel-ubuntu22.04"}

PINS = {"pytest": "pytest==8.4.2", "pytest-timeout": "pytest-timeout==2.4.0",
        "setuptools": "setuptools==80.9.0", "wheel": "wheel==0.45.1", "triton": "triton==3.6.0"}


def make_cells(*builds, **defaults):
    """Cells from build dicts (each overriding `BUILD`)."""
    data = {"builds": [{**BUILD, **b} for b in builds or [{}]]}
    if defaults:
        data["defaults"] = defaults
    return parse_matrix(data, source="test-matrix.yaml")


# --- a real cell with planted tests (the local executor's and the container's end-to-end tests)

CELL = "tf2.21-cu12.5-py3.11"
#: The GPU targets of the real cells' kernel builds in these tests (``make matrix ARCHS=...``):
#: one, where the release's five take half an hour on two cores.
SMOKE_ARCHS = ("sm_90",)

PLANTED = '''
import pathlib, time

import blocksparse


def test_passes():
    assert blocksparse.__file__


def test_known():
    assert False, "known bug"


def test_new():
    assert False, "new bug"


def test_fixed():
    pass


def test_flaky():
    mark = pathlib.Path(__file__).with_name("flaky-ran-once")
    first = not mark.exists()
    mark.touch()
    assert not first


def test_hangs():
    time.sleep(120)
'''

KNOWN = [
    {"test": "test/test_planted.py::test_known", "kind": "fail", "reason": "known bug"},
    {"test": "test/test_planted.py::test_fixed", "kind": "fail", "reason": "was broken"},
    {"test": "test/test_planted.py::test_flaky", "kind": "flaky", "reason": "races"},
    {"test": "test/test_planted.py::test_hangs", "kind": "hang", "reason": "deadlock",
     "timeout": 2},
    {"test": "test/test_planted.py::test_*", "cells": "tf2\\.16", "kind": "fail",
     "reason": "another cell only"},
    {"test": "test/test_planted.py::test_renamed", "kind": "fail", "reason": "stale"},
]

#: Every planted test's outcome: the same in a virtualenv and in a container.
EXPECTED = {
    "checks/test_extra.py::test_outside_test_dir": "passed",
    "test/test_planted.py::test_passes": "passed",
    "test/test_planted.py::test_known": "known",
    "test/test_planted.py::test_new": "regression",
    "test/test_planted.py::test_fixed": "fixed",
    "test/test_planted.py::test_flaky": "flaky",
    "test/test_planted.py::test_hangs": "known",
}


def planted_project(tmp_path):
    """A copy of this project with the planted tests and known failures."""
    project = stage_tree(ROOT, tmp_path / "project")
    (project / "test" / "test_planted.py").write_text(PLANTED)
    (project / "checks").mkdir()
    (project / "checks" / "test_extra.py").write_text("def test_outside_test_dir():\n    pass\n")
    (project / "ci" / "known_failures.yaml").write_text(yaml.safe_dump(KNOWN))
    return project
