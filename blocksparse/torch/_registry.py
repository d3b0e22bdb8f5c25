"""Handles of prepared layouts: what the custom ops take in place of a layout object.

A handle is a digest of the layout's content (63 bits of its SHA-256), not a counter: the same
layout has the same handle in every process.  A graph that holds one -- compiled, exported with
``torch.export``, or replayed from ``torch.compile``'s on-disk cache -- names the same layout
wherever it runs; a process that has not prepared that layout (built the layer or layout object)
gets a ``ValueError`` saying so, never another layout's tables.

A state lives while an object that asked for its handle does (the layer, ``BlocksparseMatMul``,
``AttentionLayout``, ...), while an autograd record of a call holds it (:meth:`Registry.keep`), and
among the last :data:`GRACE` released: each asker is an owner, and a state whose owners are all
collected is released, so that a program building fresh layouts as it trains does not grow.
Releases are queued by the owners' finalizers (which may run inside a garbage collection, in any
thread) and applied at the next :meth:`Registry.handle`.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import threading
import weakref

try:  # a state built while a FakeTensorMode is on (torch.export, tracing) holds real tensors all the same
    from torch._subclasses.fake_tensor import unset_fake_temporarily as _real_tensors
except ImportError:  # pragma: no cover
    _real_tensors = contextlib.nullcontext

__all__ = ["Registry", "digest", "real_tensors"]

#: A context in which tensors are real whatever fake-tensor mode is on: states outlive the trace.
real_tensors = _real_tensors


def digest(*parts) -> int:
    """A non-negative 63-bit digest of ``parts`` (bytes as they are, anything else by its ``repr``)."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else repr(part).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return int.from_bytes(h.digest()[:8], "little") >> 1


#: Released states kept anyway (the most recent), for graphs that still name them: a compiled
#: backward, a call on a temporary object's layout, raw layouts past their cache.
GRACE = 64


class _Entry:
    __slots__ = ("parts", "state", "owners", "__weakref__")

    def __init__(self, parts, state):
        self.parts, self.state, self.owners = parts, state, 0


class Registry:
    """Prepared layout states by content handle (``what`` names them in errors), each kept while
    one of its owners lives."""

    def __init__(self, what: str, prepared_by: str):
        self._what, self._prepared_by = what, prepared_by
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}  # owned
        self._grace: collections.OrderedDict[int, _Entry] = collections.OrderedDict()  # released, recent
        self._held = weakref.WeakValueDictionary()  # released, still held (autograd records)
        self._released = collections.deque()  # handles whose owner was collected (append is atomic)

    def __len__(self):
        return len(self._entries)

    def handle(self, parts: tuple, make_state, owner) -> int:
        """The handle of the layout whose content is ``parts`` (bytes / reprs); ``make_state()``
        builds its state the first time; the state lives at least as long as ``owner``."""
        h = digest(*parts)
        with self._lock:
            entry = self._entries.get(h)
            if entry is None:
                entry = self._grace.pop(h, None) or self._held.get(h)
                if entry is None:
                    with real_tensors():
                        entry = _Entry(parts, make_state())
                self._entries[h] = entry
            elif entry.parts != parts:  # two layouts, one digest: never seen, but never a wrong answer
                raise RuntimeError(f"two different {self._what}s share the content digest {h}")
            entry.owners += 1
            self._drop_released()
        weakref.finalize(owner, self._released.append, h)
        return h

    def _drop_released(self):
        while self._released:
            h = self._released.popleft()
            entry = self._entries.get(h)
            if entry is not None:
                entry.owners -= 1
                if entry.owners <= 0:
                    del self._entries[h]
                    self._held[h] = self._grace[h] = entry
                    if len(self._grace) > GRACE:
                        self._grace.popitem(last=False)

    def _entry(self, handle):
        return self._entries.get(handle) or self._grace.get(handle) or self._held.get(handle)

    def keep(self, handle):
        """An object that keeps ``handle``'s state findable while it is held (autograd records hold it
        from the forward to the backward)."""
        return self._entry(int(handle))

    def state(self, handle: int):
        """The state behind ``handle`` (a symbolic int, which torch.compile makes of a handle that
        changed between calls, is specialised here)."""
        handle = int(handle)
        entry = self._entry(handle)
        if entry is None:
            raise ValueError(f"unknown {self._what} handle {handle}: this process has prepared no {self._what} "
                             f"with that content, or no longer holds one (a compiled or exported graph names its "
                             f"layouts by content; build {self._prepared_by} it was made from first, and keep it)")
        return entry.state
