"""Measured timing tables of the dispatch cost model: their format, checks and files.

A table is a JSON file ``tables/<framework>-<device>.json`` (``torch-cpu.json``, ``torch-cuda.json``,
``tensorflow-cpu.json``, ...), written by ``bench/dispatch.py`` (``make bench``)::

    {"format": 1, "framework": "torch", "device": "cpu", "device_name": "...",
     "created": "2026-12-01", "method": "...", "software": {...},
     "rows": [{"tokens": 1024, "in_features": 4096, "out_features": 4096, "block_size": 32,
               "density": 0.25, "dtype": "float32", "layout": "random", "structured": false,
               "fwd_ms": {"dense": 1.9, "portable": 2.4, ...},
               "fwdbwd_ms": {"dense": 5.8, "portable": 7.1, ...}}, ...],
     "work_exponent": 0.6, "validation": {...}}

``fwd_ms`` / ``fwdbwd_ms``: median milliseconds of the forward product and of forward plus both
gradients, per implementation (:data:`IMPLS`); an implementation that failed or was not measured
is absent.  ``dtype`` is the compute precision: ``float32`` (exact), ``tf32``, ``float16``,
``bfloat16`` or ``float64``.  ``work_exponent`` (optional; default
:data:`blocksparse.dispatch.model.WORK_EXPONENT`): how the model carries a row's time to another
problem's work, fitted to the table's own rows by leave-one-out when it is written
(:func:`blocksparse.dispatch.model.fit_work_exponent`).
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

from .problem import PRECISIONS, Problem

__all__ = ["IMPLS", "TABLES_DIR", "Row", "Table", "shipped_table"]

#: Implementations of a block-sparse linear product the model chooses between.
IMPLS = ("kernels", "portable", "dense", "reference")
#: Where the tables shipped with the package live.
TABLES_DIR = Path(__file__).resolve().parent / "tables"
_FORMAT = 1
_SIZE_KEYS = ("tokens", "in_features", "out_features", "block_size")


@dataclass(frozen=True)
class Row:
    """One measured :class:`~.problem.Problem` (planned as training) and the times of each impl."""

    problem: Problem
    fwd_ms: MappingProxyType
    fwdbwd_ms: MappingProxyType
    layout: str = ""

    def times(self, backward):
        return self.fwdbwd_ms if backward else self.fwd_ms

    def __reduce__(self):  # pickle / deepcopy: a mappingproxy is neither
        return _frozen, (Row, self.problem, dict(self.fwd_ms), dict(self.fwdbwd_ms), self.layout)


def _frozen(cls, *fields):
    """``cls(*fields)`` with its dict fields read-only again (the inverse of ``__reduce__``)."""
    return cls(*(MappingProxyType(f) if isinstance(f, dict) else f for f in fields))


def _bad(where, what):
    return ValueError(f"dispatch table {where}: {what}")


def _times(value, where, key):
    if not isinstance(value, dict):
        raise _bad(where, f"{key} must be an object of impl -> milliseconds; got {value!r}")
    for impl, ms in value.items():
        if impl not in IMPLS:
            raise _bad(where, f"{key} names an unknown impl {impl!r}; known: {IMPLS}")
        if isinstance(ms, bool) or not isinstance(ms, numbers.Real) or not ms > 0 or not math.isfinite(ms):
            raise _bad(where, f"{key}[{impl!r}] must be a positive number of milliseconds; got {ms!r}")
    return MappingProxyType({k: float(v) for k, v in value.items()})


def _row(raw, where):
    if not isinstance(raw, dict):
        raise _bad(where, f"a row must be an object; got {type(raw).__name__}")
    missing = [k for k in (*_SIZE_KEYS, "density", "dtype", "fwd_ms", "fwdbwd_ms") if k not in raw]
    if missing:
        raise _bad(where, f"missing {missing}")
    sizes = {}
    for key in _SIZE_KEYS:
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise _bad(where, f"{key} must be an int >= 1; got {value!r}")
        sizes[key] = int(value)
    density = raw["density"]
    if isinstance(density, bool) or not isinstance(density, numbers.Real) or not 0 < density <= 1:
        raise _bad(where, f"density must be in (0, 1]; got {density!r}")
    if raw["dtype"] not in PRECISIONS:
        raise _bad(where, f"dtype must be one of {PRECISIONS}; got {raw['dtype']!r}")
    problem = Problem(**sizes, density=float(density), dtype=raw["dtype"],
                      structured=bool(raw.get("structured", False)))
    return Row(problem, _times(raw["fwd_ms"], where, "fwd_ms"), _times(raw["fwdbwd_ms"], where, "fwdbwd_ms"),
               str(raw.get("layout", "")))


@dataclass(frozen=True)
class Table:
    """A checked timing table: ``rows`` and the file's other fields (``meta``)."""

    framework: str
    device: str
    rows: tuple
    meta: MappingProxyType
    source: str = "<memory>"

    @classmethod
    def from_dict(cls, data, source="<memory>"):
        """Check ``data`` (the JSON object of the module docstring) and build the table."""
        if not isinstance(data, dict):
            raise _bad(source, f"must be a JSON object; got {type(data).__name__}")
        if data.get("format") != _FORMAT:
            raise _bad(source, f"format must be {_FORMAT}; got {data.get('format')!r}")
        for key in ("framework", "device"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise _bad(source, f"{key} must be a non-empty string; got {data.get(key)!r}")
        raw_rows = data.get("rows")
        if not isinstance(raw_rows, list) or not raw_rows:
            raise _bad(source, "rows must be a non-empty list")
        rows = tuple(_row(r, f"{source} row {i}") for i, r in enumerate(raw_rows))
        exponent = data.get("work_exponent")
        if exponent is not None and (isinstance(exponent, bool) or not isinstance(exponent, numbers.Real)
                                     or not 0 < exponent <= 2):
            raise _bad(source, f"work_exponent must be a number in (0, 2]; got {exponent!r}")
        meta = {k: v for k, v in data.items() if k != "rows"}
        return cls(data["framework"], data["device"], rows, MappingProxyType(meta), source)

    def __reduce__(self):
        return _frozen, (Table, self.framework, self.device, self.rows, dict(self.meta), self.source)

    @classmethod
    def load(cls, path):
        path = Path(path)
        with path.open(encoding="utf-8") as f:
            return cls.from_dict(json.load(f), source=path.name)

    @property
    def work_exponent(self):
        """The table's ``work_exponent``, or None (the model's default)."""
        return self.meta.get("work_exponent")

    @property
    def impls(self):
        """Implementations measured in at least one row."""
        return tuple(i for i in IMPLS if any(i in r.fwdbwd_ms or i in r.fwd_ms for r in self.rows))


@lru_cache(maxsize=None)
def shipped_table(framework, device):
    """The table shipped for ``framework`` (``"torch"`` / ``"tensorflow"``) on ``device``
    (``"cpu"`` / ``"cuda"``), or None where none was measured.  Read once per process."""
    path = TABLES_DIR / f"{framework}-{device}.json"
    return Table.load(path) if path.exists() else None
