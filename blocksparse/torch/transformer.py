"""Public PyTorch API of block-sparse attention: :class:`BlocksparseTransformer`."""
from __future__ import annotations

import torch

from ..ops.transformer.frontend import TransformerBase, check_autoregress_at_key, check_scale
from ._transformer import ops as _ops
from ._transformer import state as _state

__all__ = ["BlocksparseTransformer"]

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class BlocksparseTransformer(TransformerBase):
    """Attention restricted to a block layout: scores, masked softmax and weighted values.

    Parameters
    ----------
    layout : array_like, shape (heads, q_blocks, k_blocks) or (q_blocks, k_blocks)
        0/1 block layout: query block ``q`` of head ``h`` attends to key block ``k`` where
        ``layout[h, q, k] == 1``.  Every head holds the same number of blocks.  A 2-D layout (or
        one of shape ``(1, q_blocks, k_blocks)``) is shared by ``heads`` heads.
    block_size : int
        8, 16, 32, 64 or 128 (8 takes the reference path).
    heads : int, optional
        Number of heads; required with a 2-D layout.
    mask_callback : callable, optional
        ``mask_callback(blk_shape, head, q_blk, k_blk, blk_id) -> (bs, bs)`` 0/1 array: the elements
        of block ``blk_id`` (query row ``i``, key column ``j``) that :meth:`masked_softmax` keeps.
        Called once per block of each layout head when the object is made.

    Shapes (``N`` = batch, ``ctx_q = q_blocks * bs``, ``ctx_k = k_blocks * bs``): queries
    ``(N, ctx_q, heads * d)``, keys and values ``(N, ctx_k, heads * d)`` (values may have another
    ``d``); scores and probabilities are packed ``(N, heads, blocks, bs, bs)`` (:meth:`w_shape`), block
    ``b`` of head ``h`` at ``block_coord(b, h)``, blocks in row-major ``(q, k)`` order.  Every op is
    differentiable, traceable by ``torch.compile(fullgraph=True)`` and works under ``torch.autocast``.
    On CUDA tensors the Triton kernels run, elsewhere the reference path (PyTorch ops).

    Examples
    --------
    >>> import numpy as np
    >>> bst = BlocksparseTransformer(np.tril(np.ones((4, 4))), block_size=16, heads=2)
    >>> q, k, v = (torch.randn(3, 64, 2 * 8) for _ in range(3))
    >>> w = bst.query_key_op(q, k)                    # (3, 2, 10, 16, 16)
    >>> p = bst.masked_softmax(w, scale=8 ** -0.5)
    >>> bst.weight_value_op(p, v).shape
    torch.Size([3, 64, 16])
    """

    def __init__(self, layout, block_size=64, heads=None, mask_callback=None):
        super().__init__(layout, block_size, heads, mask_callback)
        self._handle = _state.handle(self.layout, self.masks)

    def __repr__(self):
        return f"BlocksparseTransformer({self.layout!r}, masked={self.masks is not None})"

    # ------------------------------------------------------------------ the products
    def query_key_op(self, q, k):
        """Scores ``q_h k_hᵀ`` on the layout's blocks: ``(N, ctx_q, F), (N, ctx_k, F) -> w_shape(N)``."""
        return self._nt(("q", q), ("k", k))

    def weight_value_op(self, w, v):
        """``w_h v_h`` for probabilities ``w`` (``w_shape(N)``) and values ``(N, ctx_k, F)``: ``(N, ctx_q, F)``."""
        return self._xn(("w", w), ("v", v), trans=False)

    def nt_op(self, a, b):
        """``a (N, ctx_q, F)`` times ``b (N, ctx_k, F)`` transposed, per head, on the layout's blocks."""
        return self._nt(("a", a), ("b", b))

    def nn_op(self, a, b):
        """Packed ``a`` (``w_shape(N)``) times ``b (N, ctx_k, F)``, per head: ``(N, ctx_q, F)``."""
        return self._xn(("a", a), ("b", b), trans=False)

    def tn_op(self, a, b):
        """Packed ``a`` (``w_shape(N)``) transposed times ``b (N, ctx_q, F)``, per head: ``(N, ctx_k, F)``."""
        return self._xn(("a", a), ("b", b), trans=True)

    def _nt(self, a, b):
        a_t, b_t = self._operands((*a, "dense", self.ctx_q), (*b, "dense", self.ctx_k))
        if a_t.shape[2] != b_t.shape[2]:
            raise ValueError(f"{a[0]} and {b[0]} must have the same features (heads * head_dim); got "
                             f"{a_t.shape[2]} and {b_t.shape[2]}")
        return _ops.bst_nt(a_t, b_t, self._handle)

    def _xn(self, w, x, trans):
        w_t, x_t = self._operands((*w, "scores", None), (*x, "dense", self.ctx_q if trans else self.ctx_k))
        return (_ops.bst_tn if trans else _ops.bst_nn)(w_t, x_t, self._handle)

    # ------------------------------------------------------------------ the softmax
    def masked_softmax(self, x, scale=1.0, autoregress_at_key=None, dtype=None):
        """Softmax of ``scale * x`` along each query row over its kept elements.

        Parameters
        ----------
        x : Tensor, shape ``w_shape(N)``
            Packed scores.
        scale : float
            Multiplies the scores before the softmax.
        autoregress_at_key : int, optional
            Also drop key position ``kp`` for query position ``qp`` where ``kp > qp`` and
            ``kp >= autoregress_at_key`` (0: causal; a prefix of that many keys stays visible).
        dtype : torch.dtype, optional
            Dtype of the result (default: ``x``'s).

        Returns
        -------
        Tensor, shape ``w_shape(N)``
            Probabilities; 0 where an element is dropped, and a whole row of 0 where a query row
            keeps nothing (never NaN).  In-block masks come from ``mask_callback``.
        """
        return self._softmax(x, scale, check_autoregress_at_key(autoregress_at_key), dtype, masked=True)

    def softmax(self, x, scale=1.0, dtype=None):
        """Softmax of ``scale * x`` along each query row over whole blocks (no in-block mask)."""
        return self._softmax(x, scale, None, dtype, masked=False)

    def _softmax(self, x, scale, autoregress_at_key, dtype, masked):
        scale = check_scale(scale)
        (x,) = self._operands(("x", x, "scores", None), autocast=False)
        if dtype is None:
            dtype = x.dtype
        elif dtype not in _OUT_DTYPES:
            raise TypeError(f"dtype must be one of {', '.join(map(str, _OUT_DTYPES))} or None; got {dtype!r}")
        return _ops.bst_softmax(x, self._handle, scale, autoregress_at_key, masked, dtype)

    # ------------------------------------------------------------------ checks
    def _operands(self, *specs, autocast=True):
        """Check ``(name, tensor, kind, ctx)`` operands; cast to the autocast dtype if on."""
        tensors = []
        for name, t, kind, ctx in specs:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
            if not t.is_floating_point():
                raise TypeError(f"{name} must be floating point (float16, bfloat16, float32, float64); got {t.dtype}")
            if kind == "dense":
                error = self.dense_shape_error(name, tuple(t.shape), ctx, "ctx_q" if ctx == self.ctx_q else "ctx_k")
            else:
                error = self.scores_shape_error(name, tuple(t.shape))
            if error:
                raise ValueError(error)
            tensors.append(t)
        first = tensors[0]
        for (name, *_), t in zip(specs[1:], tensors[1:]):
            if t.device != first.device:
                raise ValueError(f"{specs[0][0]} and {name} must be on one device; got {first.device} and {t.device}")
            if t.shape[0] != first.shape[0]:
                raise ValueError(f"{specs[0][0]} and {name} must have the same batch size; got {first.shape[0]} "
                                 f"and {t.shape[0]}")
        if autocast and torch.is_autocast_enabled(first.device.type):
            dtype = torch.get_autocast_dtype(first.device.type)
            tensors = [t.to(dtype) for t in tensors]
        for (name, *_), t in zip(specs[1:], tensors[1:]):
            if t.dtype != tensors[0].dtype:
                raise TypeError(f"{specs[0][0]} and {name} must have the same dtype; got {tensors[0].dtype} "
                                f"and {t.dtype}")
        return tensors
