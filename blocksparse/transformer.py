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
``tf.compat.v1`` graphs; every op is differentiable.  On a GPU the ops run the Triton kernels the
PyTorch frontend runs, compiled ahead of time into the op library (block sizes 16 to 128, float32,
float16 and bfloat16; the products for head dimensions that are multiples of 16); elsewhere --
the CPU, XLA, block size 8, other head dimensions, no op library -- the reference path (TensorFlow
ops: gather / einsum / segment sums; nothing ``ctx x ctx`` is made) computes them.  See
:mod:`blocksparse._tf.transformer.backend`.
"""
from ._tf import tf
from ._tf.checks import float_dtype, op_name
from ._tf.transformer import arguments, autodiff, backend
from .ops.transformer.frontend import TransformerBase, check_bench

__all__ = ["BlocksparseTransformer", "clear_bst_constants"]

# The ops have no Python control flow on tensors; converting the library's code inside a user's
# tf.function (AutoGraph's default) would only cost seconds per trace.
_as_is = tf.autograph.experimental.do_not_convert


def clear_bst_constants():
    """Kept for compatibility: the original cached lookup-table constants per graph; nothing is
    cached here, so there is nothing to clear."""


class BlocksparseTransformer(TransformerBase):
    __doc__ = TransformerBase.__doc__.split("    This class holds")[0] + """\
    TensorFlow: the op library's kernels on a GPU, the reference path (TensorFlow ops) elsewhere
    (see the module docstring); the original's ``bench`` arguments are accepted and ignored.
    """

    def _head_dim(self, t):
        """The head dimension of activations ``t`` (checked), None where unknown when the op is built."""
        features = t.shape[2]
        return None if features is None else features // self.heads

    @_as_is
    def _nt(self, a, b, name, bench):
        check_bench(bench)
        with tf.name_scope(op_name(name, self.name + "_nt")):
            a_t = arguments.dense(self, a[1], a[0], self.ctx_q, "ctx_q")
            b_t = arguments.dense(self, b[1], b[0], self.ctx_k, "ctx_k")
            a_t, b_t = arguments.pair(a_t, b_t, a[0], b[0], same_features=True)
            return autodiff.nt(a_t, b_t, self.layout, backend.select(self.block_size, a_t.dtype, self._head_dim(a_t)))

    @_as_is
    def _xn(self, w, x, trans, name, bench):
        check_bench(bench)
        with tf.name_scope(op_name(name, self.name + ("_tn" if trans else "_nn"))):
            w_t = arguments.scores(self, w[1], w[0])
            x_t = arguments.dense(self, x[1], x[0], *((self.ctx_q, "ctx_q") if trans else (self.ctx_k, "ctx_k")))
            if w_t.dtype.base_dtype in (tf.float16, tf.bfloat16) and x_t.dtype.base_dtype == tf.float32:
                w_t = tf.cast(w_t, tf.float32)  # 16-bit scores, float32 activations (the original's NN / TN): exact
            w_t, x_t = arguments.pair(w_t, x_t, w[0], x[0])
            return autodiff.xn(w_t, x_t, self.layout, backend.select(self.block_size, x_t.dtype, self._head_dim(x_t)),
                               trans)

    @_as_is
    def _softmax(self, x, scale, autoregress_at_key, dtype, masked):
        scale, scale_grad = arguments.scale(scale)
        autoregress_at_key = arguments.autoregress_at_key(autoregress_at_key)
        if autoregress_at_key is not None:  # NaN where XLA drops its assertion: a negative one never runs silently
            scale = tf.where(autoregress_at_key >= 0, scale, float("nan"))
        with tf.name_scope(self.name + "_softmax"):
            x = arguments.scores(self, x, "x")
            dtype = x.dtype if dtype is None else float_dtype(dtype, "dtype")
            return autodiff.softmax(x, scale, self.masks if masked else None, autoregress_at_key, self.layout,
                                    backend.select(self.block_size, x.dtype), dtype, scale_grad)


for _op in ("query_key_op", "weight_value_op", "nt_op", "nn_op", "tn_op", "masked_softmax", "softmax"):
    setattr(BlocksparseTransformer, _op, _as_is(getattr(TransformerBase, _op)))
