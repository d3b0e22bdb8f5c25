"""The one jinja2 environment of the harness: Dockerfiles, the GPU workflow, the README table and
the matrix reports are all rendered through it.

``StrictUndefined``: a misspelt variable is an error, never an empty string.  Only ``*.html.j2``
templates are HTML-escaped.
"""
import re
from pathlib import Path

import jinja2

__all__ = ["ROOT", "template_env", "job_id", "duration"]

#: The project root: templates live under it (``docker/``, ``ci/templates/``, ``harness/templates/``).
ROOT = Path(__file__).resolve().parent.parent


def job_id(cell_or_name):
    """A GitHub Actions job id for a cell (letters, digits, ``-`` and ``_`` only)."""
    name = getattr(cell_or_name, "name", cell_or_name)
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def duration(seconds):
    """``m:ss`` of a number of seconds (for the reports)."""
    seconds = int(round(seconds or 0))
    return f"{seconds // 60}:{seconds % 60:02d}"


def template_env(root=ROOT):
    """The environment over the templates under ``root`` (and ``root/harness/templates``)."""
    root = Path(root)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(root), str(root / "harness" / "templates")]),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
        lstrip_blocks=True, autoescape=jinja2.select_autoescape(["html.j2"], default=False,
                                                                 default_for_string=False))
    env.filters.update(job_id=job_id, regex_escape=re.escape, duration=duration)
    return env
