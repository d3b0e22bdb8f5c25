"""The staged tree: tracked and untracked-but-not-ignored files, nothing else."""
import subprocess

import pytest

from harness.errors import ConfigError
from harness.git import head_commit, state as git_state
from harness.source import stage_tree, tree_files


def make_tree(root):
    for name in ("a.py", "pkg/b.py", ".venv/lib/x.py", "build/lib/a.py", "dist/w.whl",
                 "pkg/__pycache__/b.pyc", "pkg.egg-info/PKG-INFO", "reports/summary.json"):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)


def test_outside_git_the_known_outputs_stay_behind(tmp_path):
    make_tree(tmp_path)
    assert tree_files(tmp_path) == ["a.py", "pkg/b.py"]
    assert git_state(tmp_path) == (None, None)


def test_in_git_the_ignore_file_decides(tmp_path):
    make_tree(tmp_path)
    (tmp_path / ".gitignore").write_text(".venv/\nbuild/\ndist/\n__pycache__/\n*.egg-info/\n"
                                         "reports/\nsecret.txt\n")
    (tmp_path / "secret.txt").write_text("x")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "a.py", ".gitignore"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True)
    (tmp_path / "a.py").write_text("edited")
    assert tree_files(tmp_path) == [".gitignore", "a.py", "pkg/b.py"]  # untracked b.py travels
    commit, dirty = git_state(tmp_path)
    assert len(commit) == 40 and dirty
    dest = stage_tree(tmp_path, tmp_path / "stage")
    assert (dest / "a.py").read_text() == "edited" and not (dest / "secret.txt").exists()
    (tmp_path / "a.py").unlink()  # deleted but still tracked: not copied
    stage_tree(tmp_path, dest)
    assert not (dest / "a.py").exists() and (dest / "pkg" / "b.py").exists()


def test_a_missing_root_is_named_not_taken_for_a_missing_git(tmp_path):
    with pytest.raises(ConfigError, match=f"the repository root {tmp_path / 'gone'} is not a directory") as info:
        head_commit(tmp_path / "gone")
    assert "not installed" not in str(info.value)
