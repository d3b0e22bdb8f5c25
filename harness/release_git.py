"""The git facts a release needs: the commit, whether the tree is clean, and the release tags."""
import subprocess
from pathlib import Path

from .release_errors import ConfigError, TagError

__all__ = ["head_commit", "dirty_paths", "tag_commit", "create_tag"]


def _git(root, *args, check=True):
    try:
        proc = subprocess.run(["git", *args], cwd=Path(root), capture_output=True, text=True)
    except FileNotFoundError:
        raise ConfigError("git is not installed; a release needs it to name the commit") from None
    if check and proc.returncode != 0:
        raise ConfigError(f"`git {' '.join(args)}` failed in {root}: {proc.stderr.strip()}")
    return proc


def head_commit(root):
    """The full hash of ``HEAD`` in the repository at ``root``."""
    return _git(root, "rev-parse", "--verify", "HEAD^{commit}").stdout.strip()


def dirty_paths(root):
    """Paths with uncommitted changes, untracked files included (ignored files are not)."""
    out = _git(root, "status", "--porcelain", "--untracked-files=normal").stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def tag_commit(root, tag):
    """The commit the tag ``tag`` points at, or None when there is no such tag."""
    proc = _git(root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}", check=False)
    return proc.stdout.strip() or None


def create_tag(root, tag, commit):
    """Tag ``commit`` as ``tag`` (a lightweight tag: no committer identity needed)."""
    proc = _git(root, "tag", tag, commit, check=False)
    if proc.returncode != 0:
        raise TagError(f"could not create tag {tag} on {commit[:12]}: {proc.stderr.strip()}")
