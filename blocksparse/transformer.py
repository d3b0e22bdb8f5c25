"""Block-sparse attention for TensorFlow (the original ``blocksparse.transformer`` API).

>>> import numpy as np, tensorflow as tf
>>> from blocksparse.transformer import BlocksparseTransformer
>>> bst = BlocksparseTransformer(np.tril(np.ones((4, 4))), block_size=16, heads=2)
>>> q = k = v = tf.random.normal([3, 64, 2 * 8])       # (batch, ctx, heads * head_dim)
>>> w = bst.query_key_op(q, k)                         # (3, 2, 10, 16, 16): the layout's blocks
>>> y = bst.weight_value_op(bst.masked_softmax(w, scale=8 ** -0.5), v)
>>> y.shape
TensorShape([3, 64, 16])

Works in TF2 eager mode, inside ``tf.function`` (the batch may be unknown) and in
``tf.compat.v1`` graphs; every op is differentiable.  The ops run on the reference path
(TensorFlow ops: gather / einsum / segment sums; nothing ``ctx x ctx`` is made) on any device.
"""
from ._tf import tf
from ._tf.checks import float_dtype
from ._tf.transformer import arguments, autodiff, backend
from ._tf.transformer.reference import keep_mask
from .ops.transformer.frontend import TransformerBase

__all__ = ["BlocksparseTransformer", "clear_bst_constants"]

# The ops have no Python control flow on tensors; converting the library's code inside a user's
# tf.function (AutoGraph's default) would only cost seconds per trace.
_as_is = tf.autograph.experimental.do_not_convert


def clear_bst_constants():
    """Kept for compatibility: the original cached lookup-table constants per graph; nothing is
    cached here, so there is nothing to clear."""


class BlocksparseTransformer(TransformerBase):
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
        Name scope of the ops (default ``"BlocksparseTransformer"``).

    Shapes (``N`` = batch, ``ctx_q = q_blocks * bs``, ``ctx_k = k_blocks * bs``): queries
    ``(N, ctx_q, heads * d)``, keys and values ``(N, ctx_k, heads * d)`` (values may have another
    ``d``); scores and probabilities are packed ``(N, heads, blocks, bs, bs)`` (:meth:`w_shape`),
    block ``b`` of head ``h`` at ``block_coord(b, h)``, blocks in row-major ``(q, k)`` order.
    float32, float16 and bfloat16, computed in float32.  The original's ``bench`` arguments are
    accepted and ignored.
    """

    def __init__(self, layout, block_size=64, heads=None, mask_callback=None, name=None):
        super().__init__(layout, block_size, heads, mask_callback)
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty str or None; got {name!r}")
        self.name = name or "BlocksparseTransformer"

    def __repr__(self):
        return f"BlocksparseTransformer({self.layout!r}, masked={self.masks is not None}, name={self.name!r})"

    # ------------------------------------------------------------------ the products
    @_as_is
    def query_key_op(self, q, k, name=None, bench=0):
        """Scores ``q_h k_hᵀ`` on the layout's blocks: ``(N, ctx_q, F), (N, ctx_k, F) -> w_shape(N)``."""
        return self._nt(("q", q), ("k", k), name, bench)

    @_as_is
    def weight_value_op(self, w, v, name=None, bench=0):
        """``w_h v_h`` for probabilities ``w`` (``w_shape(N)``) and values ``(N, ctx_k, F)``: ``(N, ctx_q, F)``."""
        return self._xn(("w", w), ("v", v), False, name, bench)

    @_as_is
    def nt_op(self, a, b, name=None, bench=0):
        """``a (N, ctx_q, F)`` times ``b (N, ctx_k, F)`` transposed, per head, on the layout's blocks."""
        return self._nt(("a", a), ("b", b), name, bench)

    @_as_is
    def nn_op(self, a, b, name=None, bench=0):
        """Packed ``a`` (``w_shape(N)``) times ``b (N, ctx_k, F)``, per head: ``(N, ctx_q, F)``."""
        return self._xn(("a", a), ("b", b), False, name, bench)

    @_as_is
    def tn_op(self, a, b, name=None, bench=0):
        """Packed ``a`` (``w_shape(N)``) transposed times ``b (N, ctx_q, F)``, per head: ``(N, ctx_k, F)``."""
        return self._xn(("a", a), ("b", b), True, name, bench)

    def _nt(self, a, b, name, bench):
        arguments.bench(bench)
        with tf.name_scope(name or self.name + "_nt"):
            a_t = arguments.dense(self, a[1], a[0], self.ctx_q, "ctx_q")
            b_t = arguments.dense(self, b[1], b[0], self.ctx_k, "ctx_k")
            a_t, b_t = arguments.pair(a_t, b_t, a[0], b[0], same_features=True)
            return autodiff.nt(a_t, b_t, self.layout, backend.select(self.block_size, a_t.dtype))

    def _xn(self, w, x, trans, name, bench):
        arguments.bench(bench)
        with tf.name_scope(name or self.name + ("_tn" if trans else "_nn")):
            w_t = arguments.scores(self, w[1], w[0])
            x_t = arguments.dense(self, x[1], x[0], *((self.ctx_q, "ctx_q") if trans else (self.ctx_k, "ctx_k")))
            w_t, x_t = arguments.pair(w_t, x_t, w[0], x[0])
            return autodiff.xn(w_t, x_t, self.layout, backend.select(self.block_size, x_t.dtype), trans)

    # ------------------------------------------------------------------ the softmax
    @_as_is
    def masked_softmax(self, x, scale=1.0, autoregress_at_key=None, dtype=None):
        """Softmax of ``scale * x`` along each query row over its kept elements.

        Parameters
        ----------
        x : tensor, shape ``w_shape(N)``
            Packed scores (float32, float16 or bfloat16).
        scale : float or scalar float tensor
            Multiplies the scores before the softmax (a tensor gets a gradient too).
        autoregress_at_key : int or scalar int tensor, optional
            Also drop key position ``kp`` for query position ``qp`` where ``kp > qp`` and
            ``kp >= autoregress_at_key`` (0: causal; a prefix of that many keys stays visible).
        dtype : dtype, optional
            Dtype of the result (default: ``x``'s).

        Returns
        -------
        tensor, shape ``w_shape(N)``
            Probabilities; 0 where an element is dropped, and a whole row of 0 where a query row
            keeps nothing (never NaN).  In-block masks come from ``mask_callback``.
        """
        return self._softmax(x, scale, arguments.autoregress_at_key(autoregress_at_key), dtype, self.masks)

    @_as_is
    def softmax(self, x, scale=1.0, dtype=None):
        """Softmax of ``scale * x`` along each query row over whole blocks (no in-block mask)."""
        return self._softmax(x, scale, None, dtype, None)

    def _softmax(self, x, scale, autoregress_at_key, dtype, masks):
        scale, scale_grad = arguments.scale(scale)
        with tf.name_scope(self.name + "_softmax"):
            x = arguments.scores(self, x, "x")
            dtype = x.dtype if dtype is None else float_dtype(dtype, "dtype")
            keep = keep_mask(self.layout, masks, autoregress_at_key)
            return autodiff.softmax(x, scale, keep, self.layout, backend.select(self.block_size, x.dtype), dtype,
                                    scale_grad)
