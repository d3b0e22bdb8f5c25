"""Attention layouts: 0/1 block masks ``(heads, q_blocks, k_blocks)`` (numpy only).

Every builder returns an ``int32`` array of 0/1 values: ``layout[h, i, j] == 1`` lets the queries of
block ``i`` (rows ``i*bs .. i*bs+bs-1``) attend to the keys of block ``j`` in head ``h``.  With
``heads=None`` the layout is 2-D ``(q_blocks, k_blocks)`` and is shared by every head; with
``heads=H`` it is 3-D, one slice per head (identical slices, except where a builder draws per head:
:func:`bigbird`'s random blocks, :func:`fixed` with ``vary_heads``).  Sizes are in blocks; the
attention op's ``block_size`` turns them into tokens.

``causal=True`` keeps only blocks on or below the diagonal (``j <= i``).  Masking *inside* the
diagonal blocks (query ``t`` sees keys ``<= t``) is the attention op's ``causal`` flag, not the
layout's.

========================  ===================================================================
builder                   keeps block ``(i, j)`` when
========================  ===================================================================
:func:`causal`            ``j <= i``
:func:`fixed`             ``i // stride == j // stride`` (local window) or
                          ``j % stride >= stride - n_global`` (summary columns); ``j <= i``
                          if ``causal``
:func:`sliding_window`    ``|i - j| <= window`` (``0 <= i - j <= window`` if ``causal``)
:func:`bigbird`           ``|i - j| <= window``, or ``i < n_global`` or ``j < n_global``, or ``j`` among
                          the ``n_random`` blocks drawn for row ``i``; ``j <= i`` if ``causal``
:func:`from_mask`         any element of the block is kept in a dense ``(S, S)`` mask
========================  ===================================================================
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_bool, check_int
from ..layout import check_block_size, check_zero_one

__all__ = ["BlockMasks", "bigbird", "causal", "check_attention_layout", "fixed", "from_mask", "sliding_window"]


# --------------------------------------------------------------------------- validation
def _heads(heads):
    return None if heads is None else check_int(heads, "heads")


def attention_blocks(layout, name="layout", *, square=True):
    """The block mask of an attention layout as booleans, 2-D ``(QB, KB)`` or 3-D
    ``(heads, QB, KB)`` as given, after checking it: 0/1 values or booleans, no empty axis, at
    least one block kept, and ``QB == KB`` where ``square``.

    The one layout check of both attention families: :func:`check_attention_layout` (the fused
    attention) and ``blocksparse.ops.transformer.lut`` (the transformer, whose queries and keys may
    differ in length).

    >>> attention_blocks([[1, 0, 1]], square=False).shape
    (1, 3)
    """
    two, three = (("(NB, NB)", "(heads, NB, NB)") if square else
                  ("(q_blocks, k_blocks)", "(heads, q_blocks, k_blocks)"))
    arr = check_zero_one(layout, name, f"a {two} or {three} array of 0/1 values")
    if arr.ndim not in (2, 3):
        raise ValueError(f"{name} must have shape {two} or {three}; got {arr.ndim} dimension(s) "
                         f"with shape {arr.shape}")
    if 0 in arr.shape:
        raise ValueError(f"{name} must have at least one head, query block and key block; got shape {arr.shape}")
    if square and arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"{name} must be square in its last two axes {two}; got shape {arr.shape}")
    if not arr.any():
        raise ValueError(f"{name} must have at least one nonzero block; got all zeros with shape {arr.shape}")
    return arr


def check_attention_layout(layout, name="layout"):
    """Return an attention layout as a read-only boolean ``(heads, NB, NB)`` array after checking it.

    Accepts a 2-D ``(NB, NB)`` layout (returned as one head) or a 3-D ``(heads, NB, NB)`` one, of
    booleans or 0/1 numbers, keeping at least one block.

    >>> check_attention_layout([[1, 0], [1, 1]]).shape
    (1, 2, 2)
    """
    arr = attention_blocks(layout, name)
    out = np.array(arr if arr.ndim == 3 else arr[None], dtype=bool)
    out.setflags(write=False)
    return out


def _per_head(layout2d, heads):
    """The 2-D layout as int32, or repeated over ``heads``."""
    out = np.asarray(layout2d, dtype=np.int32)
    return out if heads is None else np.repeat(out[None], heads, axis=0)


def _grid(n):
    i = np.arange(n)
    return i[:, None], i[None, :]


# --------------------------------------------------------------------------- builders
def causal(n_blocks, heads=None):
    """Lower-triangular layout: query block ``i`` attends to key blocks ``0 .. i``.

    Parameters
    ----------
    n_blocks : int
        Blocks along the sequence (``S // block_size``).
    heads : int, optional
        Number of heads; ``None`` returns one 2-D layout shared by all heads.

    Returns
    -------
    ndarray of int32, shape (n_blocks, n_blocks) or (heads, n_blocks, n_blocks)

    Examples
    --------
    >>> causal(3).tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    n = check_int(n_blocks, "n_blocks", 1)
    i, j = _grid(n)
    return _per_head(j <= i, _heads(heads))


def fixed(n_blocks, stride, n_global=1, *, causal=True, vary_heads=False, heads=None):
    """The Sparse Transformer's "fixed" pattern (Child et al., 2019, section 4.2), in blocks.

    The sequence is cut into windows of ``stride`` blocks.  Query block ``i`` attends to

    * every block of its own window: ``j // stride == i // stride`` (the paper's ``A(1)``), and
    * the last ``n_global`` blocks of every window, the "summary" columns:
      ``j % stride >= stride - n_global`` (``A(2)`` with ``l = stride``, ``c = n_global``);

    with ``causal=True`` (the paper's unidirectional form, the default) only blocks ``j <= i``.
    ``vary_heads=True`` gives head ``h`` its own summary columns, as the paper suggests: the
    ``n_global`` blocks ending ``(h % (stride // n_global)) * n_global`` blocks before the end of
    each window (head 0 keeps the last ones).

    Parameters
    ----------
    n_blocks : int
        Blocks along the sequence.
    stride : int
        Window length in blocks (the paper's ``l`` divided by the block size), ``1 .. n_blocks``.
    n_global : int
        Summary blocks per window (``c``), ``1 .. stride``.
    causal : bool
        Keep only blocks on or below the diagonal.
    vary_heads : bool
        Different summary columns per head (needs ``heads``).
    heads : int, optional
        Number of heads; ``None`` returns one 2-D layout.

    Returns
    -------
    ndarray of int32, shape (n_blocks, n_blocks) or (heads, n_blocks, n_blocks)

    Examples
    --------
    >>> fixed(4, 2).tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]]
    """
    n = check_int(n_blocks, "n_blocks", 1)
    stride = check_int(stride, "stride", 1, n)
    n_global = check_int(n_global, "n_global", 1, stride)
    heads = _heads(heads)
    causal, vary_heads = check_bool(causal, "causal"), check_bool(vary_heads, "vary_heads")
    if vary_heads and heads is None:
        raise ValueError("vary_heads=True needs heads (the number of heads); got heads=None")
    i, j = _grid(n)
    local = (i // stride) == (j // stride)
    keep_order = (j <= i) if causal else np.ones((n, n), dtype=bool)
    if not vary_heads:
        summary = (j % stride) >= stride - n_global
        return _per_head((local | summary) & keep_order, heads)
    patterns = stride // n_global
    out = np.empty((heads, n, n), dtype=np.int32)
    for h in range(heads):
        end = stride - (h % patterns) * n_global
        summary = ((j % stride) >= end - n_global) & ((j % stride) < end)
        out[h] = (local | summary) & keep_order
    return out


def sliding_window(n_blocks, window, causal=False, heads=None):
    """Banded layout: query block ``i`` attends to key blocks ``i - window .. i + window``.

    Parameters
    ----------
    n_blocks : int
        Blocks along the sequence.
    window : int
        Blocks on each side of the diagonal (``0``: the diagonal only).
    causal : bool
        Only the blocks before the diagonal: ``i - window .. i``.
    heads : int, optional
        Number of heads; ``None`` returns one 2-D layout.

    Returns
    -------
    ndarray of int32, shape (n_blocks, n_blocks) or (heads, n_blocks, n_blocks)

    Examples
    --------
    >>> sliding_window(4, 1).tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    n = check_int(n_blocks, "n_blocks", 1)
    window = check_int(window, "window", 0)
    i, j = _grid(n)
    band = np.abs(i - j) <= window
    return _per_head(band & (j <= i) if check_bool(causal, "causal") else band, _heads(heads))


def bigbird(n_blocks, window, n_global, n_random, seed, causal=False, heads=None):
    """BigBird (Zaheer et al., 2020): window + global + random blocks, in blocks.

    Query block ``i`` attends to

    * the window ``|i - j| <= window``;
    * the global blocks: the first ``n_global`` blocks are full rows (they attend to everything)
      and full columns (everything attends to them);
    * ``n_random`` random blocks per row, drawn without replacement among the blocks the row does
      not hold yet (fewer where fewer remain).  Each head draws its own (with ``heads``).

    ``causal=True`` keeps only blocks ``j <= i``, and the random blocks are drawn among those.
    The draws come from ``numpy.random.default_rng(seed)``: the same arguments give the same layout.

    Parameters
    ----------
    n_blocks : int
        Blocks along the sequence.
    window : int
        Blocks on each side of the diagonal.
    n_global : int
        Leading global blocks, ``0 .. n_blocks``.
    n_random : int
        Random blocks per row.
    seed : int
        Seed of the random blocks.
    causal : bool
        Keep only blocks on or below the diagonal.
    heads : int, optional
        Number of heads (each its own random blocks); ``None`` returns one 2-D layout.

    Returns
    -------
    ndarray of int32, shape (n_blocks, n_blocks) or (heads, n_blocks, n_blocks)

    Examples
    --------
    >>> lay = bigbird(8, window=1, n_global=1, n_random=2, seed=0)
    >>> lay.shape, bool((lay.sum(1)[1:] >= 5).all())
    ((8, 8), True)
    """
    n = check_int(n_blocks, "n_blocks", 1)
    window = check_int(window, "window", 0)
    n_global = check_int(n_global, "n_global", 0, n)
    n_random = check_int(n_random, "n_random", 0)
    seed = check_int(seed, "seed", 0)
    heads = _heads(heads)
    causal = check_bool(causal, "causal")
    i, j = _grid(n)
    base = (np.abs(i - j) <= window) | (i < n_global) | (j < n_global)
    allowed = (j <= i) if causal else np.ones((n, n), dtype=bool)
    base &= allowed
    rng = np.random.default_rng(seed)
    out = np.empty((heads or 1, n, n), dtype=np.int32)
    for h in range(heads or 1):
        lay = base.copy()
        if n_random:
            # a random key per candidate, the n_random smallest win: a draw without replacement
            # of every row at once
            keys = np.where(allowed & ~base, rng.random((n, n)), np.inf)
            pick = np.argsort(keys, axis=1, kind="stable")[:, :n_random]
            lay[np.arange(n)[:, None], pick] |= np.isfinite(np.take_along_axis(keys, pick, axis=1))
        out[h] = lay
    return out[0] if heads is None else out


# --------------------------------------------------------------------------- dense masks
@dataclass(frozen=True)
class BlockMasks:
    """Element masks of the blocks a dense mask keeps only in part (from :func:`from_mask`).

    Attributes
    ----------
    block_size : int
        Side of a block.
    index : ndarray of int32, the layout's shape
        ``index[..., i, j] = p >= 0``: block ``(i, j)`` is kept in part and ``masks[p]`` says which
        of its elements; ``-1``: the block is kept whole, or not at all (see the layout).
    masks : ndarray of bool, shape (P, block_size, block_size)
        ``masks[p][r, c]``: query ``r`` of the block may attend to key ``c`` of the block.

    Pass it as ``block_masks=`` to :class:`blocksparse.torch.AttentionLayout` (or
    :func:`blocksparse.torch.attention`) to mask exactly what the dense mask masks.
    """

    block_size: int
    index: np.ndarray
    masks: np.ndarray

    def __post_init__(self):
        index = np.array(self.index, dtype=np.int32, copy=True)
        masks = np.array(self.masks, dtype=bool, copy=True)
        if masks.ndim != 3 or masks.shape[1:] != (self.block_size, self.block_size):
            raise ValueError(f"masks must have shape (P, {self.block_size}, {self.block_size}); "
                             f"got {masks.shape}")
        if index.ndim not in (2, 3):
            raise ValueError(f"index must be 2-D or 3-D like the layout; got shape {index.shape}")
        if index.size and (index.min() < -1 or index.max() >= masks.shape[0]):
            raise ValueError(f"index must hold -1 or a row of masks (0 .. {masks.shape[0] - 1}); "
                             f"got values {int(index.min())} .. {int(index.max())}")
        for arr in (index, masks):
            arr.setflags(write=False)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "masks", masks)

    def dense(self, layout):
        """The element mask ``(..., QB*bs, KB*bs)`` these block masks and ``layout`` describe."""
        layout = np.asarray(layout) != 0
        if layout.shape != self.index.shape:
            raise ValueError(f"layout must have the index's shape {self.index.shape}; got {layout.shape}")
        bs = self.block_size
        full = np.ones((1, bs, bs), dtype=bool)
        table = np.concatenate([self.masks, full]) if self.masks.size else full
        blocks = table[np.where(self.index >= 0, self.index, table.shape[0] - 1)] & layout[..., None, None]
        lead = layout.shape[:-2]
        qb, kb = layout.shape[-2:]
        return np.swapaxes(blocks, -3, -2).reshape(*lead, qb * bs, kb * bs)


def from_mask(mask, block_size, *, return_block_masks=False):
    """Reduce a dense boolean attention mask to a block layout.

    A block is kept where any of its elements is kept.  Blocks kept only in part can be masked
    exactly by also passing their element masks (``return_block_masks=True``) to the attention op.

    Parameters
    ----------
    mask : array_like of bool or 0/1, shape (S_q, S_k) or (heads, S_q, S_k)
        ``mask[..., t, u]``: query ``t`` may attend to key ``u``.
    block_size : int
        Block side; ``S_q`` and ``S_k`` must be multiples of it.
    return_block_masks : bool
        Also return the element masks of the partly kept blocks.

    Returns
    -------
    layout : ndarray of int32, shape (S_q // bs, S_k // bs) or (heads, S_q // bs, S_k // bs)
    block_masks : BlockMasks
        Only with ``return_block_masks=True``.

    Examples
    --------
    >>> m = np.tril(np.ones((16, 16), dtype=bool))            # causal, two blocks of 8
    >>> lay, bm = from_mask(m, 8, return_block_masks=True)
    >>> lay.tolist(), bm.index.tolist(), bm.masks.shape
    ([[1, 0], [1, 1]], [[0, -1], [-1, 1]], (2, 8, 8))
    """
    bs = check_block_size(block_size)
    arr = check_zero_one(mask, "mask", "a 2-D or 3-D array of booleans")
    return_block_masks = check_bool(return_block_masks, "return_block_masks")
    if arr.ndim not in (2, 3):
        raise ValueError(f"mask must have shape (S_q, S_k) or (heads, S_q, S_k); got shape {arr.shape}")
    sq, sk = arr.shape[-2:]
    if sq == 0 or sk == 0 or sq % bs or sk % bs:
        raise ValueError(f"mask's last two sizes must be positive multiples of block_size={bs}; "
                         f"got shape {arr.shape}")
    lead = arr.shape[:-2]
    blocks = np.swapaxes(arr.reshape(*lead, sq // bs, bs, sk // bs, bs), -3, -2)  # (..., QB, KB, bs, bs)
    kept = blocks.any(axis=(-2, -1))
    layout = kept.astype(np.int32)
    if not return_block_masks:
        return layout
    partial = kept & ~blocks.all(axis=(-2, -1))
    index = np.full(kept.shape, -1, dtype=np.int32)
    index[partial] = np.arange(int(partial.sum()), dtype=np.int32)
    return layout, BlockMasks(bs, index, blocks[partial])
