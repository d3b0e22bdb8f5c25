"""``make release`` end to end, on a git repository made from this source tree.

Every test gets a fresh clone with fake matrix artifacts around it: real wheels of the project
(built once per module for TensorFlow 2.20 and 2.21) under ``dist/<cell>/`` and a
``reports/summary.json`` for the clone's ``HEAD``.  The rehearsal at the end uploads to a real
package index (pypiserver on 127.0.0.1) and installs the package from it into a fresh venv.
"""
import hashlib
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.errors import ConfigError
from harness.interpreters import PYTHON_SETUP_VARIABLES
from harness.matrix import load_matrix
from harness.release import DEFAULT_REPOSITORY_URL, Settings, main
from harness.report import summarize
from harness.summary import CellResult, wheel_record

ROOT = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=release test", "-c", "user.email=release-test@example.invalid",
       "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"]
CELLS = {"tf2.20-cu12.5-py3.11": "2.20", "tf2.21-cu12.5-py3.11": "2.21"}
SKIPPED_CELL = "tf2.21-cu12.5-py3.13"
#: A TensorFlow line with only a release candidate out: its wheel is built for that.
RC = "2.21.0rc0"
# Settings of the caller's shell that must not leak into the release under test, nor its Python
# setup into the clone's builds and the fresh virtualenv (PYTHONPATH would import this source tree).
_FOREIGN = ("DRY_RUN", "RUN_MATRIX", "REPOSITORY_URL", "TWINE_USERNAME", "TWINE_PASSWORD",
            "TWINE_REPOSITORY", "TWINE_REPOSITORY_URL", "MAKEFLAGS", "MFLAGS", "MAKELEVEL") + PYTHON_SETUP_VARIABLES


def run(cmd, cwd, env=None, check=True):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def git_out(repo, *args):
    return run([*GIT, *args], cwd=repo).stdout.strip()


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """This source tree as a one-commit git repository, and its wheels for TF 2.20 and 2.21."""
    src = tmp_path_factory.mktemp("project")
    listed = run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    run([*GIT, "init", "-q"], cwd=src)
    run([*GIT, "add", "-A"], cwd=src)
    run([*GIT, "commit", "-qm", "snapshot"], cwd=src)
    wheels = {}
    for tf in sorted(set(CELLS.values())) + [RC]:
        out = tmp_path_factory.mktemp(f"wheel-{tf}")
        run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), "."],
            cwd=src, env=clean_env(BLOCKSPARSE_TF_VERSION=tf))
        (wheels[tf],) = out.glob("*.whl")
    return SimpleNamespace(path=src, wheels=wheels)


FINISHED = "2025-01-02T03:04:05+00:00"


def write_summary(repo, commit=None, dirty=False, finished=FINISHED, edits=None, **statuses):
    """``reports/summary.json`` as a whole ``make matrix`` run writes it for the clone's HEAD and
    matrix.yaml: the `CELLS` passed, with their wheels in ``dist/``, the other cells skipped.
    ``statuses`` (``cell=status``) and ``edits`` (``{cell: {field: value}}``, or ``{cell: None}``
    to leave a cell out) change that."""
    commit = commit or git_out(repo, "rev-parse", "HEAD")
    results = {}
    for cell in load_matrix(repo / "matrix.yaml"):
        edit = (edits or {}).get(cell.name, {})
        if edit is None:
            continue
        status = statuses.get(cell.name, "passed" if cell.name in CELLS else "skipped")
        wheels = sorted((repo / "dist" / cell.name).glob("*.whl"))
        results[cell.name] = CellResult(**{
            "name": cell.name, "status": status, "passed": 0 if status == "skipped" else 25,
            "skipped": 2, "regressions": ("test/test_layout.py::test_lut",) if status == "regressed" else (),
            "archs": cell.archs, "gating": cell.gating, "commit": commit, "dirty": dirty,
            "wheels": tuple(wheel_record(w, repo) for w in wheels), **edit})
    summary = summarize(results, commit=commit, dirty=dirty, matrix=load_matrix(repo / "matrix.yaml"),
                        executor="local", finished=finished)
    (repo / "reports").mkdir(exist_ok=True)
    (repo / "reports" / "summary.json").write_text(summary.dumps())


@pytest.fixture
def repo(project, tmp_path):
    """A fresh clone of the project with the matrix's artifacts for its HEAD."""
    dest = tmp_path / "repo"
    run([*GIT, "clone", "-q", str(project.path), str(dest)], cwd=tmp_path)
    for cell, tf in CELLS.items():
        (dest / "dist" / cell).mkdir(parents=True)
        shutil.copy2(project.wheels[tf], dest / "dist" / cell)
    write_summary(dest)
    return dest


DEAD_INDEX = "http://127.0.0.1:9/"  # the discard port: nothing listens, nothing leaves the host


def release(repo, *args, **env):
    """Run the release's main in-process; returns (exit code, stdout, stderr)."""
    env.setdefault("REPOSITORY_URL", DEAD_INDEX)
    out, err = io.StringIO(), io.StringIO()
    argv = ["--root", str(repo), "--pypirc", str(repo.parent / "no.pypirc"), *args]
    code = main(argv, environ=clean_env(**env), stream=out, err_stream=err)
    return code, out.getvalue(), err.getvalue()


def files_under(*dirs):
    return [p for d in dirs if d.exists() for p in d.rglob("*") if p.is_file()]


# --- settings --------------------------------------------------------------------------------

def test_settings_default_to_a_dry_run_on_pypi(tmp_path):
    s = Settings.from_args(["--root", str(tmp_path)], {})
    assert (s.dry_run, s.run_matrix, s.repository_url, s.index_url) == (
        True, True, DEFAULT_REPOSITORY_URL, None)
    assert s.matrix_command == ("make", "matrix", "DRY_RUN=0")


@pytest.mark.parametrize("value, expected", [("0", False), ("false", False), ("NO", False),
                                             ("1", True), ("yes", True), (" ", True)])
def test_settings_flags(tmp_path, value, expected):
    s = Settings.from_args(["--root", str(tmp_path)], {"DRY_RUN": value, "RUN_MATRIX": value,
                                                       "INDEX_URL": "http://i/simple"})
    assert s.dry_run is expected and s.run_matrix is expected and s.index_url == "http://i/simple"


def test_settings_options_override_the_environment(tmp_path):
    s = Settings.from_args(["--root", str(tmp_path), "--dry-run", "1"], {"DRY_RUN": "0"})
    assert s.dry_run is True
    with pytest.raises(ConfigError, match="RUN_MATRIX must be one of 1/0.*got '2'"):
        Settings.from_args(["--root", str(tmp_path)], {"RUN_MATRIX": "2"})


# --- dry run ---------------------------------------------------------------------------------

def test_dry_run_checks_everything_and_prints_the_plan(repo, project):
    code, out, err = release(repo)
    assert code == 0, out + err
    outdir = repo / "dist" / "release"
    names = sorted(p.name for p in outdir.iterdir())
    assert names == ["SHA256SUMS", "blocksparse-2.20.0-py3-none-any.whl",
                     "blocksparse-2.21.0-py3-none-any.whl", "blocksparse-2.21.0.tar.gz"]
    for tf in CELLS.values():  # the cells' wheels, untouched
        wheel = project.wheels[tf]
        assert (outdir / wheel.name).read_bytes() == wheel.read_bytes()
    # The manifest verifies with sha256sum, and the plan shows the same hashes.
    run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=outdir)
    for line in (outdir / "SHA256SUMS").read_text().splitlines():
        assert line in out
    assert f"not released: {SKIPPED_CELL} (skipped)" in out
    assert "tags:        v2.20.0 (new), v2.21.0 (new)" in out
    assert f"upload to:   {DEAD_INDEX}" in out
    assert f"index:       {DEAD_INDEX}simple/ cannot be read" in out
    assert out.count(", to upload)") == 3
    assert "twine check --strict" in out and out.count(": PASSED") == 3
    assert ("command:     twine --no-color upload --non-interactive --disable-progress-bar "
            f"--repository-url {DEAD_INDEX} dist/release/blocksparse-2.20.0-py3-none-any.whl") in out
    assert "DRY_RUN=1: nothing tagged, nothing uploaded" in out
    assert git_out(repo, "tag", "--list") == ""
    assert git_out(repo, "status", "--porcelain") == ""


def test_sdist_is_built_for_the_newest_tensorflow_from_the_committed_tree(repo):
    (repo / "blocksparse" / "_tf_ops.so").write_bytes(os.urandom(64))  # a local build's, ignored by git
    assert release(repo)[0] == 0
    sdist = repo / "dist" / "release" / "blocksparse-2.21.0.tar.gz"
    listing = run(["tar", "-xzOf", str(sdist), "blocksparse-2.21.0/PKG-INFO"], cwd=repo).stdout
    assert "Version: 2.21.0" in listing
    assert 'Requires-Dist: tensorflow<2.22,>=2.21; extra == "tensorflow"' in listing
    names = run(["tar", "-tzf", str(sdist)], cwd=repo).stdout.split()
    assert "blocksparse-2.21.0/setup.py" in names and not [n for n in names if n.endswith(".so")]


@pytest.mark.parametrize("isolation", [True, False], ids=["build-isolation", "no-build-isolation"])
def test_the_sdist_builds_its_own_version_anywhere(project, tmp_path, isolation):
    """pip builds the sdist's own version: in an isolated build environment (no TensorFlow), and
    next to another TensorFlow (this environment's 2.21 under a 2.20 sdist)."""
    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "sdist"),
         "."], cwd=project.path, env=clean_env(BLOCKSPARSE_TF_VERSION="2.20"))
    (sdist,) = (tmp_path / "sdist").glob("*.tar.gz")
    env = clean_env()
    env.pop("BLOCKSPARSE_TF_VERSION", None)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q", "-w", str(tmp_path / "out"),
         *([] if isolation else ["--no-build-isolation"]), str(sdist)], cwd=tmp_path, env=env)
    (wheel,) = (tmp_path / "out").glob("*.whl")
    assert wheel.name == "blocksparse-2.20.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read("blocksparse-2.20.0.dist-info/METADATA").decode()
    assert 'Requires-Dist: tensorflow-cpu<2.21,>=2.20; extra == "tensorflow-cpu"' in metadata
    other = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-build-isolation",
                 "-w", str(tmp_path / "other"), str(sdist)], cwd=tmp_path,
                env=dict(env, BLOCKSPARSE_TF_VERSION="2.19"), check=False)
    assert other.returncode != 0
    assert "this sdist is blocksparse 2.20.0, for TensorFlow 2.20; BLOCKSPARSE_TF_VERSION=2.19" in \
        other.stdout + other.stderr


def test_existing_tag_on_head_is_fine(repo):
    run([*GIT, "tag", "v2.21.0"], cwd=repo)
    code, out, _ = release(repo)
    assert code == 0 and "v2.20.0 (new), v2.21.0 (exists)" in out


def test_tag_on_another_commit_is_refused(repo):
    other = git_out(repo, "commit-tree", "HEAD^{tree}", "-m", "another release")
    run([*GIT, "tag", "v2.20.0", other], cwd=repo)
    code, _, err = release(repo)
    assert code == 8
    assert f"tag v2.20.0 already points at {other[:12]}" in err and "bump PATCH" in err


# --- credentials -----------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["env", "url", "pypirc"])
def test_credentials_never_shown_or_written(repo, where):
    secret = f"s3cret-{secrets.token_hex(8)}"
    env, args = {}, []
    if where == "env":
        env = dict(TWINE_USERNAME="uploader", TWINE_PASSWORD=secret,
                   REPOSITORY_URL="http://127.0.0.1:9/")
    elif where == "url":
        env = dict(REPOSITORY_URL=f"http://uploader:{secret}@127.0.0.1:9/")
    else:
        pypirc = repo.parent / "pypirc"
        pypirc.write_text("[distutils]\nindex-servers = local\n[local]\n"
                          f"repository = http://127.0.0.1:9/\nusername = uploader\n"
                          f"password = {secret}\n")
        args, env = ["--pypirc", str(pypirc)], dict(REPOSITORY_URL="http://127.0.0.1:9")
    code, out, err = release(repo, *args, **env)
    assert code == 0, out + err
    assert secret not in out + err
    for path in files_under(repo / "dist" / "release", repo / "reports"):
        assert secret.encode() not in path.read_bytes(), path
    expected = {"env": "TWINE_USERNAME / TWINE_PASSWORD", "url": "the user:password in "
                "REPOSITORY_URL", "pypirc": "[local]"}[where]
    (shown,) = [line for line in out.splitlines() if line.startswith("  credentials: ")]
    assert expected in shown
    assert "upload to:   http://" in out


def test_pypi_upload_without_credentials_stops_before_tagging(repo):
    code, _, err = release(repo, DRY_RUN="0", REPOSITORY_URL=DEFAULT_REPOSITORY_URL,
                           INDEX_URL=DEAD_INDEX)
    assert code == 2 and "no credentials for https://upload.pypi.org/legacy/" in err
    assert git_out(repo, "tag", "--list") == ""


@pytest.mark.parametrize("same_bytes", [True, False], ids=["same-bytes", "other-bytes"])
def test_a_file_on_the_index_with_other_bytes_stops_before_tagging(repo, monkeypatch, same_bytes):
    def published_files(index, project, **_):  # the sdist: always other bytes (rebuilt each run)
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if same_bytes and p.suffix == ".whl"
                else "0" * 64 for p in (repo / "dist" / "release").iterdir() if p.name != "SHA256SUMS"}

    monkeypatch.setattr("harness.release.published_files", published_files)
    code, out, err = release(repo, DRY_RUN="0", REPOSITORY_URL="http://127.0.0.1:9/")
    if same_bytes:  # a re-run: everything is there already
        assert code == 0 and "nothing to upload: every file is already on the index" in out, out + err
        return
    assert code == 6, out + err
    assert "already serves other files under these names" in err and "bump PATCH" in err
    assert f"blocksparse-2.21.0-py3-none-any.whl: the index has sha256 {'0' * 64}" in err
    assert "blocksparse-2.21.0.tar.gz" not in err
    assert git_out(repo, "tag", "--list") == ""


def test_url_credentials_are_masked_in_errors(repo):
    code, _, err = release(repo, DRY_RUN="maybe", REPOSITORY_URL="http://u:pw-xyz@127.0.0.1:9/")
    assert code == 2 and "DRY_RUN must be one of 1/0" in err and "pw-xyz" not in err
    code, _, err = release(repo, REPOSITORY_URL="ftp://u:pw-xyz@host/")
    assert code == 2 and "REPOSITORY_URL must be an http(s) URL" in err and "pw-xyz" not in err


@pytest.mark.parametrize("url, words", [
    ("https://user:p@ss-xyz@127.0.0.1:9/", "holds a raw '@'; write it as %40"),
    ("https://user:pw-xyz@127.0.0.1:abc/", "the port must be a number from 1 to 65535; got 'abc'"),
    ("https://:pw-xyz@/legacy/", "names no host"),
], ids=["raw-at", "port", "no-host"])
def test_bad_repository_url_stops_before_anything_is_built(repo, url, words):
    code, out, err = release(repo, REPOSITORY_URL=url)
    assert code == 2 and words in err, err
    assert "xyz" not in out + err and "ss-" not in out + err  # no part of the password shown
    assert not (repo / "dist" / "release").exists()


# --- the gate --------------------------------------------------------------------------------

@pytest.mark.parametrize("state, reason", [
    ("missing", "there is no matrix report"),
    ("other-commit", "the matrix report tested commit 000000000000"),
    ("dirty", "made from a tree with uncommitted changes"),
])
def test_stale_report_with_run_matrix_0_names_the_command(repo, state, reason):
    if state == "missing":
        (repo / "reports" / "summary.json").unlink()
    else:
        write_summary(repo, commit="0" * 40 if state == "other-commit" else None,
                      dirty=state == "dirty")
    code, out, err = release(repo, RUN_MATRIX="0")
    assert code == 4
    assert reason in err and "run `make matrix DRY_RUN=0` first (RUN_MATRIX=0" in err
    assert not (repo / "dist" / "release").exists()


@pytest.mark.parametrize("edits, finished, reason", [
    ({SKIPPED_CELL: None}, FINISHED, f"no result for the gating cell(s) {SKIPPED_CELL}"),
    ({"tf2.21-cu12.5-py3.11": {"archs": ("sm_90",)}}, FINISHED,
     "tf2.21-cu12.5-py3.11 was built for GPU targets sm_90, not matrix.yaml's"),
    ({"tf2.20-cu12.5-py3.11": {"pytest_args": ("test/test_layout.py",)}}, FINISHED,
     "tf2.20-cu12.5-py3.11 ran only the tests of PYTEST_ARGS='test/test_layout.py'"),
    (None, None, "the run did not finish"),
], ids=["cells", "archs", "pytest-args", "unfinished"])
def test_partial_report_is_refused(repo, edits, finished, reason):
    write_summary(repo, edits=edits, finished=finished)
    code, out, err = release(repo, RUN_MATRIX="0")
    assert code == 4, out + err
    assert "the matrix report does not cover the whole matrix" in err and reason in err
    assert not (repo / "dist" / "release").exists()


FAKE_MATRIX = """\
import json, os, shutil, sys
from pathlib import Path
Path("matrix-env.json").write_text(json.dumps(dict(os.environ)))
if sys.argv[1] == "good":
    Path("reports").mkdir(exist_ok=True)
    shutil.copy(sys.argv[2], "reports/summary.json")
print("matrix done, TWINE_PASSWORD=" + os.environ.get("TWINE_PASSWORD", "<unset>"))
sys.exit(0 if sys.argv[1] == "good" else 3)
"""


@pytest.mark.parametrize("outcome", ["good", "bad"])
def test_stale_report_runs_the_matrix_first(repo, outcome):
    write_summary(repo, **{"tf2.20-cu12.5-py3.11": "skipped"})  # what the matrix run will report
    good = (repo / "reports" / "summary.json").rename(repo.parent / "good-summary.json")
    script = repo.parent / "fake_matrix.py"
    script.write_text(FAKE_MATRIX)
    # The matrix itself lives in an ignored folder of the clone, so the tree stays clean.
    narrowing = {"CELLS": "tf2.21", "ARCHS": "sm_90", "PYTEST_ARGS": "-k lut"}
    code, out, err = release(repo, "--matrix-command", f"{sys.executable} {script} {outcome} {good}",
                             TWINE_PASSWORD="pw-matrix", REPOSITORY_URL="http://u:pw@127.0.0.1:9/",
                             DRY_RUN="1", **narrowing)
    seen = json.loads((repo / "matrix-env.json").read_text())
    assert not set(seen) & {"TWINE_PASSWORD", "REPOSITORY_URL", "DRY_RUN", "MAKEFLAGS", *narrowing}
    assert ("note: CELLS=tf2.21, ARCHS=sm_90, PYTEST_ARGS=-k lut not passed on: a release's matrix "
            "run covers every cell") in out
    assert "there is no matrix report (reports/summary.json): running" in out
    assert "matrix done, TWINE_PASSWORD=<unset>" in out
    if outcome == "good":
        assert code == 0, out + err
        assert "blocksparse-2.21.0-py3-none-any.whl  <- tf2.21-cu12.5-py3.11" in out
        assert "2.20.0" not in out  # only what the new report passed is released
    else:
        assert code == 4 and "exited with 3 and still there is no matrix report" in err


@pytest.mark.parametrize("status, edits, words", [
    ("regressed", None, "tf2.21-cu12.5-py3.11: regressed: test/test_layout.py::test_lut"),
    ("build-failed", None, "tf2.21-cu12.5-py3.11: build-failed"),
    ("known-fixed", None, "tf2.21-cu12.5-py3.11: known-fixed"),
    ("error", None, "tf2.21-cu12.5-py3.11: error"),
    ("passed", {"passed": 0}, "tf2.21-cu12.5-py3.11: passed, but no test passed (2 skipped)"),
    ("timed-out", None, "cell 'tf2.21-cu12.5-py3.11' key 'status' must be one of passed, built,"),
], ids=["regressed", "build-failed", "known-fixed", "error", "no-test-passed", "unknown-status"])
def test_gate_refuses_a_bad_matrix(repo, status, edits, words):
    write_summary(repo, edits={"tf2.21-cu12.5-py3.11": edits or {}}, **{"tf2.21-cu12.5-py3.11": status})
    code, _, err = release(repo, RUN_MATRIX="0")
    assert code == 5 and words in err
    assert not (repo / "dist" / "release").exists()


def test_a_cell_built_for_a_tensorflow_release_candidate_is_left_out(repo, project):
    """Only TensorFlow 2.21.0rc0 tested for 2.21: its wheel is 2.21.0rc0 (requiring TensorFlow from
    that candidate on), never published as 2.21.0; the release goes on with the others."""
    rc_wheel = project.wheels[RC]
    assert rc_wheel.name == "blocksparse-2.21.0rc0-py3-none-any.whl"
    with zipfile.ZipFile(rc_wheel) as zf:
        metadata = zf.read("blocksparse-2.21.0rc0.dist-info/METADATA").decode()
    assert 'Requires-Dist: tensorflow<2.22,>=2.21.0rc0; extra == "tensorflow"' in metadata
    dist = repo / "dist" / "tf2.21-cu12.5-py3.11"
    shutil.rmtree(dist)
    dist.mkdir()
    shutil.copy2(rc_wheel, dist)
    write_summary(repo)
    code, out, err = release(repo, RUN_MATRIX="0")
    assert code == 0, out + err
    assert ("not released: tf2.21-cu12.5-py3.11 (passed, but built for a pre-release of TensorFlow "
            "(blocksparse-2.21.0rc0-py3-none-any.whl): only final wheels are published)") in out
    assert sorted(p.name for p in (repo / "dist" / "release").iterdir()) == [
        "SHA256SUMS", "blocksparse-2.20.0-py3-none-any.whl", "blocksparse-2.20.0.tar.gz"]


@pytest.mark.parametrize("change", ["modified", "untracked"])
def test_dirty_tree_is_refused(repo, change):
    if change == "modified":
        with open(repo / "README.md", "a") as f:
            f.write("\nlocal edit\n")
    else:
        (repo / "notes.txt").write_text("scratch")
    code, _, err = release(repo)
    assert code == 3 and ("README.md" if change == "modified" else "notes.txt") in err


def test_missing_and_altered_wheels_are_refused(repo, project):
    """The release takes the wheels the report lists, with the bytes the matrix tested."""
    shutil.rmtree(repo / "dist" / "tf2.20-cu12.5-py3.11")
    altered = repo / "dist" / "tf2.21-cu12.5-py3.11" / project.wheels["2.21"].name
    with zipfile.ZipFile(altered, "a") as zf:  # e.g. rebuilt after the matrix ran
        zf.writestr("blocksparse/_rebuilt.py", secrets.token_hex(8))
    code, _, err = release(repo)
    assert code == 6
    assert ("tf2.20-cu12.5-py3.11: dist/tf2.20-cu12.5-py3.11/blocksparse-2.20.0-py3-none-any.whl "
            "is missing: the matrix report lists it") in err
    assert (f"tf2.21-cu12.5-py3.11: dist/tf2.21-cu12.5-py3.11/{altered.name} is not the wheel the "
            "matrix tested (sha256 ") in err
    assert not (repo / "dist" / "release").exists()


def test_a_wheel_for_another_tensorflow_is_refused(repo, project):
    (repo / "dist" / "tf2.21-cu12.5-py3.11" / project.wheels["2.21"].name).unlink()
    shutil.copy2(project.wheels["2.20"], repo / "dist" / "tf2.21-cu12.5-py3.11")
    write_summary(repo)  # the matrix tested it so
    code, _, err = release(repo)
    assert code == 6
    assert "does not match the cell's TensorFlow 2.21" in err
    assert "extra [tensorflow] requires tensorflow<2.21,>=2.20, expected tensorflow<2.22,>=2.21" in err


def test_failed_sdist_build_is_reported(repo):
    with open(repo / "setup.py", "a") as f:
        f.write('\nraise SystemExit("setup.py: broken on purpose")\n')
    run([*GIT, "commit", "-qam", "break the build"], cwd=repo)
    write_summary(repo)
    code, _, err = release(repo)
    assert code == 7
    assert "building the sdist failed" in err and "broken on purpose" in err


# --- rehearsal: a real index, a real upload, a real install ------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def index(tmp_path):
    """pypiserver on 127.0.0.1 with authenticated uploads: (url, packages dir, user, password)."""
    from passlib.apache import HtpasswdFile

    packages = tmp_path / "packages"
    packages.mkdir()
    user, password = "uploader", secrets.token_urlsafe(16)
    htpasswd = HtpasswdFile(str(tmp_path / "htpasswd"), new=True, default_scheme="apr_md5_crypt")
    htpasswd.set_password(user, password)
    htpasswd.save()
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(port),
         "-a", "update", "-P", str(tmp_path / "htpasswd"), "--disable-fallback", str(packages)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "health", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"pypiserver did not start on port {port}") from None
                time.sleep(0.2)
        yield SimpleNamespace(url=url, packages=packages, user=user, password=password)
    finally:
        server.terminate()
        server.wait(timeout=10)


def make_release(repo, **variables):
    """``make release`` in the clone, reusing this test run's venv (``-o``: never reinstall)."""
    env = clean_env(**variables.pop("_env", {}))
    venv = Path(sys.prefix)
    cmd = ["make", "--no-print-directory", "-C", str(repo), "release", f"VENV={venv}",
           "-o", str(venv / ".installed"), *(f"{k}={v}" for k, v in variables.items())]
    return run(cmd, cwd=repo, env=env, check=False)


def index_files(index):
    return {p.name: p.read_bytes() for p in index.packages.iterdir()}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:'crypt' is deprecated:DeprecationWarning")  # passlib, on 3.11
def test_rehearsal_release_to_a_local_index_then_pip_install(repo, index, tmp_path):
    creds = {"TWINE_USERNAME": index.user}
    # 1. A wrong password: the upload fails (after tagging), nothing lands, nothing leaks.
    proc = make_release(repo, DRY_RUN=0, REPOSITORY_URL=index.url,
                        _env=dict(creds, TWINE_PASSWORD="wrong-password-123"))
    assert proc.returncode == 2, proc.stdout + proc.stderr  # make's own exit code on failure
    assert "twine upload failed" in proc.stderr and "safe to re-run" in proc.stderr
    assert "403 Forbidden" in proc.stdout
    assert "wrong-password-123" not in proc.stdout + proc.stderr
    assert index_files(index) == {}

    # 2. The real thing: make release DRY_RUN=0 REPOSITORY_URL=<the index>.
    proc = make_release(repo, DRY_RUN=0, REPOSITORY_URL=index.url,
                        _env=dict(creds, TWINE_PASSWORD=index.password))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert index.password not in proc.stdout + proc.stderr
    uploaded = index_files(index)
    assert sorted(uploaded) == ["blocksparse-2.20.0-py3-none-any.whl",
                                "blocksparse-2.21.0-py3-none-any.whl", "blocksparse-2.21.0.tar.gz"]
    head = git_out(repo, "rev-parse", "HEAD")
    for tag in ("v2.20.0", "v2.21.0"):
        assert git_out(repo, "rev-parse", f"{tag}^{{commit}}") == head

    # 3. Again, credentials in the URL this time: idempotent, every file skipped, none changed.
    url = index.url.replace("http://", f"http://{index.user}:{index.password}@")
    proc = make_release(repo, DRY_RUN=0, REPOSITORY_URL=url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert index.password not in proc.stdout + proc.stderr
    assert proc.stdout.count(", already on the index)") == 3
    assert "nothing to upload: every file is already on the index" in proc.stdout
    assert index_files(index) == uploaded
    for path in files_under(repo / "dist" / "release", repo / "reports"):
        assert index.password.encode() not in path.read_bytes(), path

    # 4. pip install blocksparse from the index into a fresh venv (numpy from the usual index).
    venv = tmp_path / "fresh"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run([*pip, "numpy>=1.26,<2.3"], cwd=tmp_path, env=clean_env())
    run([*pip, "--index-url", index.url + "simple/", "blocksparse"], cwd=tmp_path, env=clean_env())
    probe = "import blocksparse; print(blocksparse.__version__, blocksparse.__file__)"
    version, where = run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path,
                         env=clean_env()).stdout.split()
    assert version == "2.21.0"
    assert Path(where).is_relative_to(venv)
