"""Every git fact the harness and the release need, through one way of running git.

The matrix tolerates a tree outside git (`state` gives ``(None, None)``); the release does not
(`head_commit`, `dirty_paths` raise `ConfigError`).
"""
import subprocess
from pathlib import Path

from .errors import ConfigError, TagError

__all__ = ["run_git", "state", "head_commit", "dirty_paths", "listed_files", "tag_commit",
           "create_tag"]


def run_git(root, *args):
    """``git args`` in ``root``: the `subprocess.CompletedProcess` (text), or None without git."""
    try:
        return subprocess.run(["git", *args], cwd=Path(root), capture_output=True, text=True)
    except OSError:
        return None


def _required(root, *args):
    if not Path(root).is_dir():  # else git "is not installed": running it in root fails the same way
        raise ConfigError(f"the repository root {root} is not a directory (--root names the "
                          "checkout to release)")
    proc = run_git(root, *args)
    if proc is None:
        raise ConfigError("git is not installed; a release needs it to name the commit")
    if proc.returncode != 0:
        raise ConfigError(f"`git {' '.join(args)}` failed in {root}: {proc.stderr.strip()}")
    return proc.stdout


def _optional(root, *args):
    proc = run_git(root, *args)
    return proc.stdout if proc is not None and proc.returncode == 0 else None


def head_commit(root):
    """The full hash of ``HEAD`` in the repository at ``root``."""
    return _required(root, "rev-parse", "--verify", "HEAD^{commit}").strip()


def dirty_paths(root):
    """Paths with uncommitted changes, untracked files included (ignored files are not)."""
    out = _required(root, "status", "--porcelain", "--untracked-files=normal")
    return [line[3:] for line in out.splitlines() if line.strip()]


def state(root):
    """``(commit, dirty)`` of the checkout at ``root``; ``(None, None)`` outside git.

    ``dirty`` is true when tracked files differ from ``commit`` or untracked, non-ignored files
    exist: the tested tree is then not exactly ``commit``.
    """
    head = _optional(root, "rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _optional(root, "status", "--porcelain", "--untracked-files=normal")
    return head.strip(), bool(status and status.strip())


def listed_files(root):
    """Tracked files plus untracked, non-ignored ones (relative names); None outside git."""
    out = _optional(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return None if out is None else {n for n in out.split("\0") if n}


def tag_commit(root, tag):
    """The commit the tag ``tag`` points at, or None when there is no such tag."""
    out = _optional(root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}")
    return (out or "").strip() or None


def create_tag(root, tag, commit):
    """Tag ``commit`` as ``tag`` (a lightweight tag: no committer identity needed)."""
    proc = run_git(root, "tag", tag, commit)
    if proc is None or proc.returncode != 0:
        why = proc.stderr.strip() if proc is not None else "git is not installed"
        raise TagError(f"could not create tag {tag} on {commit[:12]}: {why}")
