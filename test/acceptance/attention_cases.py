"""Layouts of the ``BlocksparseTransformer`` acceptance tests, shared by both frameworks."""
from dataclasses import dataclass

import numpy as np
import pytest

from attention_reference import Ref

BS = 8


def tril_callback(blk_shape, head, q_blk, k_blk, blk_id):
    return np.tril(np.ones(blk_shape, bool)) if q_blk == k_blk else np.ones(blk_shape, bool)


def patterned_callback(blk_shape, head, q_blk, k_blk, blk_id):
    """A different, irregular mask per (head, q, k); row 2 of block (0, 0) of head 0 keeps nothing."""
    r = np.random.default_rng([head, q_blk, k_blk]).random(blk_shape) < 0.6
    if (head, q_blk, k_blk) == (0, 0, 0):
        r[2] = False
    return r


@dataclass
class Case:
    id: str
    layout: np.ndarray
    heads: int
    callback: object = None
    bs: int = BS

    def make(self, cls):
        return cls(self.layout, block_size=self.bs, heads=self.heads, mask_callback=self.callback)

    def ref(self):
        lay = np.asarray(self.layout, bool)
        lay = np.broadcast_to(lay if lay.ndim == 3 else lay[None], (self.heads,) + lay.shape[-2:])
        masks = None
        if self.callback is not None:
            masks = [[[None] * lay.shape[2] for _ in range(lay.shape[1])] for _ in range(self.heads)]
            shared = np.asarray(self.layout).ndim == 2 or np.asarray(self.layout).shape[0] == 1
            for h in range(self.heads):
                for b, (q, k) in enumerate(np.argwhere(lay[h])):
                    masks[h][q][k] = self.callback((self.bs, self.bs), 0 if shared else h, q, k, b)
        return Ref(lay, self.bs, masks)


CAUSAL = np.tril(np.ones((3, 3), int))
PER_HEAD = np.array([[[1, 0, 1], [0, 1, 1]], [[1, 1, 0], [1, 0, 1]]])   # 2 heads, 2 x 3 blocks, 4 each
CASES = [
    Case("causal-shared-2heads-tril", CAUSAL, 2, tril_callback),
    Case("per-head-nonsquare", PER_HEAD, 2, None),
    Case("leading-1-layout-3heads-masks", CAUSAL[None], 3, patterned_callback),
    Case("per-head-masks", PER_HEAD, 2, patterned_callback),
]
IDS = [c.id for c in CASES]


def drop_even_rows(blk_shape, head, q_blk, k_blk, blk_id):
    m = np.ones(blk_shape, bool)
    m[::2] = False
    return m


#: Every even query row of every block dropped: rows that keep nothing.
DROP_ROWS = Case("drop-even-rows", np.ones((2, 2), int), 1, drop_even_rows)

PRODUCTS = ["query_key_op", "nt_op", "weight_value_op", "nn_op", "tn_op"]


def product_shapes(bst, op, N, D):
    """Shapes of the two operands of ``op`` (an entry of ``PRODUCTS``) and of its result."""
    if op in ("query_key_op", "nt_op"):
        return bst.q_shape(N, bst.heads * D), bst.k_shape(N, bst.heads * D), bst.w_shape(N)
    if op in ("weight_value_op", "nn_op"):
        return bst.w_shape(N), bst.k_shape(N, bst.heads * D), bst.q_shape(N, bst.heads * D)
    return bst.w_shape(N), bst.q_shape(N, bst.heads * D), bst.k_shape(N, bst.heads * D)


def product_reference(R, op, a, b, dy):
    """float64 ``(result, d a, d b)`` of ``op`` for output gradient ``dy`` (the products' gradients
    are the products again)."""
    if op in ("query_key_op", "nt_op"):
        return R.nt(a, b), R.nn(dy, b), R.tn(dy, a)
    if op in ("weight_value_op", "nn_op"):
        return R.nn(a, b), R.nt(dy, b), R.tn(a, dy)
    return R.tn(a, b), R.nt(b, dy), R.nn(a, dy)


def bad_calls(bst, q, w):
    """``(call, error, pattern)`` of bad arguments either framework rejects alike: ``q`` activations
    ``bst.q_shape(2, 8)`` and ``w`` scores ``bst.w_shape(2)`` of the framework under test."""
    return [
        (lambda: bst.query_key_op(q[:, :16], q), ValueError, "q"),
        (lambda: bst.query_key_op(q, q[..., :7]), ValueError, "k"),
        (lambda: bst.query_key_op(q[0], q[0]), ValueError, "q"),
        (lambda: bst.weight_value_op(w[:, :, :5], q), ValueError, "w"),
        (lambda: bst.weight_value_op(w, q[:, :8]), ValueError, "v"),
        (lambda: bst.masked_softmax(w[:, :1]), ValueError, "x"),
        (lambda: bst.masked_softmax(w, scale="a"), (TypeError, ValueError), "scale"),
        (lambda: bst.masked_softmax(w, autoregress_at_key=-1), ValueError, "autoregress_at_key"),
        (lambda: bst.masked_softmax(w, autoregress_at_key=1.5), (TypeError, ValueError), "autoregress_at_key"),
        (lambda: bst.q_shape(2, 7), ValueError, "features"),
    ]


def assert_all_raise(cases):
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


EMPTY_ROW_AND_COLUMN = np.array([[1, 0, 1], [0, 0, 0], [1, 0, 1]])   # query block 1, key block 1: nothing

#: Second-round cases of the whole chain (scores, masked softmax, weighted values) at the kernels'
#: block sizes: ``(case, autoregress_at_key)``.
CHAIN_CASES = {
    "bs16-empty-row-and-column-2heads": (Case("", EMPTY_ROW_AND_COLUMN, 2, None, 16), None),
    "bs32-one-block": (Case("", np.ones((1, 1), int), 1, None, 32), 0),
    "bs16-dense-tril-callback-causal": (Case("", np.ones((2, 2), int), 2, tril_callback, 16), 0),
    "bs16-per-head-empty-rows-prefix": (Case("", np.array([[[1, 1], [0, 0]], [[0, 0], [1, 1]]]), 2, None, 16), 3),
}


def chain_reference(R, q, k, v, dy, scale, autoregress_at_key):
    """float64 ``(y, dq, dk, dv)`` of ``nn(masked_softmax(nt(q, k)), v)`` for output gradient ``dy``."""
    s = R.nt(q, k)
    p = R.softmax(s, scale, autoregress_at_key)
    ds = R.softmax_grad(R.nt(dy, v), p, scale)
    return R.nn(p, v), R.nn(ds, k), R.tn(ds, q), R.tn(p, dy)


#: ``(N, error)`` pairs the shape helpers reject, with readable ids.
BAD_MINIBATCH = pytest.mark.parametrize("N, error", [(-1, ValueError), (1.5, TypeError), ("2", TypeError),
                                                     (True, TypeError)], ids=["negative", "float", "str", "bool"])


def check_bad_minibatch(cls, N, error):
    """``w_shape`` / ``q_shape`` / ``k_shape`` of ``cls`` (either framework's transformer) raise
    ``error`` naming ``N``."""
    bst = cls(np.tril(np.ones((2, 2))), block_size=16, heads=2)
    for call in (lambda: bst.w_shape(N), lambda: bst.q_shape(N, 8), lambda: bst.k_shape(N, 8)):
        with pytest.raises(error, match="N"):
            call()
