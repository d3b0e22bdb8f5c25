"""What both frontends' ``BlocksparseConv`` / ``BlocksparseDeconv`` share: the validated op
(:class:`ConvSpec`) and the shape helpers of the original API (:class:`ConvShapes`)."""
from __future__ import annotations

import functools

import numpy as np

from ..._checks import check_bool, check_minibatch
from .blocks import ConvBlocks, parse_bck
from .edges import edge_map
from .geometry import make_geometry
from .grouping import grouped_plan, worth_grouping
from .implicit import implicit_plan
from .pointwise import pointwise_plan, worth_matmul

__all__ = ["ConvSpec", "ConvShapes"]


class ConvSpec:
    """A block-sparse (transposed) convolution, validated: channels (``blocks``), ``geometry``,
    ``edges`` (the output's :class:`~.edges.EdgeMap`, built when first used), ``grouped`` (the
    :class:`~.grouping.GroupedPlan`), ``pointwise`` (the :class:`~.pointwise.PointwisePlan` of a
    1x1 block grid, else None), ``implicit`` / ``implicit_grad`` (the :class:`~.implicit.ImplicitPlan`
    of a convolution and of its input gradient, None when transposed), and which of those should
    serve it on a GPU (``prefers_grouped``, ``prefers_matmul``; the implicit path's rule depends on
    the call), computed at construction."""

    def __init__(self, BCK, TRS, DHW, MPQ=None, strides=1, dilates=1, padding="SAME", edge_bias=False,
                 transposed=False):
        check_bool(edge_bias, "edge_bias")
        cs, ks = parse_bck(BCK)
        self.geometry = make_geometry(TRS, DHW, MPQ, strides, dilates, padding, transposed)
        self.blocks = ConvBlocks(cs, ks, self.geometry.trs, bool(transposed))
        self.edge_bias = bool(edge_bias)
        self.transposed = bool(transposed)
        self.grouped = grouped_plan(self.blocks)
        self.prefers_grouped = worth_grouping(self.blocks, self.grouped)
        self.pointwise = pointwise_plan(self.blocks, self.geometry)
        self.prefers_matmul = worth_matmul(self.pointwise, self.blocks.density)
        self.implicit = implicit_plan(self.blocks)
        self.implicit_grad = implicit_plan(self.blocks, gradient=True)

    @functools.cached_property
    def edges(self):
        """The output's :class:`~.edges.EdgeMap` (an entry per output position: built when first
        needed, by layers with an edge bias)."""
        return edge_map(self.geometry)

    @property
    def edge_count(self):
        """Edge patterns the edge bias holds (0 without edge bias)."""
        return self.edges.count if self.edge_bias else 0

    def filter_shape(self, block=None):
        """``f_shape`` (see :class:`ConvShapes`)."""
        blocks = self.blocks
        if block is None:
            if blocks.uniform:
                return [blocks.blocks, *blocks.channel_shape(0), *self.geometry.TRS]
            return [blocks.size]
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
            raise TypeError(f"block must be an int or None; got {block!r}")
        if not 0 <= block < blocks.blocks:
            raise ValueError(f"block must be in [0, {blocks.blocks}); got {block}")
        return [*blocks.channel_shape(int(block)), *self.geometry.TRS]

    def filter_form(self, shape, name="F"):
        """How a filter tensor of ``shape`` (a tuple of ints) holds the blocks: ``"stacked"`` or
        ``"flat"``; raises ``ValueError`` naming the accepted shapes otherwise."""
        shape = tuple(shape)
        if shape == (self.blocks.size,):
            return "flat"
        if self.blocks.uniform and shape == tuple(self.filter_shape()):
            return "stacked"
        accepted = [tuple(self.filter_shape())] if self.blocks.uniform else []
        accepted.append((self.blocks.size,))
        raise ValueError(f"{name} must have shape {' or '.join(map(str, accepted))} (f_shape()), or be a "
                         f"list of the {self.blocks.blocks} blocks' filters of shape f_shape(b); got {shape}")

    @property
    def edge_bias_hint(self):
        """Tail of the message of a wrongly shaped edge bias."""
        if self.edge_bias:
            return " = edge_bias_shape()"
        return " = edge_bias_shape() (built with edge_bias=False: build with edge_bias=True to learn one)"

    def check_block_count(self, count, name="F"):
        """Check the length of a filter given as a list of per-block filters."""
        if count != self.blocks.blocks:
            raise ValueError(f"{name} given as a list must hold one filter per block ({self.blocks.blocks}); "
                             f"got {count}")

    @property
    def flops(self):
        """Multiply-adds times two of one image of the minibatch."""
        outer = int(np.prod(self.geometry.DHW if self.transposed else self.geometry.MPQ))
        return 2 * self.blocks.pairs * self.geometry.trs * outer


class ConvShapes:
    """What both frontends' ``BlocksparseConv`` share: the constructor (it checks the arguments into
    ``self.spec``; ``_transposed`` makes the deconvolution), ``repr``, and the shape helpers and
    attributes of the original API (over ``self.spec``).

    Attributes: ``C`` / ``K`` input / output channels, ``blocks``, ``TRS`` / ``DHW`` / ``MPQ`` filter,
    input and output spatial sizes, ``strides``, ``dilates``, ``padding`` (``(before, after)`` zeros per
    axis; ``after`` is negative where the windows stop short of the image's end), ``density`` (of
    the ``C x K`` channel pairs), ``flops`` (per image).
    """

    spec: ConvSpec
    _transposed = False

    def __init__(self, BCK, TRS, DHW, MPQ=None, strides=(1, 1, 1), dilates=(1, 1, 1), padding="SAME",
                 edge_bias=False):
        self.spec = ConvSpec(BCK, TRS, DHW, MPQ, strides, dilates, padding, edge_bias,
                             transposed=self._transposed)

    def __repr__(self):
        return (f"{type(self).__name__}(C={self.C}, K={self.K}, blocks={self.blocks}, TRS={self.TRS}, "
                f"DHW={self.DHW}, MPQ={self.MPQ}, strides={self.strides}, dilates={self.dilates}, "
                f"padding={self.padding}, edge_bias={self.spec.edge_bias})")

    C = property(lambda self: self.spec.blocks.C)
    K = property(lambda self: self.spec.blocks.K)
    blocks = property(lambda self: self.spec.blocks.blocks)
    TRS = property(lambda self: self.spec.geometry.TRS)
    DHW = property(lambda self: self.spec.geometry.DHW)
    MPQ = property(lambda self: self.spec.geometry.MPQ)
    strides = property(lambda self: self.spec.geometry.strides)
    dilates = property(lambda self: self.spec.geometry.dilates)
    padding = property(lambda self: self.spec.geometry.pads)
    density = property(lambda self: self.spec.blocks.density)
    flops = property(lambda self: self.spec.flops)

    def edge_bias_shape(self):
        """``(K, E)``: one bias per output channel and edge pattern; ``E = 0`` without edge bias
        (``edge_bias=False``) or without padding."""
        return (self.K, self.spec.edge_count)

    def f_shape(self, block=None):
        """Shape of the filter: all blocks (``block=None``) or block ``block``'s.

        All blocks: ``[blocks, Kb, Cb] + TRS`` (convolution) / ``[blocks, Cb, Kb] + TRS``
        (transposed) when they share one shape, else ``[size]``, every block's filter flattened in
        block order.  One block: ``[Kb, Cb] + TRS`` / ``[Cb, Kb] + TRS``.
        """
        return self.spec.filter_shape(block)

    def i_shape(self, N):
        """``[N, C] + DHW``: the input activations for minibatch ``N`` (an int >= 0, ``None`` or an
        integer scalar tensor)."""
        return [check_minibatch(N), self.C, *self.DHW]

    def o_shape(self, N):
        """``[N, K] + MPQ``: the output activations for minibatch ``N`` (as :meth:`i_shape`)."""
        return [check_minibatch(N), self.K, *self.MPQ]
