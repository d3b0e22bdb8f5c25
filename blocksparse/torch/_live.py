"""State of live frontend objects, kept where compiled code reads it as constants.

``torch.compile`` treats an integer reached from a compiled function's arguments (``op.spec.C``,
``self.layout.heads``) as a candidate for dynamic shapes: when the same code is compiled again for
another object -- a second op, layout or layer -- dynamo makes such integers symbolic ("automatic
dynamic"), and shapes built from them may then fail to compile.  Integers reached from a module
global are specialised (guarded by value).  So a frontend keeps what its traced code reads (spec,
layout, tables, kernel handles) in :data:`LIVE` under a string key of its own and reads it back as
``LIVE[key][name]`` (:func:`field`); an entry goes when its object is collected.
"""
from __future__ import annotations

import itertools
import weakref

__all__ = ["LIVE", "field", "register"]

#: key -> {name: value} of every live object that registered.
LIVE = {}
_keys = itertools.count()


def register(owner, prefix):
    """A new key of ``owner`` in :data:`LIVE` (an empty entry, removed when ``owner`` is collected)."""
    key = f"{prefix}-{next(_keys)}"
    LIVE[key] = {}
    weakref.finalize(owner, LIVE.pop, key, None)
    return key


def _entry(obj):
    key = obj.__dict__.get("_live_key")
    if key is None:  # the first field set (in the constructor, or by __setstate__ on a copy)
        key = obj.__dict__["_live_key"] = register(obj, type(obj).__name__)
    return LIVE[key]


def field(name, doc=None):
    """A property whose value lives in :data:`LIVE` under the object's key."""
    def get(self):
        return LIVE[self._live_key][name]

    def set_(self, value):
        _entry(self)[name] = value

    return property(get, set_, doc=doc)


class LiveState:
    """Mixin of objects with :func:`field` properties, listed in ``_live_fields``: copies and
    unpickled objects register keys of their own (``_live_rebuild`` redoes what derives from them)."""

    _live_fields: tuple = ()

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if k != "_live_key"}
        state.update({name: getattr(self, name) for name in self._live_fields})
        return state

    def __setstate__(self, state):
        for name, value in state.items():
            if name in self._live_fields:
                setattr(self, name, value)
            else:
                self.__dict__[name] = value
        self._live_rebuild()

    def _live_rebuild(self):
        """Recompute state derived from the fields (per-process handles, tables)."""
