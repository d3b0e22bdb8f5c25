"""Handles of prepared layouts: what the custom ops take in place of a layout object.

A handle is a digest of the layout's content (63 bits of its SHA-256), not a counter: the same
layout has the same handle in every process.  A graph that holds one -- compiled, exported with
``torch.export``, or replayed from ``torch.compile``'s on-disk cache -- names the same layout
wherever it runs; a process that has not prepared that layout (built the layer or layout object)
gets a ``ValueError`` saying so, never another layout's tables.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading

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


class Registry:
    """Prepared layout states by content handle (``what`` names them in errors)."""

    def __init__(self, what: str, prepared_by: str):
        self._what, self._prepared_by = what, prepared_by
        self._lock = threading.Lock()
        self._entries: dict[int, tuple] = {}

    def handle(self, parts: tuple, make_state) -> int:
        """The handle of the layout whose content is ``parts`` (bytes / reprs); ``make_state()``
        builds its state the first time."""
        h = digest(*parts)
        with self._lock:
            entry = self._entries.get(h)
            if entry is None:
                with real_tensors():
                    self._entries[h] = (parts, make_state())
            elif entry[0] != parts:  # two layouts, one digest: never seen, but never a wrong answer
                raise RuntimeError(f"two different {self._what}s share the content digest {h}")
        return h

    def state(self, handle: int):
        """The state behind ``handle`` (a symbolic int, which torch.compile makes of a handle that
        changed between calls, is specialised here)."""
        handle = int(handle)
        entry = self._entries.get(handle)
        if entry is None:
            raise ValueError(f"unknown {self._what} handle {handle}: this process has prepared no {self._what} "
                             f"with that content (a compiled or exported graph names its layouts by content; "
                             f"build {self._prepared_by} it was made from first)")
        return entry[1]
