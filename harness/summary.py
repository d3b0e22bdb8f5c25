"""The matrix report's schema: `CellResult` and `Summary`, frozen, read and written as JSON.

``make matrix`` writes them (`harness.report`), ``python -m harness report`` merges them, and the
release gate (`harness.release_gate`) reads them back, all through these two classes; the JSON
form is documented in `harness` (``summary.json``).  Reading checks the fields a release relies
on and names the file, the cell and the key of anything wrong.  `coverage_gaps` says whether a
report vouches for the whole matrix: the one rule of what a complete report is, for the report
itself (``complete``, ``incomplete``) and the release.
"""
import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass, field, fields

from .errors import GateError

__all__ = ["STATUSES", "FAILING", "TEST_LISTS", "CellResult", "Summary", "coverage_gaps",
           "status_conflicts", "sha256_file", "wheel_record"]

#: A cell's status.  The ``FAILING`` ones fail the run unless the cell is allowed to fail, in
#: which case its status is ``allowed-failure`` and ``outcome`` keeps the underlying one.
STATUSES = ("passed", "built", "regressed", "known-fixed", "build-failed", "error", "skipped",
            "allowed-failure")
FAILING = ("regressed", "known-fixed", "build-failed", "error")
#: The per-cell lists of test ids, by outcome.
TEST_LISTS = ("regressions", "known", "fixed", "flaky")
_COUNTS = ("passed", "skipped")


def sha256_file(path):
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def wheel_record(path, root):
    """``{"path": <relative to root>, "sha256": ...}``: a wheel as a cell result lists it."""
    return {"path": path.relative_to(root).as_posix(), "sha256": sha256_file(path)}


def _is_wheel_record(value):
    return (isinstance(value, dict) and isinstance(value.get("path"), str)
            and isinstance(value.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", value["sha256"]) is not None)


def _text_or_none(v):
    return v is None or isinstance(v, str)


def _texts(v):
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _objects(v):
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: The optional keys' types (present keys only): (check, what the message says is expected).
_TEXT, _TEXTS, _OBJECTS = (_text_or_none, "a string or null"), (_texts, "a list of strings"), \
    (_objects, "a list of objects")
_CELL_TYPES = {**{k: _TEXT for k in ("outcome", "reason", "tensorflow", "python", "cuda", "cudnn", "image",
                                     "matrix_status", "commit", "log", "junit", "executor")},
               "details": (lambda v: isinstance(v, dict), "an object"),
               "fixed_entries": _OBJECTS, "stale_entries": _OBJECTS, "archs": _TEXTS, "pytest_args": _TEXTS,
               "dirty": (lambda v: v is None or isinstance(v, bool), "true, false or null"),
               "duration_s": (_number, "a number of seconds")}
_SUMMARY_TYPES = {**{k: _TEXT for k in ("executor", "cells_selected", "started", "finished")},
                  "ok": (lambda v: isinstance(v, bool), "true or false"), "pytest_args": _TEXTS,
                  "archs": (lambda v: v is None or _texts(v), "a list of strings or null"),
                  "stale_entries": _OBJECTS, "incomplete": _TEXTS}


def _check_types(data, types, bad):
    """Raise ``bad(key, expected, value)`` for the first present key of ``types`` of the wrong type."""
    for key, (ok, expected) in types.items():
        if key in data and not ok(data[key]):
            raise bad(key, expected, data[key])


def _fields_of(cls, data, skip):
    """The keys of ``data`` that are fields of ``cls`` (but ``skip``), lists made tuples; keys
    a newer harness may have added are ignored."""
    names = {f.name for f in fields(cls)} - {skip}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """One cell's entry of the report (see ``harness/__init__.py`` for every field)."""

    name: str
    status: str                    # one of STATUSES
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
    wheels: tuple = ()             # of {"path", "sha256"}: what the cell built, and tested
    commit: str = None             # the tree the cell tested (see Summary)
    dirty: bool = None
    pytest_args: tuple = ()        # the tests it ran: () is the whole suite
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
        if status not in STATUSES:
            raise bad("status", f"one of {', '.join(STATUSES)}", status)
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
        wheels = entry.get("wheels", [])
        if not isinstance(wheels, list) or not all(map(_is_wheel_record, wheels)):
            raise bad("wheels", 'a list of {"path": ..., "sha256": <64 hex digits>}', wheels)
        _check_types(entry, _CELL_TYPES, bad)
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
    archs: tuple = None            # ARCHS: every cell's GPU targets instead of matrix.yaml's
    started: str = None
    finished: str = None           # None: the run did not finish (interrupted, or still running)
    stale_entries: tuple = ()      # known-failure entries that match no cell of matrix.yaml
    incomplete: tuple = ()         # coverage_gaps() when the report was written

    @property
    def complete(self):
        """Whether the report vouched for the whole matrix when it was written."""
        return not self.incomplete

    def cell(self, name):
        return next(c for c in self.cells if c.name == name)

    def to_json(self):
        data = asdict(self)
        data["cells"] = {c.name: c.to_json() for c in self.cells}
        data["complete"] = self.complete
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    def dumps(self):
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def from_json(cls, data, where):
        """Read and check a report; a `GateError` names ``where`` and the key."""
        if not isinstance(data, dict):
            raise GateError(f"{where}: expected an object at the top; got {type(data).__name__}")
        commit, dirty, cells = data.get("commit"), data.get("dirty"), data.get("cells")
        # a report of no cell result (``harness report`` over an empty reports/) names no tree
        empty = cells == {} and commit is None and dirty is None
        if not empty and (not isinstance(commit, str) or not commit):
            raise GateError(f"{where}: 'commit' must be the tested commit's hash; got {commit!r}")
        if not empty and not isinstance(dirty, bool):
            raise GateError(f"{where}: 'dirty' must be true or false; got {dirty!r}")
        if not isinstance(cells, dict):
            raise GateError(f"{where}: 'cells' must be an object of cell name -> result; "
                            f"got {cells!r}")
        _check_types(data, _SUMMARY_TYPES,
                     lambda key, expected, value: GateError(f"{where}: {key!r} must be {expected}; got {value!r}"))
        return cls(**_fields_of(cls, data, "cells"),
                   cells=tuple(CellResult.from_json(name, entry, where)
                               for name, entry in cells.items()))


def status_conflicts(results, cells):
    """Results whose status matrix.yaml's cell cannot have, as sentences; empty when none.

    ``results`` are `CellResult` objects, ``cells`` matrix.yaml's.  A gating cell is never
    ``allowed-failure`` (its failure counts), and a tested one never ``built`` (compile-only: no
    test ran); a result that says so cannot vouch for the cell, whatever it built.
    """
    wanted = {c.name: c for c in cells}
    problems = []
    for result in results:
        cell = wanted.get(result.name)
        if cell is None:
            continue
        if result.status == "allowed-failure" and cell.gating:
            problems.append(f"{result.name}: reported 'allowed-failure' (outcome {result.outcome!r}), "
                            f"but matrix.yaml's status is {cell.status!r}: the cell gates, it failed")
        elif result.status == "built" and cell.tested:
            problems.append(f"{result.name}: reported 'built' (compile-only, no test ran), but "
                            f"matrix.yaml's status is {cell.status!r}: its tests must run")
    return problems


def coverage_gaps(summary, cells):
    """Why ``summary`` does not vouch for the whole matrix, as sentences; empty when it does.

    ``cells`` are matrix.yaml's (`harness.matrix.Cell`).  A complete report comes from a run that
    finished and has a result for every gating cell and no other, each made at the report's
    commit, for matrix.yaml's GPU targets, with the whole test suite: not a run narrowed by
    ``CELLS``, ``ARCHS`` or ``PYTEST_ARGS``, nor a merge that lacks a cell.
    """
    gaps = [] if summary.finished else ["the run did not finish (interrupted, or still running)"]
    wanted = {c.name: c for c in cells}
    have = {c.name: c for c in summary.cells}
    missing = [name for name, cell in wanted.items() if cell.gating and name not in have]
    if missing:
        gaps.append(f"no result for the gating cell(s) {', '.join(missing)}")
    extra = [name for name in have if name not in wanted]
    if extra:
        gaps.append(f"cell(s) {', '.join(extra)} are not in matrix.yaml")
    for name, cell in wanted.items():
        result = have.get(name)
        if result is None or not cell.gating:
            continue
        if tuple(result.archs) != tuple(cell.archs):
            gaps.append(f"{name} was built for GPU targets {','.join(result.archs) or 'not recorded'}, "
                        f"not matrix.yaml's {','.join(cell.archs)} (ARCHS=)")
        if result.pytest_args:
            gaps.append(f"{name} ran only the tests of PYTEST_ARGS={shlex.join(result.pytest_args)!r}")
        if (result.commit, result.dirty) != (summary.commit, summary.dirty):
            gaps.append(f"{name} was tested at commit {result.commit} (dirty: {result.dirty}), the "
                        f"report is for {summary.commit} (dirty: {summary.dirty})")
    return tuple(gaps)
