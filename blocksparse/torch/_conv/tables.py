"""The index arrays of a :class:`~blocksparse.ops.conv.ConvSpec` as int64 tensors, per device.

They are made on the CPU when the op is built (numpy work never runs inside a compiled region) and
copied to a device the first time a call runs there.
"""
from __future__ import annotations

import torch

from .._matmul import plan as _matmul_plan
from . import implicit as _implicit

__all__ = ["Tables"]


class TableSet:
    """The tables of one device, as attributes (a plain class: ``torch.compile`` builds it while it
    traces a call on a device the tables were not copied to yet)."""

    def __init__(self, **tables):
        for name, value in tables.items():
            setattr(self, name, value)


def _tensor(array, dtype="int64"):
    return torch.from_numpy(array.astype(dtype, copy=True))


class Tables:
    """``on(device)``: a namespace of ``dense`` (flat filter -> dense filter positions), ``edges``
    (edge pattern per output position), ``segments`` / ``channel`` (weight normalisation),
    ``fan_in`` (per output channel), and per bucket of the grouped plan ``inputs`` / ``weight``;
    ``order`` (the grouped output shuffle); ``pointwise`` (the matmul weight's flat filter indices,
    when the op has a :class:`~blocksparse.ops.conv.pointwise.PointwisePlan`) and ``matmul_handle``
    (the layout handle of the matmul ops, or None); ``implicit_steps`` / ``implicit_tiles`` /
    ``implicit_weight`` and ``implicit_grad_*`` (the tables of the implicit-GEMM kernel, forward and
    input gradient, when the op has :class:`~blocksparse.ops.conv.implicit.ImplicitPlan` s),
    ``implicit_handle`` (this object's handle for that path's custom ops, or None) and
    ``implicit_runs`` (that path's launches prepared on the device, by call shape) and
    ``implicit_native`` (its native op's records by call shape, False where none).  ``spec``: the op's
    :class:`~blocksparse.ops.conv.ConvSpec`."""

    def __init__(self, spec):
        self.spec = spec
        blocks = spec.blocks
        segments, channel = blocks.norm_segments
        # on the CPU, whatever the default device (these are the host copies every device's come from)
        fan_in = torch.zeros(blocks.K, dtype=torch.int64, device="cpu")
        fan_in.index_add_(0, _tensor(channel), torch.as_tensor(
            [blocks.cs[b].size * blocks.trs for b in range(blocks.blocks) for _ in blocks.ks[b]], device="cpu"))
        plan = spec.grouped
        self._cpu = TableSet(
            dense=_tensor(blocks.dense_index), edges=_tensor(spec.edges.pattern) if spec.edge_bias else None,
            segments=_tensor(segments), channel=_tensor(channel), fan_in=fan_in,
            inputs=[_tensor(b.inputs) for b in plan.buckets],
            weight=[_tensor(b.weight) for b in plan.buckets], order=_tensor(plan.order),
            pointwise=None if spec.pointwise is None else _tensor(spec.pointwise.weight),
            matmul_handle=None if spec.pointwise is None else _matmul_plan.handle(spec.pointwise.layout, self))
        for name, plan in (("implicit", spec.implicit), ("implicit_grad", spec.implicit_grad)):
            if plan is not None:
                setattr(self._cpu, f"{name}_steps", _tensor(plan.steps, "int32"))
                setattr(self._cpu, f"{name}_tiles", _tensor(plan.tiles, "int32"))
                # int32 gathers: the index is most of the bytes a gather of the packed filter moves
                setattr(self._cpu, f"{name}_weight", _tensor(plan.weight, _index_dtype(plan.weight)))
        self._cpu.implicit_runs, self._cpu.implicit_native = {}, {}
        self._devices = {}
        if spec.implicit is not None:  # last: a registered op is complete
            self._cpu.implicit_handle = _implicit.register(self)

    # Copies and unpickled ops rebuild their tables: the handles are this process's, of this object.
    def __getstate__(self):
        return {"spec": self.spec}

    def __setstate__(self, state):
        self.__init__(state["spec"])

    def on(self, device):
        if device.type == "cpu":
            return self._cpu
        tables = self._devices.get(device)
        if tables is None:
            tables = TableSet(**{name: _to(value, device) for name, value in vars(self._cpu).items()})
            tables.implicit_runs = {}  # the implicit path's prepared launches on this device
            tables.implicit_native = {}  # and its native op's records (they hold those launches' tables)
            self._devices[device] = tables
        return tables


def _index_dtype(index):
    """int32 for indices below 2**31 (``index_select`` takes them), else int64."""
    return "int32" if index.size == 0 or int(index.max()) < 2 ** 31 else "int64"


def _to(value, device):
    if isinstance(value, list):
        return [t.to(device) for t in value]
    return value.to(device) if isinstance(value, torch.Tensor) else value
