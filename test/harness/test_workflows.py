"""The GitHub workflows: valid against GitHub's workflow schema, and what users expect of them.

The schema is the one check-jsonschema vendors (SchemaStore's ``github-workflow.json``), checked
offline by its command line.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.render import ROOT, WORKFLOW

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
CHECK = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]


def test_the_workflows_are_there():
    assert [p.name for p in WORKFLOWS] == ["cpu.yml", "gpu-matrix.yml"]
    assert (ROOT / WORKFLOW) in WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_valid_against_the_github_workflow_schema(path):
    done = subprocess.run([*CHECK, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_can_fail(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: x\non: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
                   "    steps:\n      - uses: actions/checkout@v4\n        run: echo both\n"
                   "    timeout-minutes: soon\n")
    done = subprocess.run([*CHECK, str(bad)], capture_output=True, text=True)
    assert done.returncode == 1 and "timeout-minutes" in done.stdout + done.stderr


def triggers(path):
    flow = yaml.safe_load(Path(path).read_text())
    return flow, set(flow[True])  # YAML 1.1 reads the key `on` as True


def test_cpu_workflow_runs_make_test_on_push_and_pull_request():
    flow, on = triggers(ROOT / ".github" / "workflows" / "cpu.yml")
    assert on == {"push", "pull_request"}
    steps = [s.get("run") for job in flow["jobs"].values() for s in job["steps"]]
    assert "make test" in steps


def test_gpu_workflow_is_manual_and_nightly_on_self_hosted_gpu_runners():
    flow, on = triggers(ROOT / WORKFLOW)
    assert on == {"workflow_dispatch", "schedule"}
    cells = {k: v for k, v in flow["jobs"].items() if k != "report"}
    assert cells and all("self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
                         for job in cells.values())
    assert all("EXECUTOR=docker DOCKER_BASE=cuda" in job["steps"][1]["run"]
               for job in cells.values())


def test_every_test_path_the_ci_script_names_exists():
    """A test file moved without updating `.ci/run` turns CI red with 'file not found'."""
    import re
    script = (ROOT / ".ci" / "run").read_text()
    named = set(re.findall(r"\btest/[\w/]+\.py\b", script))
    assert named, "the CI script names no test files: update this check"
    assert not [p for p in sorted(named) if not (ROOT / p).is_file()]
