"""Public PyTorch API of the fused block-sparse attention: :func:`attention`, :class:`AttentionLayout`."""
from __future__ import annotations

import hashlib
import numbers
import sys
import threading
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

from .. import _env
from .._checks import check_bool
from ..layouts.attention import BlockMasks, check_attention_layout
from ..ops.attention.configs import HEAD_DIMS, KERNEL_BLOCK_SIZES
from ._attention import ops as _ops
from ._attention import state as _state
from ._checks import autocast, plain_ops_needed

__all__ = ["AttentionLayout", "attention"]

#: Input dtypes; float16 / bfloat16 run on the kernels, float32 / float64 on the reference path.
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class AttentionLayout:
    """A block layout prepared once for :func:`attention`: checked, and its lookup tables built on
    first use and kept (per ``causal`` flag and device) for every later call.

    Parameters
    ----------
    layout : array_like or torch.Tensor, shape (NB, NB) or (heads, NB, NB)
        0/1 (or boolean) block mask: ``layout[h, i, j] == 1`` lets query block ``i`` attend to key
        block ``j`` in head ``h``; 2-D: shared by every head.  See :mod:`blocksparse.layouts.attention`.
    block_size : int
        Tokens per block: 16, 32, 64 or 128.  Sequences have ``NB * block_size`` tokens.
    block_masks : blocksparse.layouts.attention.BlockMasks, optional
        Element masks of blocks kept in part (from ``from_mask(..., return_block_masks=True)``).

    Attributes
    ----------
    layout : ndarray of bool, shape (heads, NB, NB), read-only
    block_size, heads, blocks (``NB``), seq_len (``NB * block_size``), density (kept fraction)
    block_masks : BlockMasks or None

    Equal layouts (same blocks, block size and element masks) compare and hash equal and share
    their tables.

    Examples
    --------
    >>> from blocksparse.layouts import attention as layouts
    >>> lay = AttentionLayout(layouts.sliding_window(8, 1), block_size=16)
    >>> lay.heads, lay.blocks, lay.seq_len
    (1, 8, 128)
    """

    def __init__(self, layout, block_size, *, block_masks=None):
        self.block_size = _check_block_size(block_size)
        self.layout = _check_layout(layout)
        self.block_masks = block_masks
        index = masks = None
        if block_masks is not None:
            index, masks = _check_block_masks(block_masks, self.layout, self.block_size)
        digest = hashlib.sha256(repr((self.layout.shape, self.block_size)).encode())
        for arr in (self.layout, index, masks):
            if arr is not None:
                digest.update(np.ascontiguousarray(arr).tobytes())
        self._key = digest.hexdigest()
        self._dense = _dense_kind(self.layout) if index is None else None
        self._handle = _state.handle(self._key, lambda: _state.LayoutState(self.layout, self.block_size,
                                                                             index, masks), self)

    heads = property(lambda self: self.layout.shape[0])
    blocks = property(lambda self: self.layout.shape[1])
    seq_len = property(lambda self: self.layout.shape[1] * self.block_size)
    density = property(lambda self: float(self.layout.mean()))

    # An unpickled copy (torch.save, multiprocessing) prepares itself again in its process.
    def __getstate__(self):
        return {"layout": self.layout, "block_size": self.block_size, "block_masks": self.block_masks}

    def __setstate__(self, state):
        self.__init__(state["layout"], state["block_size"], block_masks=state["block_masks"])

    def __eq__(self, other):
        return isinstance(other, AttentionLayout) and other._key == self._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        masks = "" if self.block_masks is None else ", block_masks=..."
        return (f"AttentionLayout(heads={self.heads}, blocks={self.blocks}, block_size={self.block_size}, "
                f"density={self.density:.3f}{masks})")


def attention(q, k, v, layout, *, block_size=None, causal=False, scale=None, seqlens=None, block_masks=None):
    """Block-sparse scaled dot-product attention, fused (FlashAttention-style) on the GPU.

    ``o = softmax(scale * q @ k^T + M) @ v`` where ``M`` is 0 where the layout (and ``causal``,
    ``seqlens``, ``block_masks``) lets a query attend to a key and ``-inf`` elsewhere.  Only the
    kept blocks are computed.  A query row that attends to nothing gives zeros (never NaN), in
    the output and in every gradient.

    Parameters
    ----------
    q : torch.Tensor, shape (B, HQ, S, D)
        Queries.  float16 / bfloat16 run on the Triton kernels (CUDA); float32 / float64, CPU
        tensors and ``BLOCKSPARSE_BACKEND=reference`` take the reference path (PyTorch ops, dense
        ``S x S`` scores: moderate ``S`` only).  ``D`` is 16, 32, 64 or 128.
    k, v : torch.Tensor, shape (B, HK, S, D)
        Keys and values, the dtype and device of ``q``.  ``HQ % HK == 0``: query head ``h`` uses
        key/value head ``h // (HQ // HK)`` (grouped-query attention).
    layout : AttentionLayout, or array_like / torch.Tensor of shape (NB, NB) or (HQ, NB, NB)
        The block layout, ``NB = S // block_size``.  Prepare it once with :class:`AttentionLayout`:
        a raw array is hashed on every call to find its cached tables (a CUDA tensor is first
        copied to the host, which synchronises).
    block_size : int, optional
        Tokens per block (16, 32, 64, 128); default ``S // NB``.  Must match an ``AttentionLayout``'s.
    causal : bool
        Also mask inside the blocks: query ``t`` attends to keys ``<= t``.  Blocks above the
        diagonal are dropped from the layout.
    scale : float, optional
        Score scale; default ``D ** -0.5``.
    seqlens : torch.Tensor of int (or a list / numpy array of ints), shape (B,), optional
        Valid length of each batch element (clamped to ``0 .. S``): keys at or past it are masked
        and query rows at or past it give zeros.  Padded batches keep the ``(B, H, S, D)`` shape, so
        no repacking is needed and the kernels stay one launch per pass.
    block_masks : blocksparse.layouts.attention.BlockMasks, optional
        Element masks of the blocks kept in part (with a raw ``layout`` only; an
        ``AttentionLayout`` carries its own).

    A layout that drops no block -- every block kept, or with ``causal`` every block on and below the
    diagonal -- is dense attention: on CUDA (16-bit, one key/value head per query head, no
    ``seqlens``) such calls run ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused
    flash kernels, cuDNN's on Hopper), which computes dense attention faster than the block-sparse
    kernels do; ``BLOCKSPARSE_ATTENTION_SDPA=off`` keeps them on the kernels.

    Returns
    -------
    torch.Tensor, shape (B, HQ, S, D), the dtype of ``q``
        Differentiable in ``q``, ``k`` and ``v``; traceable by ``torch.compile(fullgraph=True)``.
        Under ``torch.autocast`` the inputs are cast to the autocast dtype first.

    Examples
    --------
    >>> from blocksparse.layouts import attention as layouts
    >>> lay = AttentionLayout(layouts.causal(4), block_size=16)
    >>> q, k, v = (torch.randn(2, 4, 64, 32) for _ in range(3))
    >>> attention(q, k, v, lay, causal=True).shape
    torch.Size([2, 4, 64, 32])
    """
    q, k, v = _check_qkv(q, k, v)
    B, HQ, S, D = q.shape
    check_bool(causal, "causal")
    # an AttentionLayout is read as it is (dynamo traces its attributes); a raw array's preparation
    # is a constant to dynamo, which cannot trace its checks and hashing
    prepare = _prepared_fields if isinstance(layout, AttentionLayout) else _prepared
    if block_size is None and prepare is _prepared:
        block_size = _inferred_block_size(layout, S)
    elif torch.compiler.is_compiling() and isinstance(block_size, int) and not isinstance(block_size, bool):
        # an argument torch.compile may have made symbolic: compared into a constant
        block_size = next((b for b in KERNEL_BLOCK_SIZES if block_size == b), block_size)
    # the length serves only to infer a block size (not a constant under dynamic shapes)
    handle, heads, blocks, bs, dense = prepare(layout, block_size, block_masks, S if block_size is None else None)
    if heads != 1 and heads != HQ:  # (not `in (1, HQ)`: Dynamo answers that False for a symbolic HQ)
        raise ValueError(f"layout must have 1 or {HQ} (the query heads) heads; got {heads}")
    if blocks * bs != S:
        raise ValueError(f"layout must cover the sequence: blocks * block_size = {blocks} * "
                         f"{bs} = {blocks * bs}, but q has S = {S}")
    scale = _check_scale(scale, D)
    seqlens = _check_seqlens(seqlens, B, q.device, S)
    if plain_ops_needed(q, k, v):
        return _ops.plain_forward(q, k, v, seqlens, handle, bool(causal), scale)[0]
    traced_raw = prepare is _prepared and torch.compiler.is_compiling()
    if _dense_serves(dense, causal, q, k, seqlens, traced_raw):  # nothing to skip: the dense kernel is faster
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale)
    # compiled with a raw array: the handle traced is that of the array first seen, so the ops also
    # get the array's contents as the call passes them (dynamo guards its shape, not its values)
    layout_now = torch.as_tensor(layout) if traced_raw else None
    return _ops.attention(q, k, v, seqlens, handle, bool(causal), scale, layout_now)


def _inferred_block_size(layout, S):
    """The kernels' block size ``S // NB`` of a raw layout, or None (:func:`_prepare` then explains);
    a ValueError where ``S // NB`` is a size the kernels do not take.
    Found by comparison: under ``torch.compile`` with dynamic shapes ``S`` is symbolic, and each
    comparison specialises it, where the block size must be a constant."""
    try:
        shape = np.shape(layout) if not isinstance(layout, torch.Tensor) else tuple(layout.shape)
    except ValueError:  # ragged: _prepare's check says so
        return None
    if len(shape) not in (2, 3) or not shape[-1]:
        return None
    for bs in KERNEL_BLOCK_SIZES:
        if S == bs * shape[-1]:
            return bs
    if S % shape[-1]:
        return None
    raise ValueError(f"layout must cover the sequence in blocks of {', '.join(map(str, KERNEL_BLOCK_SIZES))}: "
                     f"its {shape[-1]} blocks a side do not divide S = {S} into one of them (give block_size, "
                     f"or a layout of S / block_size blocks a side)")


# --------------------------------------------------------------------------- argument checks
def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, S, D); got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be one of {[str(d) for d in DTYPES]}; got {t.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    q, k, v = autocast(q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    B, HQ, S, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, S, D):
        raise ValueError(f"k must have shape ({B}, HK, {S}, {D}) to match q {tuple(q.shape)}; "
                         f"got {tuple(k.shape)}")
    if D not in HEAD_DIMS:
        raise ValueError(f"q's head dim (last size) must be one of {HEAD_DIMS}; got {D}")
    HK = k.shape[1]
    if HK == 0 or HQ % HK:
        raise ValueError(f"q's heads must be a multiple of k's (grouped-query attention); got HQ = {HQ}, "
                         f"HK = {HK}")
    return q, k, v


def _check_block_size(block_size):
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise TypeError(f"block_size must be an int, one of {KERNEL_BLOCK_SIZES}; got {block_size!r}")
    if int(block_size) not in KERNEL_BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {KERNEL_BLOCK_SIZES}; got {block_size}")
    return int(block_size)


def _check_layout(layout):
    if isinstance(layout, torch.Tensor):
        layout = layout.detach().cpu().numpy()
    return check_attention_layout(layout)


def _check_block_masks(block_masks, layout, block_size):
    """(index (HL, NB, NB), masks (P, bs, bs) uint8) of ``block_masks`` after checking them."""
    if not isinstance(block_masks, BlockMasks):
        raise TypeError(f"block_masks must be a blocksparse.layouts.attention.BlockMasks; "
                        f"got {type(block_masks).__name__}")
    if block_masks.block_size != block_size:
        raise ValueError(f"block_masks must have the layout's block_size {block_size}; "
                         f"got {block_masks.block_size}")
    index = block_masks.index
    if index.shape != layout.shape and index.shape != layout.shape[1:]:
        raise ValueError(f"block_masks.index must have the layout's shape {layout.shape} (or its last two "
                         f"sizes, shared by the heads); got {block_masks.index.shape}")
    shared = index.ndim == 2 and layout.shape[0] > 1
    index = np.array(np.broadcast_to(index, layout.shape))
    if shared:  # one (S, S) mask's blocks for every head: a head whose layout drops a block skips it
        index[~layout] = -1
    elif ((index >= 0) & ~layout).any():
        raise ValueError("block_masks.index must be -1 wherever the layout drops a block")
    return index, block_masks.masks.astype(np.uint8)


def _dense_kind(layout):
    """``"full"`` where ``layout`` keeps every block, ``"causal"`` where it keeps every block on and below
    the diagonal (in every head), else None: the layouts dense attention computes as well."""
    if layout.all():
        return "full"
    upper = ~np.tril(np.ones(layout.shape[1:], dtype=bool))
    return "causal" if (layout | upper).all() else None


def _dense_serves(dense, causal, q, k, seqlens, traced_raw):
    """Whether PyTorch's ``scaled_dot_product_attention`` computes this call: a layout that drops no
    block (``dense``: :func:`_dense_kind`; ``"causal"`` with ``causal`` only), where the kernels would
    run (CUDA, 16-bit), without ragged lengths or grouped heads, and not a raw layout traced by
    ``torch.compile`` (whose contents may change between calls).  ``BLOCKSPARSE_ATTENTION_SDPA=off``:
    never."""
    if dense is None or (dense == "causal" and not causal) or seqlens is not None or traced_raw:
        return False
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or q.shape[1] != k.shape[1]:
        return False
    return _env.attention_sdpa() and _env.backend() != "reference"


def _check_scale(scale, head_dim):
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a finite real number or None; got {scale!r}")
    if isinstance(scale, np.generic):  # a numpy float32 would compare in float32 (max: overflow warnings)
        scale = scale.item()
    if not -sys.float_info.max <= scale <= sys.float_info.max:  # finite (comparisons: torch.compile traces them)
        raise ValueError(f"scale must be a finite real number or None; got {scale!r}")
    return float(scale)


def _check_seqlens(seqlens, batch, device, length):
    if seqlens is None:
        return None
    if isinstance(seqlens, (list, tuple, np.ndarray)):  # plain lengths: a tensor on q's device
        seqlens = torch.as_tensor(seqlens, device=device)
        seqlens = seqlens if seqlens.numel() else seqlens.long()
    if not isinstance(seqlens, torch.Tensor):
        raise TypeError(f"seqlens must be a torch.Tensor, a list or a numpy array of ints, or None; "
                        f"got {type(seqlens).__name__}")
    if seqlens.dtype not in _SEQLEN_DTYPES:
        raise TypeError(f"seqlens must hold integers; got {seqlens.dtype}")
    if tuple(seqlens.shape) != (batch,):
        raise ValueError(f"seqlens must have shape ({batch},) (one length per batch element); "
                         f"got {tuple(seqlens.shape)}")
    if seqlens.device != device:
        raise ValueError(f"seqlens must be on q's device {device}; got {seqlens.device}")
    # clamped to 0 .. S before the cast: lengths of 2**31 and more must not wrap around (unsigned
    # 64-bit ones past int64 through float64, exact up to 2**53, far past any sequence)
    wide = seqlens.double() if seqlens.dtype in _WIDE_UNSIGNED else seqlens.long()
    return wide.clamp(0, length).to(torch.int32).contiguous()


#: Integer dtypes of ``seqlens`` (the unsigned ones torch has beyond uint8 where it has them).
_WIDE_UNSIGNED = tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))
_SEQLEN_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8) + _WIDE_UNSIGNED


# --------------------------------------------------------------------------- raw layouts
_CACHE_SIZE = 32
_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()


def _prepared_fields(layout, block_size, block_masks, seq_len):
    """``(handle, heads, blocks, block_size, dense)`` of ``layout`` prepared (:func:`_prepare`): plain ints,
    and the layout's :func:`_dense_kind`."""
    prepared = _prepare(layout, block_size, block_masks, seq_len)
    return prepared._handle, prepared.heads, prepared.blocks, prepared.block_size, prepared._dense


#: Raw layouts prepared while torch.compile traced a call: their handles are constants of compiled
#: graphs, which outlive the cache above, so these are kept (one per trace, not per call).
_traced: dict = {}


@torch.compiler.assume_constant_result
def _prepared(layout, block_size, block_masks, seq_len):
    """:func:`_prepared_fields` as a constant to ``torch.compile`` (for raw arrays)."""
    if torch.compiler.is_compiling():  # (true here only while Dynamo traces)
        prepared = _prepare(layout, block_size, block_masks, seq_len)
        _traced.setdefault(prepared._handle, prepared)
    return _prepared_fields(layout, block_size, block_masks, seq_len)


def _current_handle(handle, layout_now):
    """The handle of raw layout ``layout_now`` (a compiled call's) where its contents differ from
    those of ``handle`` (prepared when the call was traced), else ``handle``."""
    st = _state.state(handle)
    now = _check_layout(layout_now)
    if np.array_equal(now, st.layout):
        return handle
    if st.mask_index is not None:
        raise ValueError("layout must be the array torch.compile traced this call with when it has block_masks "
                         "(the masks belong to that layout); pass an AttentionLayout instead")
    return _prepare(now, st.block_size, None, None)._handle


def _prepare(layout, block_size, block_masks, seq_len):
    """An :class:`AttentionLayout` for ``layout`` (the last ones prepared are kept)."""
    if block_size is not None:
        block_size = _check_block_size(block_size)
    if isinstance(layout, AttentionLayout):
        if block_size is not None and block_size != layout.block_size:
            raise ValueError(f"block_size must be None or the AttentionLayout's {layout.block_size}; "
                             f"got {block_size}")
        if block_masks is not None:
            raise ValueError("block_masks must be None with an AttentionLayout (it carries its own)")
        return layout
    arr = _check_layout(layout)
    if block_size is None:
        nb = arr.shape[1]
        if seq_len % nb:
            raise ValueError(f"layout must have S // block_size blocks per axis; got {nb} blocks for "
                             f"S = {seq_len}")
        block_size = seq_len // nb
    key = (arr.shape, block_size, hashlib.sha256(arr.tobytes()).hexdigest(), id(block_masks))
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit.block_masks is block_masks:
            _cache.move_to_end(key)
            return hit
    prepared = AttentionLayout(arr, block_size, block_masks=block_masks)
    with _cache_lock:
        _cache[key] = prepared
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return prepared
