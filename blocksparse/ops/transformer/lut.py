"""Attention layouts and the lookup tables of the block-sparse transformer ops (numpy only).

Both frontends (TensorFlow, PyTorch), their reference paths and the Triton kernels read what this
module builds, so the formats below are a contract: change them only together with every consumer.

Terms
-----
Queries (``ctx_q`` positions) and keys (``ctx_k`` positions) are cut into blocks of ``bs``
positions (``bs = block_size``).  The 0/1 attention layout has shape ``(lut_heads, QB, KB)`` with
``QB = ctx_q // bs`` and ``KB = ctx_k // bs``: ``layout[h, q, k] == 1`` where query block ``q`` of
head ``h`` attends to key block ``k``.  ``lut_heads`` is either the number of heads or 1 (one layout
shared by every head; head ``h`` reads the tables of lut head ``h % lut_heads``).  Every lut head
holds the same number of blocks, ``blocks``, so that scores pack into one tensor.

Block order and the score tensor
--------------------------------
The blocks of each head are numbered ``0 .. blocks-1`` in row-major order of ``(q, k)`` (by query
block, then key block).  Scores and probabilities are packed, shape
``(batch, heads, blocks, bs, bs)``: element ``[n, h, b, i, j]`` is query position ``q*bs + i``
against key position ``k*bs + j`` with ``(q, k) = coords[h % lut_heads, b]``.  The blocks of query
row ``q`` are consecutive (``row_offsets``), which the softmax and ``nn`` walk.

Tables (all ``int32``, C-contiguous, read-only)
-----------------------------------------------
``coords``       ``(lut_heads, blocks, 2)``: ``coords[h, b] = (q, k)``.
``row_offsets``  ``(lut_heads, QB + 1)``: blocks of query row ``q`` of head ``h`` are the ids
                 ``row_offsets[h, q] : row_offsets[h, q + 1]`` (CSR; an empty row has none).
``col_offsets``  ``(lut_heads, KB + 1)`` and
``col_blocks``   ``(lut_heads, blocks)``: block ids of key column ``k`` of head ``h`` are
                 ``col_blocks[h, col_offsets[h, k] : col_offsets[h, k + 1]]``, sorted by ``q``
                 (the transposed walk of ``tn``).

In-block masks (:class:`BlockMasks`, from a ``mask_callback``)
--------------------------------------------------------------
``index``  ``(lut_heads, blocks)``: ``-1`` where block ``b`` keeps every element, else the row of
           ``bits`` holding its mask.  Identical masks are stored once.
``bits``   ``(M, bs, W)`` with ``W = ceil(bs / 32)``: bit ``j % 32`` (least significant first) of
           word ``bits[m, i, j // 32]`` is 1 where query row ``i`` keeps key column ``j``.  The words
           are stored as ``int32`` (the two's complement of the ``uint32`` bit pattern).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..._checks import check_int
from ...layout import BLOCK_SIZES, check_block_size, check_zero_one
from ...layouts.attention import attention_blocks

__all__ = ["AttentionLayout", "BlockMasks", "BLOCK_SIZES", "check_attention_layout", "pack_bits", "unpack_bits"]

_WORD = 32


def _readonly(a, dtype=np.int32):
    a = np.ascontiguousarray(a, dtype=dtype)
    a.setflags(write=False)
    return a


def pack_bits(mask):
    """Pack boolean masks ``(..., bs, bs)`` into the ``(..., bs, W)`` int32 words of :class:`BlockMasks`.

    >>> pack_bits(np.tril(np.ones((4, 4), bool))).ravel().tolist()
    [1, 3, 7, 15]
    """
    mask = np.asarray(mask, dtype=bool)
    words = -(-mask.shape[-1] // _WORD)
    pad = np.zeros(mask.shape[:-1] + (words * _WORD - mask.shape[-1],), dtype=bool)
    packed = np.packbits(np.concatenate([mask, pad], axis=-1), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4").view(np.int32)


def unpack_bits(bits, block_size):
    """Inverse of :func:`pack_bits`: ``(..., bs, W)`` int32 words -> ``(..., bs, bs)`` booleans."""
    raw = np.ascontiguousarray(bits, dtype=np.int32).view(np.uint8)
    return np.unpackbits(raw, axis=-1, bitorder="little")[..., :block_size].astype(bool)


def check_attention_layout(layout, heads=None):
    """``(mask, heads)``: the layout as a read-only ``(lut_heads, QB, KB)`` boolean array, checked.

    ``layout`` is 3-D ``(heads, QB, KB)`` (or ``(1, QB, KB)``, shared by ``heads`` heads) or 2-D
    ``(QB, KB)`` with ``heads`` given.  Every lut head must hold the same number of blocks (at
    least one).

    >>> mask, heads = check_attention_layout([[1, 0], [1, 1]], heads=4)
    >>> mask.shape, heads
    ((1, 2, 2), 4)
    """
    arr = attention_blocks(layout, square=False)
    if arr.ndim == 2:
        if heads is None:
            raise ValueError(f"heads must be given with a 2-D layout (one layout shared by every head); "
                             f"got heads=None and layout shape {arr.shape}")
        arr = arr[None]
    heads = check_int(arr.shape[0] if heads is None else heads, "heads")
    if arr.shape[0] not in (1, heads):
        raise ValueError(f"layout has {arr.shape[0]} heads (shape {arr.shape}) but heads={heads}: give one "
                         f"layout per head or a single one shared by all")
    counts = arr.reshape(arr.shape[0], -1).sum(axis=1)
    if (counts != counts[0]).any():
        raise ValueError(f"every head of layout must hold the same number of blocks (scores are packed "
                         f"(batch, heads, blocks, bs, bs)); got {counts.tolist()} blocks per head")
    return _readonly(arr, np.bool_), heads


@dataclass(frozen=True, eq=False)
class BlockMasks:
    """In-block masks of every block, deduplicated; the format is in the module docstring."""

    index: np.ndarray
    bits: np.ndarray
    block_size: int

    @cached_property
    def key(self):
        """Bytes identifying the masks (equal masks, equal keys)."""
        return b"|".join([self.index.tobytes(), str(self.bits.shape).encode(), self.bits.tobytes()])

    def distinct(self):
        """The distinct masks as booleans ``(M + 1, bs, bs)``; the last one keeps everything, so
        ``distinct()[index]`` is every block's mask (``-1`` selects the last)."""
        full = np.ones((1, self.block_size, self.block_size), dtype=bool)
        return np.concatenate([unpack_bits(self.bits, self.block_size), full])

    def per_block(self):
        """Every block's mask, ``(lut_heads, blocks, bs, bs)`` booleans (tests and references)."""
        return self.distinct()[self.index]

    def head_index(self, heads):
        """``index`` of every head, ``(heads * blocks,)`` int64 (shared masks repeated), with ``-1``
        pointing at the last of :meth:`distinct`."""
        index = self.index[np.arange(heads) % self.index.shape[0]].reshape(-1).astype(np.int64)
        return np.where(index < 0, self.bits.shape[0], index)


class AttentionLayout:
    """A validated attention layout with its block order and lookup tables.

    Parameters
    ----------
    layout : array_like, shape (heads, QB, KB) or (QB, KB)
        0/1 block mask; see :func:`check_attention_layout`.
    block_size : int
        Block edge, one of :data:`BLOCK_SIZES`.
    heads : int, optional
        Number of heads; required with a 2-D layout, else the layout's first dimension.

    Examples
    --------
    >>> lay = AttentionLayout([[1, 0], [1, 1]], block_size=16, heads=2)
    >>> lay.blocks, lay.ctx_q, lay.coords[0].tolist()
    (3, 32, [[0, 0], [1, 0], [1, 1]])
    >>> lay.row_offsets.tolist(), lay.col_blocks.tolist()
    ([[0, 1, 3]], [[0, 1, 2]])
    """

    def __init__(self, layout, block_size=64, heads=None):
        self.mask, self.heads = check_attention_layout(layout, heads)
        self.block_size = check_block_size(block_size)
        self.lut_heads, self.QB, self.KB = self.mask.shape
        self.ctx_q, self.ctx_k = self.QB * self.block_size, self.KB * self.block_size
        h, q, k = np.nonzero(self.mask)  # row-major: sorted by (h, q, k)
        self.blocks = int(q.shape[0] // self.lut_heads)
        self.coords = _readonly(np.stack([q, k], axis=1).reshape(self.lut_heads, self.blocks, 2))
        self.row_offsets = _readonly(_csr_offsets(self.mask.sum(axis=2)))
        self.col_offsets = _readonly(_csr_offsets(self.mask.sum(axis=1)))
        # within each head, the ids sorted by (k, q): lexsort's last key is the primary one
        self.col_blocks = _readonly([np.lexsort((c[:, 0], c[:, 1])) for c in self.coords])

    def __repr__(self):
        return (f"AttentionLayout(heads={self.heads}, lut_heads={self.lut_heads}, QB={self.QB}, KB={self.KB}, "
                f"block_size={self.block_size}, blocks={self.blocks}, density={self.density:.3f})")

    @cached_property
    def key(self):
        """Hashable identity: equal layouts (mask, block size, heads) have equal keys."""
        return (self.heads, self.block_size, self.mask.shape, self.mask.tobytes())

    @property
    def density(self):
        """Fraction of the ``QB x KB`` blocks present (per head)."""
        return self.blocks / (self.QB * self.KB)

    @property
    def nn_max(self):
        """Most blocks in one query row (the longest walk of the softmax and ``nn``)."""
        return int(np.diff(self.row_offsets, axis=1).max())

    @property
    def tn_max(self):
        """Most blocks in one key column (the longest walk of ``tn``)."""
        return int(np.diff(self.col_offsets, axis=1).max())

    @cached_property
    def flat_ids(self):
        """``(q_ids, k_ids)``, int64 ``(heads * blocks,)``: ``h * QB + q`` and ``h * KB + k`` of block
        ``b`` of head ``h`` at ``h * blocks + b`` (every head, shared layouts repeated) -- the rows
        of the reference paths' gathers and segment sums over ``(heads, blocks)``."""
        h = np.arange(self.heads)[:, None]
        c = self.coords[np.arange(self.heads) % self.lut_heads].astype(np.int64)
        return tuple(_readonly((h * n + c[:, :, i]).reshape(-1), np.int64) for i, n in ((0, self.QB), (1, self.KB)))

    def block_coord(self, block, head=0):
        """``(q, k)`` of block id ``block`` of ``head``."""
        for value, name, bound in ((block, "block", self.blocks), (head, "head", self.heads)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int; got {type(value).__name__}")
            if not 0 <= value < bound:
                raise ValueError(f"{name} must be in [0, {bound}); got {value}")
        q, k = self.coords[head % self.lut_heads, block]
        return int(q), int(k)

    def block_masks(self, mask_callback):
        """:class:`BlockMasks` from ``mask_callback(blk_shape, head, q, k, block)``.

        The callback is called once per block of each lut head (heads ``0 .. lut_heads-1``; a
        shared layout shares its masks) and returns a ``(bs, bs)`` array of 0/1 or booleans: 1
        where query row ``i`` of the block may attend to key column ``j``.
        """
        if not callable(mask_callback):
            raise TypeError(f"mask_callback must be callable (blk_shape, head, q, k, block) -> (bs, bs) mask; "
                            f"got {type(mask_callback).__name__}")
        bs = self.block_size
        shape = (bs, bs)
        masks = np.empty((self.lut_heads, self.blocks, bs, bs), dtype=bool)
        for h in range(self.lut_heads):
            for b, (q, k) in enumerate(self.coords[h].tolist()):
                masks[h, b] = _check_block_mask(mask_callback(shape, h, q, k, b), shape, h, q, k, b)
        full = masks.all(axis=(2, 3))
        index = np.full((self.lut_heads, self.blocks), -1, dtype=np.int64)
        words = -(-bs // _WORD)
        packed = pack_bits(masks[~full]).reshape(-1, bs * words)
        distinct = np.zeros((0, bs * words), dtype=np.int32)
        if packed.shape[0]:
            distinct, inverse = np.unique(packed, axis=0, return_inverse=True)
            index[~full] = inverse.reshape(-1)
        return BlockMasks(_readonly(index), _readonly(distinct.reshape(-1, bs, words)), bs)


def _csr_offsets(counts):
    """``(heads, n)`` counts -> ``(heads, n + 1)`` running offsets starting at 0."""
    return np.concatenate([np.zeros((counts.shape[0], 1), dtype=np.int64), np.cumsum(counts, axis=1)], axis=1)


def _check_block_mask(value, shape, h, q, k, b):
    where = f"for head {h}, block {b} (q={q}, k={k})"
    try:
        arr = np.asarray(value)
    except Exception as exc:
        raise ValueError(f"mask_callback must return a {shape} array of 0/1; could not convert what it "
                         f"returned {where}: {exc}") from exc
    if arr.shape != shape:  # before the values: a callback returning None is told about the shape
        raise ValueError(f"mask_callback must return an array of shape blk_shape = {shape}; got shape "
                         f"{arr.shape} {where}")
    return check_zero_one(arr, f"the mask mask_callback returned {where}", f"a {shape} array of 0/1")
