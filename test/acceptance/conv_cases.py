"""Convolution cases of the acceptance tests, shared by the TensorFlow and PyTorch files: every
spatial rank, padding mode, strides, dilations, unequal blocks with arbitrary channel indices."""
from dataclasses import dataclass, field

import numpy as np
import pytest

import conv_reference as ref


@dataclass
class Case:
    id: str
    BCK: list
    TRS: tuple
    DHW: tuple
    kwargs: dict = field(default_factory=dict)
    transposed: bool = False
    N: int = 2

    def norm(self, name, default):
        """An argument per spatial axis, as the reference wants it."""
        value = self.kwargs.get(name, default)
        nd = len(self.TRS)
        if isinstance(value, int):
            return (value,) * nd
        return tuple(value)[-nd:] if len(value) > nd else tuple(value)


CASES = [
    Case("2d-same-uniform", [(range(0, 3), range(0, 2)), (range(3, 6), range(2, 4)), (range(0, 3), range(2, 4))],
         (3, 3), (5, 6), {"edge_bias": True}),
    Case("2d-unequal-shuffled-stride2", [([4, 0, 2], [1]), ([1, 3], [0, 2, 5]), ([0, 2], [3, 4])], (3, 2), (7, 6),
         {"strides": (2, 2), "edge_bias": True}),
    Case("1d-valid-stride3-dilate2", [([0, 1], [0, 1, 2]), ([2], [3])], (3,), (13,),
         {"strides": (3,), "dilates": (2,), "padding": "VALID"}),
    Case("1d-batch1-even-same", [([0], [0]), ([1], [1]), ([0, 1], [2])], (4,), (9,), {"edge_bias": True}, N=1),
    Case("3d-explicit-pairs", [([0, 1], [0]), ([2], [1, 2])], (2, 3, 2), (3, 5, 4),
         {"strides": (1, 2, 1), "dilates": (1, 1, 2), "padding": ((1, 0), 1, (0, 2)), "edge_bias": True}),
    Case("2d-int-padding-dilate", [([0, 1, 2], [0, 1])], (3, 3), (6, 5),
         {"dilates": 2, "padding": 2, "strides": 1, "edge_bias": True}),
    Case("deconv-2d-k4-s2-p1", [([0, 1], [0, 1]), ([2, 3], [2, 3]), ([0, 1], [2, 3])], (4, 4), (3, 4),
         {"strides": (2, 2), "padding": 1, "edge_bias": True}, transposed=True),
    Case("deconv-1d-same-mpq", [([0], [0, 1]), ([1, 2], [2])], (3,), (5,),
         {"strides": (2,), "MPQ": (9,), "edge_bias": True}, transposed=True),
    Case("deconv-3d-valid", [([0, 1], [0, 1])], (2, 2, 2), (2, 3, 2), {"strides": (1, 2, 1), "padding": "VALID"},
         transposed=True),
    Case("deconv-2d-same-default-mpq-dilate", [([0], [1]), ([1], [0])], (3, 3), (4, 3),
         {"strides": (2, 1), "dilates": (1, 2), "edge_bias": True}, transposed=True),
]
IDS = [c.id for c in CASES]

#: Second-round cases: channels no block lists (an unused input, an output left at zero), a 1x1
#: filter, a stride longer than the filter, an output of one position, an edge-biased deconvolution
#: with explicit (before, after) padding.
MORE_CASES = [
    Case("2d-unused-channels-edge-bias", [([0, 3], [0, 2]), ([3], [3])], (3, 3), (4, 5), {"edge_bias": True}),
    Case("2d-1x1-stride2", [([0, 1], [0]), ([2], [1]), ([1], [1])], (1, 1), (5, 4), {"strides": 2}),
    Case("1d-stride-beyond-filter-valid-to-one", [([1, 0], [1, 0])], (3,), (5,),
         {"strides": (4,), "padding": "VALID"}),
    Case("deconv-1d-explicit-pairs-edge-bias", [([0, 2], [1]), ([1], [0, 1])], (3,), (4,),
         {"strides": (2,), "padding": ((2, 1),), "edge_bias": True}, transposed=True, N=1),
]
MORE_IDS = [c.id for c in MORE_CASES]


def reference(case, conv, x, blocks, eb, gy):
    """float64 ``(y, dx, [dF_b], deb)`` of ``conv`` (built from ``case``) on ``x`` and per-block filters."""
    strides, dilates = case.norm("strides", 1), case.norm("dilates", 1)
    padding = case.kwargs.get("padding", "SAME")
    W = ref.dense_filter(case.BCK, blocks, case.transposed)
    subs, ops = ref.conv_terms(x, W, case.TRS, strides, dilates, padding, case.transposed,
                               tuple(conv.MPQ) if case.transposed else None)
    y = np.einsum(subs, *ops)
    image, out = (tuple(conv.MPQ), tuple(case.DHW)) if case.transposed else (tuple(case.DHW), tuple(conv.MPQ))
    pattern, count = ref.edge_patterns(case.TRS, image, out, strides, dilates, padding, case.transposed)
    assert conv.edge_bias_shape() == (conv.K, count if case.kwargs.get("edge_bias") else 0)
    deb = None
    if eb is not None:
        y = ref.add_edge_bias(y, eb, pattern)
        flat = gy.reshape(gy.shape[0], gy.shape[1], -1)
        deb = np.stack([flat[:, :, pattern == p].sum(axis=(0, 2)) for p in range(count)], axis=1) \
            if count else np.zeros((conv.K, 0))
    dx = ref.einsum_grad(subs, ops, gy, len(ops) - 1)
    dW = ref.einsum_grad(subs, ops, gy, 0)
    return y, dx, ref.block_filters(case.BCK, dW, case.transposed), deb


def make(case, module):
    """The op of ``case`` from ``module`` (blocksparse.conv or blocksparse.torch)."""
    cls = module.BlocksparseDeconv if case.transposed else module.BlocksparseConv
    return cls([(list(c), list(k)) for c, k in case.BCK], case.TRS, case.DHW, **case.kwargs)


#: ``(N, error)`` pairs the shape helpers reject, with readable ids.
BAD_MINIBATCH = pytest.mark.parametrize("N, error", [(-1, ValueError), (2.0, TypeError), ("N", TypeError),
                                                     (True, TypeError)], ids=["negative", "float", "str", "bool"])


def assert_results(case, conv, got, want, tol, rel_error):
    """``got`` ``(y, dx, [dF_b] or flat dF, d edge bias)`` against ``want`` from :func:`reference`
    (the edge bias gradient only where the case has edge patterns)."""
    (y, dx, dF, deb), (y_ref, dx_ref, dF_ref, deb_ref) = got, want
    assert tuple(y.shape) == tuple(conv.o_shape(y.shape[0]))
    assert rel_error(y, y_ref) < tol   # NaN (an unwritten output) fails too
    assert rel_error(dx, dx_ref) < tol
    if isinstance(dF, (list, tuple)):
        for d, d_ref in zip(dF, dF_ref):
            assert rel_error(d, d_ref) < tol
    else:
        assert rel_error(dF, np.concatenate([d.ravel() for d in dF_ref])) < tol
    if case.kwargs.get("edge_bias", False) and conv.edge_bias_shape()[1]:
        assert rel_error(deb, deb_ref) < tol


def check_bad_minibatch(module, N, error):
    """``i_shape(N)`` / ``o_shape(N)`` of a convolution and a transposed one from ``module``
    (blocksparse.conv or blocksparse.torch) raise ``error`` naming ``N``."""
    for cls in (module.BlocksparseConv, module.BlocksparseDeconv):
        conv = cls([([0, 1], [0])], (3,), (5,), strides=2)
        for helper in (conv.i_shape, conv.o_shape):
            with pytest.raises(error, match="N"):
                helper(N)
