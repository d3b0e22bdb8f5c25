"""The matrix report's schema: `CellResult` and `Summary`, frozen, read and written as JSON.

``make matrix`` writes them (`harness.report`), ``python -m harness report`` merges them, and the
release gate (`harness.release_gate`) reads them back, all through these two classes; the JSON
form is documented in `harness` (``summary.json``).  Reading checks the fields a release relies
on and names the file, the cell and the key of anything wrong.
"""
import json
from dataclasses import asdict, dataclass, field, fields

from .errors import GateError

__all__ = ["TEST_LISTS", "CellResult", "Summary"]

#: The per-cell lists of test ids, by outcome.
TEST_LISTS = ("regressions", "known", "fixed", "flaky")
_COUNTS = ("passed", "skipped")


def _fields_of(cls, data, skip):
    """The keys of ``data`` that are fields of ``cls`` (but ``skip``), lists made tuples; keys
    a newer harness may have added are ignored."""
    names = {f.name for f in fields(cls)} - {skip}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """One cell's entry of the report (see ``harness/__init__.py`` for every field)."""

    name: str
    status: str
    outcome: str = None            # the underlying status of an ``allowed-failure``
    reason: str = None
    passed: int = 0
    skipped: int = 0
    regressions: tuple = ()
    known: tuple = ()
    fixed: tuple = ()
    flaky: tuple = ()
    details: dict = field(default_factory=dict)
    fixed_entries: tuple = ()
    stale_entries: tuple = ()      # known-failure entries that matched no test of this cell
    tensorflow: str = None
    python: str = None
    cuda: str = None
    cudnn: str = None
    archs: tuple = ()
    image: str = None
    matrix_status: str = None
    gating: bool = True
    wheels: tuple = ()
    log: str = None
    junit: str = None
    duration_s: float = 0.0
    executor: str = None

    def to_json(self):
        """The JSON object (without ``name``: it is the key; ``outcome`` only when set)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}
        if self.outcome is None:
            del data["outcome"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_json(cls, name, entry, where):
        """Read and check one cell's entry; a `GateError` names ``where``, the cell and the key."""
        def bad(key, expected, value):
            return GateError(f"{where}: cell {name!r} key {key!r} must be {expected}; "
                             f"got {value!r}")

        if not isinstance(entry, dict):
            raise GateError(f"{where}: cell {name!r} must be an object; got {type(entry).__name__}")
        status = entry.get("status")
        if not isinstance(status, str) or not status:
            raise GateError(f"{where}: cell {name!r} has no 'status' string; got {status!r}")
        for key in _COUNTS:
            value = entry.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad(key, "a count >= 0", value)
        for key in TEST_LISTS:
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise bad(key, "a list of test ids", value)
        if not isinstance(entry.get("gating", True), bool):
            raise bad("gating", "true or false", entry.get("gating"))
        return cls(name=name, **_fields_of(cls, entry, "name"))


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The whole report: the tested tree, how the run was made, and every cell's result."""

    commit: str
    dirty: bool
    cells: tuple                   # of CellResult, in matrix order
    ok: bool = True
    executor: str = None
    cells_selected: str = None
    pytest_args: tuple = ()
    started: str = None
    finished: str = None
    stale_entries: tuple = ()      # known-failure entries that match no cell of matrix.yaml

    def cell(self, name):
        return next(c for c in self.cells if c.name == name)

    def to_json(self):
        data = asdict(self)
        data["cells"] = {c.name: c.to_json() for c in self.cells}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    def dumps(self):
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def from_json(cls, data, where):
        """Read and check a report; a `GateError` names ``where`` and the key."""
        if not isinstance(data, dict):
            raise GateError(f"{where}: expected an object at the top; got {type(data).__name__}")
        commit, dirty, cells = data.get("commit"), data.get("dirty"), data.get("cells")
        if not isinstance(commit, str) or not commit:
            raise GateError(f"{where}: 'commit' must be the tested commit's hash; got {commit!r}")
        if not isinstance(dirty, bool):
            raise GateError(f"{where}: 'dirty' must be true or false; got {dirty!r}")
        if not isinstance(cells, dict):
            raise GateError(f"{where}: 'cells' must be an object of cell name -> result; "
                            f"got {cells!r}")
        return cls(**_fields_of(cls, data, "cells"),
                   cells=tuple(CellResult.from_json(name, entry, where)
                               for name, entry in cells.items()))
