"""One exit-code table for the harness and the release, and the README shows it."""
import re

from harness import errors
from harness.render import ROOT


def test_every_kind_has_its_own_code():
    kinds = [getattr(errors, n) for n in errors.__all__
             if isinstance(getattr(errors, n), type) and n != "FatalError"]
    codes = [k.exit_code for k in kinds]
    assert len(set(codes)) == len(codes) == 10
    assert all(issubclass(k, errors.FatalError) for k in kinds)
    assert set(errors.EXIT_CODES) == {0, errors.CELLS_FAILED, errors.INTERRUPTED, *codes}


def test_the_readme_table_is_the_table():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M)
    assert [int(code) for code, _ in rows] == sorted(errors.EXIT_CODES)


def test_the_module_docstring_lists_every_code():
    listed = re.findall(r"^(\d+)\s{2,}", errors.__doc__, re.M)
    assert [int(c) for c in listed] == sorted(errors.EXIT_CODES)
