"""The portable and dense-masked products in PyTorch ops only (any device, any block size).

Both are plain differentiable PyTorch expressions: autograd derives their gradients,
``torch.compile`` traces them, autocast casts their matmuls, and the float32 matmul precision
follows PyTorch's own setting (``torch.backends.cuda.matmul.allow_tf32`` /
``torch.set_float32_matmul_precision``), as ``nn.Linear`` does.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._autograd import functorch_active
from .._backend import autocast_dtype_of


__all__ = ["PortableTables", "dense_matmul", "portable_matmul"]


class PortableTables(nn.Module):
    """The portable path's tables (:class:`blocksparse.ops.matmul.portable.RowTables`) and the block
    coordinates as ``int64`` buffers (not saved in ``state_dict``; they follow the layer's device).
    Buffers, not per-device caches: ``torch.compile`` sees them as inputs of the graph."""

    def __init__(self, tables, coords, device=None):
        super().__init__()
        self.tables = tables
        self.coords = np.asarray(coords)
        self.groups = tuple((g.rows.shape[0], g.m, g.all_rows, g.first) for g in tables.groups)
        for name, a in self._arrays():
            self.register_buffer(name, torch.tensor(np.asarray(a, dtype=np.int64), device=device), persistent=False)

    def _arrays(self):
        """``(buffer name, int64 array)`` of every table."""
        for i, g in enumerate(self.tables.groups):
            yield f"rows{i}", g.rows
            yield f"blocks{i}", g.blocks.ravel()
        yield "bag_index", self.tables.bag_index
        yield "bag_offsets", self.tables.bag_offsets
        yield "table_cols", self.tables.table_cols
        yield "c_idx", self.coords[:, 0]
        yield "k_idx", self.coords[:, 1]
        yield "tile_idx", self.coords[:, 0] * self.tables.KB + self.coords[:, 1]  # block -> its (c, k) tile

    def reset(self):
        """Refill the buffers from the tables (``Module.to_empty()`` leaves them uninitialised)."""
        with torch.no_grad():
            for name, a in self._arrays():
                getattr(self, name).copy_(torch.tensor(np.asarray(a, dtype=np.int64)))

    def _apply(self, fn, recurse=True):
        # every move refills them: to_empty() (a meta-initialised layer's usual next step) gives
        # uninitialised memory that load_state_dict() never fills (they are not in it)
        super()._apply(fn, recurse)
        self.reset()
        return self

    def follow(self, device):
        """Put the buffers on ``device`` where they are elsewhere: a layer built on the meta device
        whose parameters came from ``load_state_dict(..., assign=True)`` keeps meta buffers."""
        if self.bag_index.device != device:
            for name, a in self._arrays():
                self.register_buffer(name, torch.tensor(np.asarray(a, dtype=np.int64), device=device),
                                     persistent=False)

    def extra_repr(self):
        t = self.tables
        return f"blocks={t.blocks}, row_groups={len(t.groups)}, block_size={t.block_size}"


class _SegmentSum(torch.autograd.Function):
    """``embedding_bag(mode="sum")`` of the table's rows into their output blocks, with a backward
    built of differentiable ops (a gather of each row's block), so that gradients of gradients
    exist: ``embedding_bag``'s own backward has none.  ``torch.func`` works through it: the sum is
    linear (its tangent is the sum of the tangent), and a batch of tables is one wider table."""

    @staticmethod
    def forward(table, bag_index, bag_offsets, table_cols):
        return F.embedding_bag(bag_index, table, bag_offsets, mode="sum")

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.blocks = output.shape[0]
        ctx.save_for_backward(inputs[3])
        ctx.save_for_forward(inputs[3])

    @staticmethod
    def backward(ctx, grad):
        (table_cols,) = ctx.saved_tensors
        return grad.index_select(0, table_cols), None, None, None

    @staticmethod
    def vmap(info, in_dims, table, bag_index, bag_offsets, table_cols):
        bag_index, bag_offsets, table_cols = (_one_copy(t, d) for t, d in zip((bag_index, bag_offsets, table_cols),
                                                                               in_dims[1:]))
        if in_dims[0] is None:
            return segment_sum(table, bag_index, bag_offsets, table_cols), None
        t = table.movedim(in_dims[0], 1)  # [rows, B, width]: the batch side by side in each row
        out = segment_sum(t.reshape(t.shape[0], -1), bag_index, bag_offsets, table_cols)
        return out.view(out.shape[0], *t.shape[1:]), 1


def _one_copy(index, dim):
    """One copy of an index table that vmap batched (``torch.func.stack_module_state`` stacks the
    buffers of an ensemble's layers too): they must all be the same, one layout."""
    if dim is None:
        return index
    first = index.select(dim, 0)
    if not torch.equal(index, first.unsqueeze(dim).expand_as(index)):
        raise ValueError("the portable path's index tables differ across the vmap batch: layers of different "
                         "layouts cannot be stacked into one vmap (stack layers of one layout)")
    return first


class _SegmentSumJvp(_SegmentSum):
    """:class:`_SegmentSum` with forward-mode derivatives (eager only: Dynamo refuses a custom
    ``jvp``)."""

    @staticmethod
    def jvp(ctx, table_tangent, *_):
        (table_cols,) = ctx.saved_tensors
        out = table_tangent.new_zeros((ctx.blocks, table_tangent.shape[1]))
        return out.index_add_(0, table_cols, table_tangent)


def segment_sum(table, bag_index, bag_offsets, table_cols):
    """Rows of ``table`` summed into their output blocks (:class:`_SegmentSum`)."""
    fn = _SegmentSum if torch.compiler.is_compiling() else _SegmentSumJvp
    return fn.apply(table, bag_index, bag_offsets, table_cols)


def portable_matmul(x, w, tables, bias=None):
    """``y = x @ W (+ bias)`` for ``x`` ``(N, C)``, packed ``w`` ``(blocks, bs, bs)`` -> ``(N, K)``.

    Feature-major throughout (see :mod:`blocksparse.ops.matmul.portable`): ``x.T`` as
    ``(CB, bs, N)``; per row group one ``bmm`` of the stacked transposed blocks of each row with its
    activations; the ``(bs, N)`` slabs of the products summed per output block by
    ``embedding_bag`` (twice differentiable: :class:`_SegmentSum`).  The result is returned as a
    transposed view of the ``(K, N)`` sum.
    """
    t = tables.tables
    bs, n = t.block_size, x.shape[0]
    if n == 0:  # embedding_bag refuses zero-width rows; the dense product gives the empty result and zero dW
        return dense_matmul(x, w, tables, bias)
    low = _product_dtype(x, w)
    # 16-bit products become float32 slabs: a column's slabs are summed after the products, and
    # 16-bit slabs would round each block's product apart (cancelling blocks lost ~1000x one
    # rounding); products of 16-bit operands are exact in float32, so the sum keeps a matmul's
    # float32 accumulation.  CUDA: bmm with float32 results (tensor cores); elsewhere float32 operands.
    wide = low in (torch.float16, torch.bfloat16)
    with torch.autocast(x.device.type, enabled=False) if wide else contextlib.nullcontext():
        if wide:
            x, w = x.to(low), w.to(low)  # the operands autocast (or the caller) gives the product
            if not x.is_cuda or functorch_active() or torch.compiler.is_compiling():
                x, w = x.float(), w.float()
        # (eager only: traced, or under torch.func, the float32 operands, whose ops every transform knows)
        wide_bmm = wide and x.is_cuda and not functorch_active() and not torch.compiler.is_compiling()
        xt = x.t().reshape(t.CB, bs, n)
        parts = []
        for i, (r, m, all_rows, first) in enumerate(tables.groups):
            wg = w.narrow(0, first, r * m) if first >= 0 else w.index_select(0, getattr(tables, f"blocks{i}"))
            # per row: its m blocks transposed and stacked, [m*bs, bs]
            wg = wg.view(r, m, bs, bs).transpose(2, 3).reshape(r, m * bs, bs)
            xg = xt if all_rows else xt.index_select(0, getattr(tables, f"rows{i}"))
            # [r, m*bs, bs] @ [r, bs, N] -> [r, m*bs, N]: one (bs, N) slab per block
            prod = _WideBmm.apply(wg, xg) if wide_bmm else torch.bmm(wg, xg)
            parts.append(prod.reshape(r * m, bs * n))
        table = parts[0] if len(parts) == 1 else torch.cat(parts)
        yt = segment_sum(table, tables.bag_index, tables.bag_offsets, tables.table_cols)  # [KB, bs*N]
    yt = yt.reshape(t.KB * bs, n)
    if bias is not None:  # to the float32 sums of 16-bit products, before their one rounding (the bias
        yt = yt + bias.to(low).to(yt.dtype)[:, None]  # in the products' dtype, as the kernels take it)
    return yt.t().to(low)  # (a copy only under vmap)


class _WideBmm(torch.autograd.Function):
    """``torch.bmm`` of 16-bit operands with float32 results (tensor cores; CUDA), differentiable
    (twice too): PyTorch's ``bmm(..., out_dtype=)`` has no derivative.  The gradients are 16-bit
    products of the float32 output gradient rounded to the operands' dtype -- exactly, where it is
    a gathered 16-bit gradient, as it is here (the segment sum's backward gathers ``dy``)."""

    @staticmethod
    def forward(a, b):
        return torch.bmm(a, b, out_dtype=torch.float32)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        g = grad.to(a.dtype)
        return torch.bmm(g, b.transpose(1, 2)), torch.bmm(a.transpose(1, 2), g)


def _product_dtype(x, w):
    """The dtype of the products: autocast's where it casts (floating operands below float64), else
    the operands'."""
    cast = autocast_dtype_of(x.device.type)
    return cast if cast is not None and torch.float64 not in (x.dtype, w.dtype) else torch.promote_types(
        x.dtype, w.dtype)


def _densify(w, tables):
    """The dense ``(C, K)`` matrix of the packed blocks ``w`` (zeros elsewhere), differentiable in
    ``w``: the blocks copied into a zero ``(CB * KB, bs, bs)`` grid of tiles, which is then laid out
    as rows and columns.  Built every call (a cache keyed by the weight's version counter would miss
    writes through ``weight.data``)."""
    t = tables.tables
    bs = t.block_size
    tiles = torch.zeros((t.CB * t.KB, bs, bs), dtype=w.dtype, device=w.device)
    if torch.compiler.is_compiling() or not torch._C._functorch.is_functorch_wrapped_tensor(w):
        tiles = tiles.index_copy_(0, tables.tile_idx, w)  # in place: half the memory traffic
    else:  # a torch.func transform (vmap of a stack of weights): out of place
        tiles = tiles.index_copy(0, tables.tile_idx, w)
    return tiles.view(t.CB, t.KB, bs, bs).transpose(1, 2).reshape(t.CB * bs, t.KB * bs)


def dense_matmul(x, w, tables, bias=None):
    """``y = x @ W (+ bias)`` with ``W`` made dense (:func:`_densify`) and one ``F.linear`` (cast as
    ``nn.Linear`` is under autocast).  Every op is a built-in one: the backward runs no Python, and
    the weight's gradient is the dense one's blocks (the copy's backward gathers them)."""
    return F.linear(x, _densify(w, tables).t(), bias)
