"""The layout core: a validated block layout and the lookup tables every kernel reads.

Numpy only -- no framework is imported here.  Both frontends (TensorFlow, PyTorch), the
reference paths and every GPU kernel consume what this module builds, so the formats below
are a contract: change them only together with every consumer.

Terms
-----
A block-sparse weight ``W`` of shape ``(C, K)`` is cut into square blocks of ``bs x bs``
(``bs = block_size``).  The 0/1 ``layout`` of shape ``(CB, KB) = (C // bs, K // bs)`` marks the
blocks that exist.  Nonzero blocks are numbered ``0 .. blocks-1``; block ``b`` sits at layout
coordinate ``(c, k) = coords[b]`` and covers ``W[c*bs:(c+1)*bs, k*bs:(k+1)*bs]``.  Weights are
stored packed, shape ``(blocks, bs, bs)``: ``w[b]`` is that sub-matrix, rows indexed by ``C``.

Block order
-----------
``z_order=False`` (default): row-major, sorted by ``(c, k)``.
``z_order=True``: Morton (z-) order of ``(c, k)``: bit ``i`` of ``c`` goes to bit ``2i``, bit ``i``
of ``k`` to bit ``2i+1`` of the key -- the order of the original package's ``z_order=True``.

The three products of ``y = x @ W`` and their tables
---------------------------------------------------
* fprop  ``y[:, k] = sum_c x[:, c] @ w[b(c, k)]``  -- one *output column* ``k`` per table row.
* bprop  ``dx[:, c] = sum_k dy[:, k] @ w[b(c, k)].T`` -- one *input row* ``c`` per table row.
* updat  ``dw[b] = x[:, c].T @ dy[:, k]``          -- one table row per block.

fprop and bprop tables (:class:`XpropLut`), all ``int32``, C-contiguous.  ``group`` (``G``, default 1)
lets one kernel program own ``G`` adjacent outputs, so that an input tile it loads serves up to ``G``
blocks (small blocks need this reuse to be fast); output *group* ``g`` holds outputs ``g*G .. g*G+G-1``
(those below ``num_out``).  ``num_groups = ceil(num_out / G)``.

``headers``  shape ``(S, 4)``, one row per *segment*::

    headers[s] = (group, start, count, part)

  ``group`` output group index (``k // G`` for fprop, ``c // G`` for bprop);
  ``start`` first row of ``entries`` belonging to this segment;
  ``count`` number of entries in it (``0`` only for an empty group, see below);
  ``part``  index of this segment within its group, ``0 .. parts(group)-1``.

  Rows are sorted by ``(group, part)``.  Every group owns at least one row: a group with no
  nonzero block (empty layout columns for fprop, empty rows for bprop) owns exactly one row
  with ``count == 0`` -- a kernel must still write zeros there.  A group whose entry list is
  longer than ``max_segment`` is split into ``ceil(n / max_segment)`` segments of near-equal
  length, so that several programs share its reduction; their partial sums must be added.

``entries``  shape ``(E, 1 + G)``, one row per (group, input block) pair with any block::

    entries[e] = (inp, block_0, ..., block_{G-1})

  ``inp``      the block index along the reduced axis (``c`` for fprop, ``k`` for bprop);
  ``block_j``  the id of the weight block joining ``inp`` to output ``group*G + j``, or ``-1``
               where there is none (a kernel multiplies by zero there).

  With ``G == 1`` every ``block_0`` is valid and ``E == blocks``.  The entries of one group are
  contiguous and sorted by ``inp``; segments of one group are consecutive slices of that run.

``offsets``  shape ``(num_groups + 1,)``: the headers of group ``g`` are rows
  ``offsets[g] : offsets[g + 1]`` (CSR over ``headers``).

updat tables.  ``Layout.updat``: shape ``(blocks, 2)``, ``updat[b] = (c, k)`` (identical to
``coords``).  ``Layout.updat_groups(G)``: the blocks of each layout row ``c`` in order of ``k``,
cut into runs of at most ``G`` -- one kernel program per run, sharing the input tile of ``c``::

    updat_groups(G)[r] = (c, k_0, ..., k_{G-1}, block_0, ..., block_{G-1})      shape (R, 1 + 2G)

  with ``k_j = block_j = -1`` padding a short run.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ._checks import check_bool, check_int

__all__ = ["BLOCK_SIZES", "Layout", "XpropLut", "check_block_size", "check_layout", "morton_key"]

#: Block sizes every frontend accepts (square blocks).
BLOCK_SIZES = (8, 16, 32, 64, 128)


def check_block_size(block_size, name="block_size", *, any_size=False):
    """Return ``block_size`` as an ``int`` after checking it is one of :data:`BLOCK_SIZES`
    (with ``any_size``: any int >= 1, for the portable path).

    >>> check_block_size(32), check_block_size(48, any_size=True)
    (32, 48)
    """
    allowed = "an int >= 1" if any_size else f"an int, one of {BLOCK_SIZES}"
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}; got {block_size!r} "
                        f"of type {type(block_size).__name__}")
    if any_size and block_size < 1:
        raise ValueError(f"{name} must be {allowed}; got {int(block_size)}")
    if not any_size and int(block_size) not in BLOCK_SIZES:
        raise ValueError(f"{name} must be one of {BLOCK_SIZES}; got {int(block_size)}")
    return int(block_size)


def check_zero_one(value, name, what):
    """Return ``value`` as a boolean array after checking it holds booleans or 0/1 numbers.

    The one check of every 0/1 mask the layouts take (matmul and attention layouts, element
    masks); ``what`` completes "``name`` must be ..." when ``value`` is no array at all.

    >>> check_zero_one([1.0, 0.0], "mask", "a 0/1 array").tolist()
    [True, False]
    """
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged nested lists and the like
        raise ValueError(f"{name} must be {what}; could not convert it: {exc}") from exc
    if arr.dtype == np.bool_:
        return arr
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must hold 0/1 numbers or booleans; got dtype {arr.dtype}")
    bad = ~np.isin(arr, (0, 1))
    if bad.any():
        values = np.unique(arr[bad])[:5].tolist()
        raise ValueError(f"{name} must hold only 0 and 1; got {int(bad.sum())} other value(s), e.g. {values}")
    return arr != 0


def check_layout(layout, name="layout"):
    """Return ``layout`` as a read-only 2-D boolean array after checking it.

    Accepts any 2-D array-like of ``0``/``1`` (ints or floats) or booleans with at least one
    nonzero entry.

    >>> check_layout([[1, 0], [0, 1]]).tolist()
    [[True, False], [False, True]]
    """
    arr = check_zero_one(layout, name, "a 2-D array of 0/1 values")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of 0/1 values; got {arr.ndim} dimension(s) "
                         f"with shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must have at least one row and one column; got shape {arr.shape}")
    if not arr.any():
        raise ValueError(f"{name} must have at least one nonzero block; got all zeros "
                         f"with shape {arr.shape}")
    out = np.array(arr, dtype=np.bool_, copy=True)
    out.setflags(write=False)
    return out


def morton_key(c, k):
    """Morton (z-order) key interleaving the bits of ``c`` (even bits) and ``k`` (odd bits).

    >>> morton_key(np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])).tolist()
    [0, 1, 2, 3]
    """
    c, k = np.asarray(c), np.asarray(k)
    for name, v in (("c", c), ("k", k)):
        if v.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers; got dtype {v.dtype}")
        if v.size and (v.min() < 0 or v.max() >= 2**32):
            raise ValueError(f"{name} must hold integers in [0, 2**32); got values in [{v.min()}, {v.max()}]")
    c, k = c.astype(np.uint64), k.astype(np.uint64)
    key = np.zeros(np.broadcast(c, k).shape, dtype=np.uint64)
    for bit in range(32):
        one = np.uint64(1 << bit)
        key |= ((c & one) << np.uint64(bit)) | ((k & one) << np.uint64(bit + 1))
    return key


@dataclass(frozen=True)
class XpropLut:
    """Lookup table of the fprop or bprop product; the format is in the module docstring."""

    headers: np.ndarray
    entries: np.ndarray
    offsets: np.ndarray
    max_segment: int | None
    group: int = 1

    @property
    def num_segments(self):
        return int(self.headers.shape[0])

    @property
    def num_groups(self):
        return int(self.offsets.shape[0] - 1)

    @property
    def max_count(self):
        """Longest segment (entries), the trip count bound of a kernel's inner loop."""
        return int(self.headers[:, 2].max())

    @property
    def parts(self):
        """Number of segments of each output group, shape ``(num_groups,)``."""
        return np.diff(self.offsets)

    @property
    def uniform_count(self):
        """The entries of every segment where each output block (``group`` 1) is one segment, all hold
        equally many (at least one) and segment ``s`` starts at entry ``s * count`` (regular layouts:
        butterfly, banded, block-diagonal), else None."""
        count = int(self.headers[0, 2])
        starts = np.arange(self.num_segments) * count
        regular = (self.group == 1 and self.num_segments == self.num_groups and count > 0
                   and (self.headers[:, 2] == count).all() and (self.headers[:, 1] == starts).all())
        return count if regular else None


def _readonly(a):
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.setflags(write=False)
    return a


def _build_xprop(out_idx, inp_idx, num_out, max_segment, group):
    """Group blocks by output group (sorted by ``inp_idx``), split long groups into segments."""
    num_groups = -(-num_out // group)
    grp, lane = out_idx // group, out_idx % group
    # one entry per distinct (group, inp) pair, sorted by (group, inp)
    pair = grp.astype(np.int64) * (int(inp_idx.max(initial=0)) + 1) + inp_idx
    uniq, row = np.unique(pair, return_inverse=True)
    entries = np.full((uniq.shape[0], 1 + group), -1, dtype=np.int64)
    entries[row, 0] = inp_idx
    entries[row, 1 + lane] = np.arange(out_idx.shape[0])
    entry_grp = np.zeros(uniq.shape[0], dtype=np.int64)
    entry_grp[row] = grp
    counts = np.bincount(entry_grp, minlength=num_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    headers = []
    for g in range(num_groups):
        n, start = int(counts[g]), int(starts[g])
        parts = 1 if (max_segment is None or n <= max_segment) else -(-n // max_segment)
        # near-equal split: the first (n % parts) segments get one entry more
        sizes = [n // parts + (1 if p < n % parts else 0) for p in range(parts)]
        for part, size in enumerate(sizes):
            headers.append((g, start, size, part))
            start += size
    headers = np.array(headers, dtype=np.int32).reshape(-1, 4)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(headers[:, 0], minlength=num_groups))])
    return headers, entries, offsets


class Layout:
    """A validated block layout with its block order and lookup tables.

    Parameters
    ----------
    layout : array_like, shape (CB, KB)
        0/1 (or boolean) block mask: ``layout[c, k] == 1`` where block ``(c, k)`` of the weight
        exists.  At least one block must be set.
    block_size : int
        Block edge, one of :data:`BLOCK_SIZES`.
    z_order : bool
        Number the blocks in Morton order instead of row-major order.
    any_block_size : bool
        Accept any block edge >= 1 (e.g. 48 or 256): layouts that only the portable and dense
        paths, or the kernels after :func:`blocksparse.ops.matmul.refine.refine`, can run.

    Examples
    --------
    >>> lay = Layout([[1, 0], [1, 1]], block_size=8)
    >>> lay.blocks, lay.C, lay.K, lay.block_coord(2)
    (3, 16, 16, (1, 1))
    >>> lay.fprop().headers.tolist()   # (out, start, count, part) per output column
    [[0, 0, 2, 0], [1, 2, 1, 0]]
    """

    def __init__(self, layout, block_size=32, *, z_order=False, any_block_size=False):
        self.mask = check_layout(layout)
        self.block_size = check_block_size(block_size, any_size=any_block_size)
        self.z_order = check_bool(z_order, "z_order")
        self.CB, self.KB = self.mask.shape
        self.C, self.K = self.CB * self.block_size, self.KB * self.block_size
        c, k = np.nonzero(self.mask)  # row-major
        if self.z_order:
            order = np.argsort(morton_key(c, k), kind="stable")
            c, k = c[order], k[order]
        self.coords = _readonly(np.stack([c, k], axis=1))
        self.blocks = int(self.coords.shape[0])
        self._tables = {}

    #: Numbered by :meth:`numbered` (else: row-major or Morton order, from the mask).
    custom_order = False
    #: Blocks stored ``packing x packing`` as one block (see :meth:`numbered`); 1: each stored alone.
    packing = 1

    @classmethod
    def numbered(cls, layout, block_size, coords, *, any_block_size=False, packing=1):
        """A layout whose block ``b`` is ``coords[b]``: the mask's blocks, each once, in any order
        (e.g. a refined layout numbered block by block of the coarse one).

        ``packing`` ``p``: the packed weight stores every run of ``p**2`` consecutive blocks as one
        block of ``p * block_size`` -- block ``g * p**2 + i * p + j`` is part ``(i, j)`` of stored
        block ``g`` (a refined layout's weight kept in the coarse layout's storage:
        :func:`blocksparse.ops.matmul.refine.refine`); :attr:`w_shape` is the stored shape."""
        lay = cls(layout, block_size, any_block_size=any_block_size)
        coords = np.asarray(coords, dtype=lay.coords.dtype)
        ordered = coords[np.lexsort((coords[:, 1], coords[:, 0]))] if coords.ndim == 2 else coords
        if coords.shape != lay.coords.shape or not np.array_equal(ordered, lay.coords):
            raise ValueError(f"coords must list the layout's {lay.blocks} blocks (c, k) once each; got "
                             f"shape {coords.shape}")
        p = packing
        if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 1 or lay.blocks % (p * p):
            raise ValueError(f"packing must be a positive int whose square divides the {lay.blocks} blocks; "
                             f"got {p!r}")
        lay.coords, lay.custom_order, lay.packing = _readonly(coords), True, int(p)
        return lay

    def __repr__(self):
        return (f"Layout(CB={self.CB}, KB={self.KB}, block_size={self.block_size}, "
                f"blocks={self.blocks}, density={self.density:.3f}, z_order={self.z_order})")

    def __eq__(self, other):
        return (isinstance(other, Layout) and self.block_size == other.block_size
                and self.z_order == other.z_order and self.packing == other.packing
                and np.array_equal(self.mask, other.mask)
                and (not (self.custom_order or other.custom_order)
                     or np.array_equal(self.coords, other.coords)))

    def __hash__(self):
        return hash((self.block_size, self.z_order, self.mask.shape, self.mask.tobytes()))

    def __array__(self, dtype=None, copy=None):
        """The block mask for numpy (``np.asarray(layout)``), as the original's ``bsmm.layout`` array was."""
        return np.array(self.mask, dtype=dtype, copy=True)

    @property
    def shape(self):
        """``(CB, KB)``: the block mask's shape."""
        return self.mask.shape

    @property
    def density(self):
        """Fraction of blocks present."""
        return self.blocks / (self.CB * self.KB)

    @property
    def w_shape(self):
        """Shape of the packed weight: ``(blocks, block_size, block_size)`` (with :attr:`packing`
        ``p > 1``: ``(blocks / p**2, p * block_size, p * block_size)``)."""
        p = self.packing
        return (self.blocks // (p * p), p * self.block_size, p * self.block_size)

    def block_coord(self, block):
        """Layout coordinate ``(c, k)`` of block id ``block``."""
        if isinstance(block, bool) or not isinstance(block, numbers.Integral):
            raise TypeError(f"block must be an int; got {type(block).__name__}")
        if not 0 <= block < self.blocks:
            raise ValueError(f"block must be in [0, {self.blocks}); got {block}")
        c, k = self.coords[block]
        return int(c), int(k)

    @cached_property
    def block_ids(self):
        """Dense ``(CB, KB)`` int32 map from coordinate to block id, ``-1`` where no block."""
        ids = np.full((self.CB, self.KB), -1, dtype=np.int32)
        ids[self.coords[:, 0], self.coords[:, 1]] = np.arange(self.blocks, dtype=np.int32)
        ids.setflags(write=False)
        return ids

    @property
    def updat(self):
        """updat table: ``(blocks, 2)`` int32, row ``b`` = ``(c, k)`` of block ``b``."""
        return self.coords

    def fprop(self, max_segment=None, group=1):
        """fprop table (outputs are layout columns ``k``); see the module docstring."""
        return self._lut("fprop", max_segment, group)

    def bprop(self, max_segment=None, group=1):
        """bprop table (outputs are layout rows ``c``); see the module docstring."""
        return self._lut("bprop", max_segment, group)

    def _lut(self, kind, max_segment, group):
        max_segment = check_int(max_segment, "max_segment", allow_none=True)
        group = check_int(group, "group", 1, 2**31 - 1)
        key = (kind, max_segment, group)
        if key not in self._tables:
            c, k = self.coords[:, 0], self.coords[:, 1]
            out, inp, num_out = (k, c, self.KB) if kind == "fprop" else (c, k, self.CB)
            headers, entries, offsets = _build_xprop(out, inp, num_out, max_segment, group)
            self._tables[key] = XpropLut(_readonly(headers), _readonly(entries),
                                         _readonly(offsets), max_segment, group)
        return self._tables[key]

    def updat_groups(self, group):
        """Runs of at most ``group`` blocks sharing a layout row; see the module docstring."""
        group = check_int(group, "group", 1, 2**31 - 1)
        key = ("updat", group)
        if key not in self._tables:
            order = np.lexsort((self.coords[:, 1], self.coords[:, 0]))  # by (c, k)
            rows = []
            for c in np.unique(self.coords[:, 0]):
                run = order[self.coords[order, 0] == c]
                for i in range(0, len(run), group):
                    blk = run[i:i + group]
                    pad = [-1] * (group - len(blk))
                    rows.append([c, *self.coords[blk, 1], *pad, *blk, *pad])
            self._tables[key] = _readonly(np.array(rows, dtype=np.int64).reshape(-1, 1 + 2 * group))
        return self._tables[key]

    def dense(self, w):
        """Scatter packed blocks ``w`` (a :attr:`w_shape` array) into the dense ``(C, K)`` matrix.

        A numpy helper for tests, initialisers and debugging; kernels never densify.
        """
        w = np.asarray(w)
        if w.shape != self.w_shape:
            raise ValueError(f"w must have shape {self.w_shape}; got {w.shape}")
        bs, p = self.block_size, self.packing
        if p > 1:  # the stored blocks' parts, in block order
            w = w.reshape(-1, p, bs, p, bs).transpose(0, 1, 3, 2, 4).reshape(self.blocks, bs, bs)
        out = np.zeros((self.CB, bs, self.KB, bs), dtype=w.dtype)
        out[self.coords[:, 0], :, self.coords[:, 1], :] = w
        return out.reshape(self.C, self.K)

    def pack(self, dense):
        """Gather the blocks of a dense ``(C, K)`` matrix into packed (:attr:`w_shape`) form."""
        dense = np.asarray(dense)
        if dense.shape != (self.C, self.K):
            raise ValueError(f"dense must have shape {(self.C, self.K)}; got {dense.shape}")
        bs, p = self.block_size, self.packing
        tiles = dense.reshape(self.CB, bs, self.KB, bs)
        w = tiles[self.coords[:, 0], :, self.coords[:, 1], :]
        if p > 1:  # parts (i, j) of each stored block side by side
            w = w.reshape(-1, p, p, bs, bs).transpose(0, 1, 3, 2, 4).reshape(self.w_shape)
        return np.ascontiguousarray(w)
