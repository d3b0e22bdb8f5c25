"""Edge bias: one learned bias per output channel and *edge pattern* of a padded convolution.

Near the borders some filter taps read padding instead of the image, so those outputs see a
systematically different input.  The edge bias gives every output position that has such taps an
extra bias, shared by all positions whose set of padded taps is the same (the *edge pattern*):

* convolution: output position ``q`` (per axis) has padded tap ``t`` when
  ``q * stride - pad + t * dilate`` lies outside the image; in several dimensions tap
  ``(t0, t1, t2)`` is padded when it is on any axis.
* transposed convolution: output (image) position ``x`` has padded tap ``t`` when the input
  position it would come from, ``(x + pad - t * dilate) / stride``, is a whole number outside the
  input (a tap that lands between strided inputs is a hole, not an edge).  In several dimensions a
  tap is an edge where it is one on any axis, as in the convolution -- also where another axis
  makes it a hole: the original package's rule (its ``bprop_lut`` patterns), which fixes
  ``edge_bias_shape()`` and with it the checkpoints of ported models.

Positions with no padded tap (the interior) get no edge bias.  Patterns are numbered in the order
their first position appears in the output (row-major).  ``edge_bias`` has shape ``(K, E)`` for
``E`` patterns and is applied as ``y[n, k, pos] += edge_bias[k, pattern(pos)]``.  ``VALID``
padding has no edges (``E = 0``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EdgeMap", "edge_map"]


@dataclass(frozen=True)
class EdgeMap:
    """``pattern``: ``(prod(MPQ),)`` int64, the edge pattern of each output position (row-major),
    ``count`` where the position has none; ``count``: ``E``."""

    pattern: np.ndarray
    count: int


def edge_map(geometry):
    """The :class:`EdgeMap` of the op's output (a :class:`~.geometry.Geometry`)."""
    masks = [a.outside_transposed() if geometry.transposed else a.outside() for a in geometry.axes]
    ndim = len(masks)
    padded = np.zeros((1,) * (2 * ndim), dtype=bool)
    for i, mask in enumerate(masks):  # (positions..., taps...): padded on any axis
        shape = [1] * (2 * ndim)
        shape[i], shape[ndim + i] = mask.shape
        padded = padded | mask.reshape(shape)
    positions = int(np.prod([m.shape[0] for m in masks]))
    rows = np.packbits(padded.reshape(positions, -1), axis=1)
    edge = rows.any(axis=1)
    pattern = np.full(positions, -1, dtype=np.int64)
    if edge.any():
        keys = np.ascontiguousarray(rows[edge]).view(np.dtype((np.void, rows.shape[1]))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.empty(first.size, dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(first.size)  # number by first appearance
        pattern[edge] = rank[inverse.ravel()]
    count = int(pattern.max()) + 1
    pattern[pattern < 0] = count
    pattern.setflags(write=False)
    return EdgeMap(pattern, count)
