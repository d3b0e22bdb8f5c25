"""The README's marked examples: the fenced ``python`` block after ``<!-- example: NAME -->``."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def readme_example(name):
    """The code of README example ``name``."""
    match = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", README.read_text("utf-8"), re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)
