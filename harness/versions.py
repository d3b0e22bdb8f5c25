"""TensorFlow versions, from ``blocksparse/_version.py`` (the one place that parses them).

Loaded by path rather than imported: importing the ``blocksparse`` package imports numpy, which
the harness does not need (CI's report-merging job installs only jinja2 and pyyaml).
"""
import runpy

from .templating import ROOT

__all__ = ["MIN_TF", "tf_minor", "minor_text"]

_VERSION = runpy.run_path(str(ROOT / "blocksparse" / "_version.py"))

#: The oldest TensorFlow ``(major, minor)`` blocksparse supports.
MIN_TF = _VERSION["MIN_TF"]
tf_minor = _VERSION["tf_minor"]
minor_text = _VERSION["minor_text"]
