"""The tree under test: a clean copy of its files (its commit and state: `harness.git`).

Cells build from a copy of the working tree -- tracked files plus untracked files that git does
not ignore, as they are on disk -- so a cell never sees ``.venv``, old builds or other cells'
outputs, and the container gets exactly what a fresh clone (plus local edits) would hold.
"""
import os
import shutil
from pathlib import Path

from . import git

__all__ = ["tree_files", "stage_tree"]

# Outside a git checkout: the outputs and environments that must not travel with the sources.
_SKIP_DIRS = {".git", ".venv", ".tox", ".matrix", ".pytest_cache", "__pycache__", "build",
              "dist", "reports"}
_SKIP_SUFFIXES = (".pyc", ".so", ".egg-info")


def tree_files(repo):
    """Paths (relative, sorted) of the files that make up the working tree."""
    repo = Path(repo)
    names = git.listed_files(repo)
    if names is not None:
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
