"""The tree under test: which commit it is, whether it is dirty, and a clean copy of its files.

Cells build from a copy of the working tree -- tracked files plus untracked files that git does
not ignore, as they are on disk -- so a cell never sees ``.venv``, old builds or other cells'
outputs, and the container gets exactly what a fresh clone (plus local edits) would hold.
"""
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["git_state", "tree_files", "stage_tree"]

# Outside a git checkout: the outputs and environments that must not travel with the sources.
_SKIP_DIRS = {".git", ".venv", ".tox", ".matrix", ".pytest_cache", "__pycache__", "build",
              "dist", "reports"}
_SKIP_SUFFIXES = (".pyc", ".so", ".egg-info")


def _git(repo, *args):
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout


def git_state(repo):
    """``(commit, dirty)`` of the checkout at ``repo``; ``(None, None)`` outside git.

    ``dirty`` is true when tracked files differ from ``commit`` or untracked, non-ignored files
    exist: the tested tree is then not exactly ``commit``.
    """
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _git(repo, "status", "--porcelain", "--untracked-files=normal")
    return head.decode().strip(), bool(status and status.strip())


def tree_files(repo):
    """Paths (relative, sorted) of the files that make up the working tree."""
    repo = Path(repo)
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is not None:
        names = {n for n in listed.decode().split("\0") if n}
        return sorted(n for n in names if (repo / n).is_file())
    found = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        rel = Path(root).relative_to(repo)
        found += [str(rel / f) if str(rel) != "." else f for f in files
                  if not f.endswith(_SKIP_SUFFIXES)]
    return sorted(found)


def stage_tree(repo, dest):
    """Copy the working tree of ``repo`` into ``dest`` (emptied first); returns ``dest``."""
    repo, dest = Path(repo), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    for name in tree_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)
    return dest
