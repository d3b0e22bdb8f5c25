"""What both frontends' ``BlocksparseTransformer`` share: construction, argument checks, shape
helpers, the original's attribute names and its numpy ``*_test`` helpers (no framework import)."""
from __future__ import annotations

import numbers
import sys

import numpy as np

from ..._checks import check_int, check_minibatch
from .lut import AttentionLayout

__all__ = ["TransformerBase", "check_autoregress_at_key", "check_bench", "check_scale"]

_FLOAT_MAX = sys.float_info.max


def check_scale(scale):
    """``scale`` as a float (a finite real number)."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number; got {scale!r} of type {type(scale).__name__}")
    if not -_FLOAT_MAX <= scale <= _FLOAT_MAX:  # comparisons, not math.isfinite: torch.compile traces them
        raise ValueError(f"scale must be finite; got {scale}")
    return float(scale)


def check_autoregress_at_key(value):
    """``autoregress_at_key`` as an int >= 0, or None."""
    return check_int(value, "autoregress_at_key", 0, 2**63 - 1, allow_none=True)


def check_bench(value):
    """The original's ``bench`` argument: an int, accepted and ignored."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"bench must be an int (it is accepted for compatibility and ignored); got {value!r}")


class TransformerBase:
    """Attention restricted to a block layout: scores, masked softmax and weighted values.

    Parameters
    ----------
    layout : array_like, shape (heads, q_blocks, k_blocks) or (q_blocks, k_blocks)
        0/1 block layout: query block ``q`` of head ``h`` attends to key block ``k`` where
        ``layout[h, q, k] == 1``.  Every head holds the same number of blocks.  A 2-D layout (or
        one of shape ``(1, q_blocks, k_blocks)``) is shared by ``heads`` heads.
    block_size : int
        8, 16, 32, 64 or 128.
    heads : int, optional
        Number of heads; required with a 2-D layout.
    mask_callback : callable, optional
        ``mask_callback(blk_shape, head, q_blk, k_blk, blk_id) -> (bs, bs)`` 0/1 array: the elements
        of block ``blk_id`` (query row ``i``, key column ``j``) that :meth:`masked_softmax` keeps.
        Called once per block of each layout head when the object is made.
    name : str, optional
        Name of the object; TensorFlow's name scope of the ops (default ``"BlocksparseTransformer"``).

    Shapes (``N`` = batch, ``ctx_q = q_blocks * bs``, ``ctx_k = k_blocks * bs``): queries
    ``(N, ctx_q, heads * d)``, keys and values ``(N, ctx_k, heads * d)`` (values may have another
    ``d``); scores and probabilities are packed ``(N, heads, blocks, bs, bs)`` (:meth:`w_shape`),
    block ``b`` of head ``h`` at ``block_coord(b, h)``, blocks in row-major ``(q, k)`` order.
    float32, float16 and bfloat16, computed in float32; every op is differentiable.

    This class holds what both frontends share; ``blocksparse.transformer.BlocksparseTransformer``
    (TensorFlow) and ``blocksparse.torch.BlocksparseTransformer`` (PyTorch) implement the ops.
    """

    def __init__(self, layout, block_size=64, heads=None, mask_callback=None, name=None):
        self.layout = AttentionLayout(layout, block_size, heads)
        self.masks = None if mask_callback is None else self.layout.block_masks(mask_callback)
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty str or None; got {name!r}")
        self.name = name or "BlocksparseTransformer"

    def __repr__(self):
        return (f"{type(self).__name__}({self.layout!r}, masked={self.masks is not None}, "
                f"name={self.name!r})")

    # ------------------------------------------------------------------ the original's attributes
    blk_size = block_size = property(lambda self: self.layout.block_size)
    heads = property(lambda self: self.layout.heads)
    lut_heads = property(lambda self: self.layout.lut_heads)
    blocks = property(lambda self: self.layout.blocks)
    ctx_blks_q = property(lambda self: self.layout.QB)
    ctx_blks_k = property(lambda self: self.layout.KB)
    ctx_q = property(lambda self: self.layout.ctx_q)
    ctx_k = property(lambda self: self.layout.ctx_k)
    blk_shape = property(lambda self: (self.layout.block_size, self.layout.block_size))
    nn_max = property(lambda self: self.layout.nn_max)
    tn_max = property(lambda self: self.layout.tn_max)

    @property
    def nt_list(self):
        """Per layout head, the ``(q, k)`` of every block in block order."""
        return [[tuple(c) for c in head.tolist()] for head in self.layout.coords]

    @property
    def nn_list(self):
        """Per layout head and query block, the ``(block, k)`` pairs of its row."""
        lay = self.layout
        return [[[(b, int(lay.coords[h, b, 1])) for b in range(lay.row_offsets[h, q], lay.row_offsets[h, q + 1])]
                 for q in range(lay.QB)] for h in range(lay.lut_heads)]

    @property
    def tn_list(self):
        """Per layout head and key block, the ``(block, q)`` pairs of its column."""
        lay = self.layout
        return [[[(int(b), int(lay.coords[h, b, 0]))
                  for b in lay.col_blocks[h, lay.col_offsets[h, k]:lay.col_offsets[h, k + 1]]]
                 for k in range(lay.KB)] for h in range(lay.lut_heads)]

    def block_coord(self, block, head=0):
        """Layout coordinate ``(q, k)`` of block id ``block`` of ``head``."""
        return self.layout.block_coord(block, head)

    # ------------------------------------------------------------------ the ops
    def query_key_op(self, q, k, name=None, bench=0):
        """Scores ``q_h k_hᵀ`` on the layout's blocks.

        Parameters
        ----------
        q : tensor, shape ``(N, ctx_q, heads * d)``
        k : tensor, shape ``(N, ctx_k, heads * d)``, the dtype of ``q``
        name : str, optional
            Name scope of the ops (TensorFlow; ignored by PyTorch).
        bench : int
            The original's benchmarking switch: accepted, ignored.

        Returns
        -------
        tensor, shape ``w_shape(N)``, the dtype of ``q``
        """
        return self._nt(("q", q), ("k", k), name, bench)

    def weight_value_op(self, w, v, name=None, bench=0):
        """Probabilities ``w`` (``w_shape(N)``) times values ``v`` ``(N, ctx_k, heads * d)``, per
        head: ``(N, ctx_q, heads * d)``.  ``name``, ``bench``: as :meth:`query_key_op`."""
        return self._xn(("w", w), ("v", v), False, name, bench)

    def nt_op(self, a, b, name=None, bench=0):
        """``a (N, ctx_q, F)`` times ``b (N, ctx_k, F)`` transposed, per head, on the layout's
        blocks: ``w_shape(N)`` (the op behind :meth:`query_key_op`)."""
        return self._nt(("a", a), ("b", b), name, bench)

    def nn_op(self, a, b, name=None, bench=0):
        """Packed ``a`` (``w_shape(N)``) times ``b (N, ctx_k, F)``, per head: ``(N, ctx_q, F)`` (the op
        behind :meth:`weight_value_op`)."""
        return self._xn(("a", a), ("b", b), False, name, bench)

    def tn_op(self, a, b, name=None, bench=0):
        """Packed ``a`` (``w_shape(N)``) transposed times ``b (N, ctx_q, F)``, per head: ``(N, ctx_k, F)``
        (what gradients need: ``dv = wᵀ do``, ``dk = dsᵀ q``)."""
        return self._xn(("a", a), ("b", b), True, name, bench)

    def masked_softmax(self, x, scale=1.0, autoregress_at_key=None, dtype=None):
        """Softmax of ``scale * x`` along each query row over its kept elements.

        Parameters
        ----------
        x : tensor, shape ``w_shape(N)``
            Packed scores.
        scale : float
            Multiplies the scores before the softmax (TensorFlow: also a scalar tensor, which gets
            its gradient).
        autoregress_at_key : int, optional
            Also drop key position ``kp`` for query position ``qp`` where ``kp > qp`` and
            ``kp >= autoregress_at_key`` (0: causal; a prefix of that many keys stays visible).
            TensorFlow: also a scalar integer tensor.
        dtype : dtype, optional
            Dtype of the result (default: ``x``'s).

        Returns
        -------
        tensor, shape ``w_shape(N)``
            Probabilities; 0 where an element is dropped, and a whole row of 0 where a query row
            keeps nothing (never NaN).  In-block masks come from ``mask_callback``.
        """
        return self._softmax(x, scale, autoregress_at_key, dtype, masked=True)

    def softmax(self, x, scale=1.0, dtype=None):
        """Softmax of ``scale * x`` along each query row over whole blocks (no in-block mask)."""
        return self._softmax(x, scale, None, dtype, masked=False)

    def _unimplemented(self, *args, **kwargs):
        raise NotImplementedError("the TensorFlow and PyTorch frontends implement the ops")

    # the frontends' hooks: _nt((name, a), (name, b), name, bench), _xn((name, w), (name, x), trans, name,
    # bench) -- nn, or tn with trans -- and _softmax(x, scale, autoregress_at_key, dtype, masked)
    _nt = _xn = _softmax = _unimplemented

    # ------------------------------------------------------------------ shape helpers
    def w_shape(self, N):
        """Shape of the packed scores / probabilities for batch ``N``: ``(N, heads, blocks, bs, bs)``."""
        return (check_minibatch(N), self.heads, self.blocks, self.block_size, self.block_size)

    def q_shape(self, N, features):
        """Shape of queries (and of ``weight_value_op``'s output): ``(N, ctx_q, features)``."""
        return (check_minibatch(N), self.ctx_q, self._features(features))

    def k_shape(self, N, features):
        """Shape of keys and values: ``(N, ctx_k, features)``."""
        return (check_minibatch(N), self.ctx_k, self._features(features))

    def _features(self, features):
        if isinstance(features, bool) or not isinstance(features, numbers.Integral) or features < 1:
            raise ValueError(f"features must be a positive int (heads * head_dim); got {features!r}")
        if features % self.heads:
            raise ValueError(f"features must be a multiple of heads={self.heads} (heads * head_dim); "
                             f"got {features}")
        return int(features)

    def dense_shape_error(self, name, shape, ctx, ctx_name):
        """The message for an activation of ``shape`` (ints, None = unknown) that breaks the rules
        ``(batch, ctx, heads * head_dim)``, or None when nothing known is wrong."""
        want = f"(batch, {ctx_name} = {ctx}, heads * head_dim) with heads = {self.heads}"
        if len(shape) != 3:
            return f"{name} must be 3-D {want}; got shape {tuple(shape)}"
        if shape[1] is not None and shape[1] != ctx:
            return (f"{name} must have shape {want}; got {shape[1]} positions on axis 1 (shape {tuple(shape)}): "
                    f"the layout has {ctx // self.block_size} blocks of {self.block_size}")
        if shape[2] is not None and (shape[2] == 0 or shape[2] % self.heads):
            return (f"{name} must have shape {want}; got {shape[2]} features on axis 2, not a positive "
                    f"multiple of {self.heads}")
        return None

    def scores_shape_error(self, name, shape):
        """The message for packed scores of ``shape`` that are not ``w_shape(batch)``, or None."""
        want = ("batch", *self.w_shape(None)[1:])
        if len(shape) != 5 or any(got is not None and got != size for got, size in zip(shape[1:], want[1:])):
            return f"{name} must have shape (batch, heads, blocks, bs, bs) = {want}; got {tuple(shape)}"
        return None

    # ------------------------------------------------------------------ numpy references
    def _out_dtype(self, *arrays):
        return np.result_type(np.float32, *(np.asarray(a).dtype for a in arrays))

    def nt_test(self, A, B):
        """numpy ``nt``: packed ``A_h @ B_h.T`` on the layout's blocks (float64 inside)."""
        from ...testing import attention as ref
        return ref.nt(self.layout, A, B).astype(self._out_dtype(A, B))

    def nn_test(self, A, B):
        """numpy ``nn``: packed ``A`` (the block-sparse weights) times dense ``B`` per head."""
        from ...testing import attention as ref
        return ref.nn(self.layout, A, B).astype(self._out_dtype(A, B))

    def tn_test(self, A, B):
        """numpy ``tn``: the transpose of packed ``A`` times dense ``B`` per head."""
        from ...testing import attention as ref
        return ref.tn(self.layout, A, B).astype(self._out_dtype(A, B))

    def masked_softmax_test(self, x, scale=1.0, autoregress_at_key=None):
        """numpy :meth:`masked_softmax` (fully masked rows are zeros)."""
        from ...testing import attention as ref
        return ref.softmax(self.layout, x, check_scale(scale), self.masks,
                           check_autoregress_at_key(autoregress_at_key)).astype(self._out_dtype(x))

    def masked_softmax_grad_test(self, dy, y, scale=1.0):
        """numpy gradient of :meth:`masked_softmax` for output gradient ``dy`` and output ``y``."""
        from ...testing import attention as ref
        return ref.softmax_grad(self.layout, dy, y, check_scale(scale)).astype(self._out_dtype(dy, y))
