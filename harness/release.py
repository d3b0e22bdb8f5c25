"""``make release``: publish the matrix's wheels with twine -- gated, checked, tagged, idempotent.

Steps: the tree must be clean -> ``reports/summary.json`` must belong to ``HEAD`` and cover the
whole matrix (else ``make matrix`` runs first -- every cell, the whole suite: ``CELLS``, ``ARCHS``
and ``PYTEST_ARGS`` are not passed on -- or with ``RUN_MATRIX=0`` the release stops) -> the gate
(no regression, no failed build or error, no known failure that passes, no unknown status, no
passed cell without a passed test; cells built for a TensorFlow pre-release are left out) -> the
wheels the report lists for the released cells are taken from ``dist/<cell>/``, each with the
sha256 the report recorded, and checked (version ``X.Y.P`` for TensorFlow ``X.Y``, no
``+local``, the window ``>=X.Y,<X.(Y+1)`` under both TensorFlow extras, no conflicting
duplicates) -> the sdist is built from the committed tree for the newest TensorFlow of the
release -> ``twine check --strict`` -> ``dist/release/SHA256SUMS``
-> one tag ``vX.Y.P`` per released version on ``HEAD`` -> ``twine upload`` of the files the index
does not hold yet (twine's own ``--skip-existing`` as well on PyPI, the only index it supports).

Settings (read here and nowhere else; ``make release VAR=value`` hands them over through the
environment, so a password in ``REPOSITORY_URL`` is never on a command line):

``DRY_RUN``          ``1`` (default): do every check, print what would be tagged and uploaded, touch
                     nothing outside ``dist/release/``.  ``0``: tag and upload.
``RUN_MATRIX``       ``1`` (default): run ``make matrix`` when the report is missing or stale.
                     ``0``: stop instead, naming the command to run.
``REPOSITORY_URL``   where to upload (default PyPI's upload URL).  A ``user:password@`` in it is
                     taken out of the URL and handed to twine through its environment.
``INDEX_URL``        the simple index showing what ``REPOSITORY_URL`` holds (default: PyPI's for
                     PyPI, else ``<REPOSITORY_URL>/simple/``); files already there are not
                     uploaded again, which makes a re-run idempotent on any index.
``TWINE_USERNAME``, ``TWINE_PASSWORD``  the credentials (read by twine); otherwise the ``.pypirc``
                     section whose ``repository`` is the URL (``--pypirc``, default ``~/.pypirc``).

Credentials are never printed, logged or written: every line shown passes through a masker.
"""
import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import git
from .errors import (ArtifactError, CheckError, ConfigError, DirtyTreeError, FatalError,
                     StaleReportError, TagError, UploadError)
from ._schema import parse_flag
from .matrix import load_matrix
from .release_dists import PROJECT, collect_wheels, sha256_file, write_manifest
from .release_gate import gate, load_summary, stale_reason
from .source import stage_tree
from .release_index import is_pypi, published_files, simple_index_url
from .release_secrets import Credentials, Masker, check_url, split_userinfo

__all__ = ["DEFAULT_REPOSITORY_URL", "Settings", "release", "main"]

DEFAULT_REPOSITORY_URL = "https://upload.pypi.org/legacy/"
MATRIX_COMMAND = ("make", "matrix", "DRY_RUN=0")
SUMMARY = Path("reports") / "summary.json"
RELEASE_DIR = Path("dist") / "release"
MANIFEST = "SHA256SUMS"

# Never handed to the tools the release runs, except twine's credentials to twine: the matrix's
# logs and a build's output must not be able to show them.  MAKEFLAGS repeats the make command
# line (REPOSITORY_URL included) and would also turn the matrix into a dry run.
_PRIVATE_ENV = ("DRY_RUN", "RUN_MATRIX", "REPOSITORY_URL", "INDEX_URL", "MAKEFLAGS", "MFLAGS",
                "TWINE_USERNAME", "TWINE_PASSWORD", "TWINE_REPOSITORY", "TWINE_REPOSITORY_URL")
# `make matrix` settings that narrow a run (`make release CELLS=...` exports them): the matrix
# run of a release covers every cell with the whole suite, so they never reach it.
_NARROWING_ENV = ("CELLS", "ARCHS", "PYTEST_ARGS")
@dataclass(frozen=True, kw_only=True)
class Settings:
    """What one release run does; see the module docstring for the environment variables."""

    root: Path
    dry_run: bool = True
    run_matrix: bool = True
    repository_url: str = DEFAULT_REPOSITORY_URL
    index_url: str = None
    matrix_command: tuple = MATRIX_COMMAND
    pypirc: Path = Path("~/.pypirc").expanduser()

    @classmethod
    def from_args(cls, argv, environ):
        """Settings from command-line options, falling back to the environment variables."""
        parser = argparse.ArgumentParser(
            prog="python -m harness.release",
            description="Gate, check, tag and upload the matrix's wheels (see `make release`).")
        parser.add_argument("--root", type=Path, default=Path.cwd(),
                            help="repository root (default: the current directory)")
        parser.add_argument("--dry-run", metavar="0|1", default=environ.get("DRY_RUN"),
                            help="1: only print what would be uploaded (default; env DRY_RUN)")
        parser.add_argument("--run-matrix", metavar="0|1", default=environ.get("RUN_MATRIX"),
                            help="1: run the matrix when its report is stale (default; "
                                 "env RUN_MATRIX)")
        parser.add_argument("--matrix-command", default=" ".join(MATRIX_COMMAND),
                            help="command that writes reports/summary.json (default: %(default)s)")
        parser.add_argument("--pypirc", type=Path, default=Path("~/.pypirc").expanduser(),
                            help="the .pypirc to look the repository up in (default: %(default)s)")
        args = parser.parse_args(argv)
        url = (environ.get("REPOSITORY_URL") or "").strip() or DEFAULT_REPOSITORY_URL
        check_url("REPOSITORY_URL", url)
        index_url = (environ.get("INDEX_URL") or "").strip() or None
        if index_url:
            check_url("INDEX_URL", index_url)
        if not args.matrix_command.split():
            raise ConfigError("--matrix-command must name a command (default: "
                              f"{' '.join(MATRIX_COMMAND)!r}); got an empty one")
        return cls(root=args.root.resolve(), dry_run=parse_flag("DRY_RUN", args.dry_run, True),
                   run_matrix=parse_flag("RUN_MATRIX", args.run_matrix, True), repository_url=url,
                   index_url=index_url,
                   matrix_command=tuple(args.matrix_command.split()), pypirc=args.pypirc)


class Console:
    """Prints progress; every line goes through the masker first."""

    def __init__(self, masker, stream=None, err_stream=None):
        self.mask = masker
        self.stream = stream or sys.stdout
        self.err_stream = err_stream or sys.stderr

    def say(self, text="", *, error=False):
        for line in str(text).splitlines() or [""]:
            print(self.mask(line), file=self.err_stream if error else self.stream, flush=True)

    @contextmanager
    def step(self, title):
        self.say(f"==> {title}")
        start = time.monotonic()
        yield
        self.say(f"    ({time.monotonic() - start:.1f}s)")

    def run(self, cmd, *, cwd, env, show=True):
        """Run ``cmd``; stream its output (masked) when ``show``; return (exit code, output)."""
        self.say(f"$ {' '.join(cmd)}")
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace")
        except OSError as exc:
            raise ConfigError(f"cannot run {cmd[0]!r}: {exc.strerror or exc}") from None
        lines = []
        for line in proc.stdout:
            lines.append(self.mask(line.rstrip("\n")))
            if show:
                self.say(f"    {lines[-1]}")
        return proc.wait(), "\n".join(lines)


def _child_env(environ, **extra):
    env = {k: v for k, v in environ.items() if k not in _PRIVATE_ENV + _NARROWING_ENV}
    env.update(extra)
    return env


def _fresh_summary(settings, console, environ, head):
    """``(summary, cells)``: the matrix report for ``head`` and its whole matrix (loaded, or made by
    running the matrix first), and matrix.yaml's cells."""
    path = settings.root / SUMMARY
    cells = load_matrix(settings.root / "matrix.yaml")
    summary = load_summary(path)
    reason = stale_reason(summary, head, cells)
    if reason is None:
        return summary, cells
    command = " ".join(settings.matrix_command)
    if not settings.run_matrix:
        raise StaleReportError(f"{reason}; run `{command}` first (RUN_MATRIX=0 stops here)")
    ignored = [f"{k}={environ[k]}" for k in _NARROWING_ENV if environ.get(k, "").strip()]
    if ignored:
        console.say(f"note: {', '.join(ignored)} not passed on: a release's matrix run covers "
                    "every cell with the whole test suite")
    with console.step(f"{reason}: running `{command}`"):
        code, _ = console.run(list(settings.matrix_command), cwd=settings.root,
                              env=_child_env(environ))
    summary = load_summary(path)
    reason = stale_reason(summary, head, cells)
    if reason is not None:
        raise StaleReportError(f"`{command}` exited with {code} and still {reason}")
    return summary, cells


def _build_sdist(settings, console, environ, outdir, version):
    """Build the sdist into ``outdir`` for TensorFlow ``major.minor`` of ``version``, from a copy
    of the committed tree (never a local build's op library, ignored files or ``build/``)."""
    tf = f"{version.major}.{version.minor}"
    with tempfile.TemporaryDirectory(prefix="blocksparse-sdist-") as tmp:
        src = stage_tree(settings.root, Path(tmp) / "src")
        cmd = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
               str(outdir), "."]
        code, output = console.run(cmd, cwd=src, show=False,
                                   env=_child_env(environ, BLOCKSPARSE_TF_VERSION=tf))
    expected = outdir / f"{PROJECT}-{version}.tar.gz"
    if code != 0:
        raise CheckError(f"building the sdist failed (exit {code}):\n{output}")
    if not expected.is_file():
        raise CheckError(f"building the sdist made {sorted(p.name for p in outdir.iterdir())}, "
                         f"expected {expected.name}")
    return expected


def _twine(*args):
    return [sys.executable, "-m", "twine", "--no-color", *args]


def _plan_tags(root, versions, head):
    """``[(tag, exists)]`` for the versions; a tag already on another commit is an error."""
    plan, problems = [], []
    for version in versions:
        tag = f"v{version}"
        commit = git.tag_commit(root, tag)
        if commit is not None and commit != head:
            problems.append(f"tag {tag} already points at {commit[:12]}, not HEAD {head[:12]}: "
                            f"{version} was released from another commit; bump PATCH in "
                            "blocksparse/_version.py")
        plan.append((tag, commit is not None))
    if problems:
        raise TagError("\n".join(problems))
    return plan


def release(settings, environ, console):
    """Run the release described by ``settings``; raises a :class:`FatalError` subclass."""
    root = settings.root
    dirty = git.dirty_paths(root)
    if dirty:
        shown = ", ".join(dirty[:8]) + (" ..." if len(dirty) > 8 else "")
        raise DirtyTreeError(f"the working tree has uncommitted changes ({shown}); "
                             "commit or stash them: a release is made from a commit")
    head = git.head_commit(root)
    summary, cells = _fresh_summary(settings, console, environ, head)
    with console.step(f"gate: matrix report for {head[:12]}"):
        result = gate(summary, cells)
        for name, why in result.left_out:
            console.say(f"    not released: {name} ({why})")
        for note in result.notes:
            console.say(f"    note: {note}")
    # Before the wheels and the sdist are built: a bad .pypirc is a setting, found at once.
    creds = Credentials.resolve(settings.repository_url, environ, settings.pypirc,
                                DEFAULT_REPOSITORY_URL)
    console.mask = console.mask.adding(creds.secrets)
    if creds.anonymous and is_pypi(settings.repository_url) and not settings.dry_run:
        raise ConfigError(f"no credentials for {settings.repository_url}: set TWINE_USERNAME="
                          "__token__ and TWINE_PASSWORD=<API token>, or a .pypirc [pypi] section")
    wheels, files = _build_release_dir(settings, console, environ, result.released)
    manifest = write_manifest(files, root / RELEASE_DIR / MANIFEST)
    tags = _plan_tags(root, sorted({w.version for w in wheels}), head)
    on_index, index_note = _on_index(settings, creds)
    _refuse_other_bytes_on_index(files, on_index, index_note)
    todo = [f for f in files if f.name not in on_index]
    upload_cmd = None
    if todo:
        skip = ("--skip-existing",) if is_pypi(settings.repository_url) else ()
        upload_cmd = _twine("upload", "--non-interactive", "--disable-progress-bar", *skip, *creds.twine_args,
                            *(str(f.relative_to(root)) for f in todo))
    _print_plan(console, settings, head, files, on_index, manifest, tags, creds, index_note,
                upload_cmd)
    if settings.dry_run:
        console.say("DRY_RUN=1: nothing tagged, nothing uploaded.  To publish: "
                    "make release DRY_RUN=0 [REPOSITORY_URL=...]")
        return 0
    with console.step("tag"):
        for tag, exists in tags:
            if exists:
                console.say(f"    {tag} already on HEAD")
            else:
                git.create_tag(root, tag, head)
                console.say(f"    {tag} -> {head[:12]} (push it: git push origin {tag})")
    if upload_cmd is None:
        console.say("nothing to upload: every file is already on the index")
        return 0
    with console.step("twine upload"):
        code, _ = console.run(upload_cmd, cwd=root, env=_child_env(environ, **creds.env))
        if code != 0:
            raise UploadError(f"twine upload failed (exit {code}); it is safe to re-run: "
                              "files already on the index are left out")
    console.say(f"released {len(todo)} files from {head[:12]}")
    return 0


def _build_release_dir(settings, console, environ, cells):
    """Fill ``dist/release/`` with the cells' checked wheels and the sdist; twine-check them."""
    root = settings.root
    with console.step("collect and check the cells' wheels"):
        wheels = collect_wheels(root, cells)
        outdir = root / RELEASE_DIR
        shutil.rmtree(outdir, ignore_errors=True)
        outdir.mkdir(parents=True)
        for wheel in wheels:
            shutil.copy2(wheel.path, outdir / wheel.path.name)
            console.say(f"    {wheel.path.name}  <- {', '.join(wheel.cells)}")
    newest = wheels[-1].version
    with console.step(f"build the sdist (for TensorFlow {newest.major}.{newest.minor})"):
        sdist = _build_sdist(settings, console, environ, outdir, newest)
    files = sorted(outdir / w.path.name for w in wheels) + [sdist]
    with console.step("twine check --strict"):
        code, _ = console.run(_twine("check", "--strict", *(str(f.relative_to(root))
                                                            for f in files)),
                              cwd=root, env=_child_env(environ))
        if code != 0:
            raise CheckError(f"twine check --strict failed (exit {code})")
    return wheels, files


def _refuse_other_bytes_on_index(files, on_index, index_note):
    """A wheel name the index serves with another sha256 is another build of that version (from
    another commit, say): the release must not tag and report it as published.  (The sdist is
    rebuilt by every run, with new timestamps: its bytes never match an earlier upload's.)"""
    conflicts = [f"{path.name}: the index has sha256 {on_index[path.name]}, this release "
                 f"{sha256_file(path)}" for path in files
                 if path.suffix == ".whl" and on_index.get(path.name) not in (None, sha256_file(path))]
    if conflicts:
        raise ArtifactError(f"the index ({index_note}) already serves other files under these names: "
                            "that version was released before, from other bytes; bump PATCH in "
                            "blocksparse/_version.py:\n  " + "\n  ".join(conflicts))


def _on_index(settings, creds):
    """``{name: sha256 or None}`` of our files the index already holds, and a line saying how
    that was found."""
    index = simple_index_url(split_userinfo(settings.repository_url)[0], settings.index_url)
    try:
        present = published_files(index, PROJECT, username=creds.username,
                                  password=creds.password)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return {}, f"{index} cannot be read ({exc}): every file will be uploaded"
    return present, f"{index} ({len(present)} {PROJECT} files there)"


def _print_plan(console, settings, head, files, on_index, manifest, tags, creds, index_note,
                upload_cmd):
    console.say(f"release of {head[:12]} ({'dry run' if settings.dry_run else 'upload'}):")
    for path in files:
        state = "already on the index" if path.name in on_index else "to upload"
        console.say(f"    {sha256_file(path)}  {path.name}  ({path.stat().st_size} bytes, "
                    f"{state})")
    console.say(f"  manifest:    {manifest.relative_to(settings.root)}")
    console.say("  tags:        " + ", ".join(f"{t} ({'exists' if e else 'new'})" for t, e in tags))
    console.say(f"  upload to:   {settings.repository_url}")
    console.say(f"  index:       {index_note}")
    console.say(f"  credentials: {creds.source}")
    console.say("  command:     " + (f"twine {' '.join(upload_cmd[3:])}" if upload_cmd
                                     else "none: every file is already on the index"))


def main(argv=None, environ=None, stream=None, err_stream=None):
    """Command-line entry point; returns the exit code (0, or the error's ``exit_code``)."""
    environ = os.environ if environ is None else environ
    try:
        url_password = split_userinfo(environ.get("REPOSITORY_URL", ""))[2]
    except ValueError:  # a malformed URL: Settings rejects it; the URL pattern still masks it
        url_password = None
    console = Console(Masker([environ.get("TWINE_PASSWORD"), url_password]), stream, err_stream)
    try:
        settings = Settings.from_args(argv, environ)
        return release(settings, environ, console)
    except FatalError as exc:
        console.say(f"make release: error: {exc}", error=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
