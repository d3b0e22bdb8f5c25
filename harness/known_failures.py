"""``ci/known_failures.yaml``: known test failures as data, validated at load.

The file is a list of entries::

    - test: "test/test_x.py::test_y"   # pytest node id; a glob is allowed
      cells: "tf2\\\\.1[67]"             # regex searched in cell names; omitted = every cell
      kind: fail                       # fail | flaky | hang
      reason: "why, in one line"
      link: "https://..."              # optional
      reruns: 2                        # flaky only: re-runs after a failure (default 2)
      timeout: 60                      # hang only: seconds before the test is stopped (default 60)

The cell's pytest run applies them through `harness.pytest_known_failures` (see there for what
each kind does); this module only checks the file and hands the entries over as JSON.
"""
import json
import os
from dataclasses import asdict, dataclass

from ._schema import Fields, load_yaml
from .errors import ConfigError
from .pytest_known_failures import DEFAULT_HANG_TIMEOUT, DEFAULT_RERUNS, KINDS, cell_matches

__all__ = ["KnownFailure", "load_known_failures", "parse_known_failures", "plugin_json",
           "stale_for_matrix"]

_KEYS = ("test", "cells", "kind", "reason", "link", "reruns", "timeout")


@dataclass(frozen=True, kw_only=True)
class KnownFailure:
    """One entry of ``ci/known_failures.yaml``; ``entry`` is its 1-based position in the file."""

    entry: int
    test: str
    cells: str = None
    kind: str
    reason: str
    link: str = None
    reruns: int = None
    timeout: float = None


def load_known_failures(path):
    """Read and validate a known-failures file; a missing file means no known failures."""
    if not os.path.lexists(path):
        return ()
    return parse_known_failures(load_yaml(path), source=str(path))


def parse_known_failures(data, source="ci/known_failures.yaml"):
    """Validate the parsed YAML of a known-failures file into a tuple of `KnownFailure` (pure)."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError(f"{source}: expected a list of entries, got {type(data).__name__}")
    entries, seen = [], {}
    for i, raw in enumerate(data, start=1):
        test = raw.get("test") if isinstance(raw, dict) else None
        where = f"{source}: entry {i}" + (f" ({test})" if isinstance(test, str) and test else "")
        f = Fields(raw, where, _KEYS)
        kind = f.choice("kind", KINDS)
        entry = KnownFailure(
            entry=i,
            test=f.string("test", pattern=r"\S(?:.*\S)?", example="test/test_x.py::test_y"),  # ids may hold spaces
            cells=f.regex("cells", required=False),
            kind=kind,
            reason=f.string("reason", pattern=r"[^\n]*\S[^\n]*", example="why, in one line"),
            link=f.string("link", pattern=r"https?://\S+", example="https://github.com/...",
                          required=False),
            reruns=_only_for(f, "reruns", "flaky", kind,
                             lambda: f.number("reruns", minimum=1, maximum=10, integer=True)),
            timeout=_only_for(f, "timeout", "hang", kind,
                              lambda: f.number("timeout", minimum=1)),
        )
        key = (entry.test, entry.cells or None)  # an empty and an omitted cells: every cell
        if key in seen:
            raise ConfigError(f"{where}: same test and cells as entry {seen[key]} (an empty or "
                              f"omitted 'cells' means every cell); only the first entry would "
                              f"apply: merge them into one")
        seen[key] = i
        entries.append(entry)
    return tuple(entries)


def _only_for(f, key, kind_needed, kind, read):
    if not f.has(key):
        return None
    if kind != kind_needed:
        raise f.error(key, f"only applies to kind {kind_needed}; this entry is kind {kind}")
    return read()


def plugin_json(entries, source="ci/known_failures.yaml"):
    """The JSON the pytest plugin reads (``--known-failures``), defaults filled in."""
    payload = []
    for e in entries:
        d = asdict(e)
        if e.kind == "flaky" and d["reruns"] is None:
            d["reruns"] = DEFAULT_RERUNS
        if e.kind == "hang" and d["timeout"] is None:
            d["timeout"] = DEFAULT_HANG_TIMEOUT
        payload.append(d)
    return json.dumps({"source": source, "entries": payload}, indent=1, sort_keys=True)


def stale_for_matrix(entries, cells):
    """The entries whose ``cells`` regex selects no cell of the matrix, as report records.

    (An entry that selects cells but no test of them is found by the plugin, in each cell.)
    """
    names = [c.name for c in cells]
    return tuple({"entry": e.entry, "test": e.test, "cells": e.cells,
                  "why": f"its cells regex {e.cells!r} matches no cell of matrix.yaml"}
                 for e in entries if not any(cell_matches(e.cells, n) for n in names))
