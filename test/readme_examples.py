"""The README's marked examples: the fenced ``python`` block after ``<!-- example: NAME -->``.

Every test of a README example reads it here: :func:`readme_example` gives its code,
:func:`run_readme_example` runs it in a fresh namespace of this process.
"""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\s*```python\n(?P<code>.*?)```", re.S)


def examples():
    """``{name: code}`` of every marked example, in the README's order."""
    return {m.group("name"): m.group("code") for m in _EXAMPLE.finditer(README.read_text("utf-8"))}


def readme_example(name):
    """The code of README example ``name``."""
    found = examples()
    assert name in found, f"README example {name!r} not found; the README marks {sorted(found)}"
    return found[name]


def run_readme_example(name):
    """Run README example ``name`` as printed, in a fresh namespace of this process (tracebacks
    name ``README:<name>``); returns the namespace."""
    scope = {}
    exec(compile(readme_example(name), f"README:{name}", "exec"), scope)
    return scope
