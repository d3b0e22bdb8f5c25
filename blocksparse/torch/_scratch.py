"""Zeroed scratch of the split reductions finished inside the kernels (``blocksparse.ops.matmul.ticket``).

One float32 workspace and one int32 array of ticket counters per device and stream, grown on
demand: every launch that uses them leaves them zero again, so no call fills them.  Work on one
stream runs in order, so calls on it can share them; another stream gets its own pair.  The
workspace is as large as the largest split output seen (a product splits only where it has too few
output tiles to fill the GPU, so a few MB to a few tens of MB).  A buffer
outgrown is kept, never freed: a CUDA graph captured with it may replay it later (and a capture
that grows one must not hand the old memory to the next allocation of the same capture).
"""
from __future__ import annotations

import threading

import torch

__all__ = ["scratch"]

_lock = threading.Lock()
_buffers: dict = {}  # (device, stream) -> (workspace, counters)
_outgrown: list = []  # kept alive for the graphs that may hold them


def _stream_key(device):
    if device.type != "cuda":
        return (device.type, -1, 0)
    from ._launch import _stream

    index = torch.cuda.current_device() if device.index is None else device.index
    return ("cuda", index, _stream(index))


def scratch(device, ws_elements, counter_elements):
    """``(workspace, counters)``: zeroed float32 and int32 tensors of at least these sizes for the
    current stream of ``device``."""
    device = torch.device(device)
    key = _stream_key(device)
    with _lock:
        ws, counters = _buffers.get(key, (None, None))
        if ws is None or ws.numel() < ws_elements:
            _outgrown.extend([ws] if ws is not None else [])
            ws = torch.zeros(max(ws_elements, 1 << 16), dtype=torch.float32, device=device)
        if counters is None or counters.numel() < counter_elements:
            _outgrown.extend([counters] if counters is not None else [])
            counters = torch.zeros(max(counter_elements, 1 << 12), dtype=torch.int32, device=device)
        _buffers[key] = ws, counters
    return ws, counters
