"""Host-side state of the custom ops: layout handles, device tables and launch plans.

The custom ops take an integer *layout handle* rather than the layout's tables: ``torch.compile``
then sees only tensors and ints at the op boundary, and the tables are built eagerly, once per
device, inside the op.  Handles intern layouts: equal layouts share one handle and one set of
tables for the life of the process (a layout is a few kilobytes of numpy).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ...layout import Layout
from ...ops.matmul import configs, grouping
from ...ops.matmul.configs import UpdatConfig, XpropConfig

#: SM count assumed off-GPU (Triton's interpreter), small so that tests exercise the splits.
INTERPRETER_SMS = 4


@dataclass(frozen=True)
class Plan:
    """How one product runs: its tile config and how its reduction is split."""

    config: XpropConfig | UpdatConfig
    max_segment: int | None = None   # xprop: table segment length (None: one program per group)
    split: int = 1                   # updat: token slices reduced by atomics


class _LayoutState:
    """A layout with its memoised device tables and plans."""

    def __init__(self, layout):
        self.layout = layout
        self._tables = {}
        self._plans = {}

    def xprop_tables(self, kind, plan, device):
        """(headers, entries) of the fprop/bprop table for ``plan`` on ``device``."""
        key = (kind, plan.max_segment, plan.config.G, str(device))
        if key not in self._tables:
            lut = getattr(self.layout, kind)(plan.max_segment, group=plan.config.G)
            self._tables[key] = (_to(lut.headers, device), _to(lut.entries, device))
        return self._tables[key]

    def updat_table(self, plan, device):
        key = ("updat", plan.config.G, str(device))
        if key not in self._tables:
            self._tables[key] = _to(self.layout.updat_groups(plan.config.G), device)
        return self._tables[key]

    def coords(self, device):
        key = ("coords", str(device))
        if key not in self._tables:
            self._tables[key] = _to(self.layout.coords, device).long()
        return self._tables[key]

    def plan(self, kind, n_tokens, device, dtype, tma):
        """The :class:`Plan` of ``kind`` (fprop / bprop / updat) for ``n_tokens`` of ``dtype`` on
        ``device``; ``tma``: whether the TMA kernels can address the tensors."""
        key = (kind, n_tokens, str(device), dtype, tma)
        if key not in self._plans:
            self._plans[key] = _make_plan(self.layout, kind, n_tokens, device, dtype, tma)
        return self._plans[key]


def _to(array, device):
    return torch.from_numpy(np.array(array, dtype=np.int32)).to(device)


def _make_plan(layout, kind, n, device, dtype, tma):
    bs = layout.block_size
    interpret = device.type != "cuda"
    sms = INTERPRETER_SMS if interpret else torch.cuda.get_device_properties(device).multi_processor_count
    opts = dict(float32=dtype == torch.float32, tma=tma, interpret=interpret)
    if kind == "updat":
        cfg = configs.updat_config(bs, n, **opts)
        return Plan(cfg, split=configs.updat_split(cfg, n, layout.updat_groups(cfg.G).shape[0], sms))
    cfg = configs.xprop_config(bs, n, **opts)
    # structured layouts: one activation tile serves G output blocks (blocksparse.ops.matmul.grouping)
    cfg = grouping.grouped_config(cfg, layout, kind, float32=opts["float32"], interpret=interpret)
    lut = getattr(layout, kind)(None, group=cfg.G)
    slices = bs // (cfg.BN or bs) if cfg.TMA else 1
    programs = math.ceil(max(n, 1) / cfg.BM) * lut.num_segments * slices
    want = cfg.WAVES * sms
    if programs >= want or lut.max_count <= 1:
        return Plan(cfg)
    return Plan(cfg, max_segment=max(1, math.ceil(lut.max_count * programs / want)))


_lock = threading.Lock()
_handles: dict[Layout, int] = {}
_states: list[_LayoutState] = []


def handle(layout: Layout) -> int:
    """The integer handle of ``layout`` (equal layouts share one)."""
    with _lock:
        if layout not in _handles:
            _handles[layout] = len(_states)
            _states.append(_LayoutState(layout))
        return _handles[layout]


def state(layout_handle: int) -> _LayoutState:
    """The layout state behind a handle from :func:`handle`."""
    if not 0 <= layout_handle < len(_states):
        raise ValueError(f"unknown layout handle {layout_handle}; handles come from "
                         "blocksparse.torch._plan.handle()")
    return _states[layout_handle]
