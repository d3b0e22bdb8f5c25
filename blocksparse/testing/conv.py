"""float64 numpy references of the block-sparse convolution (no framework import).

Written from the definitions, sharing no code with the implementations under test: a dense filter
that is zero outside the blocks, correlation and its adjoint as loops over the filter taps, edge
patterns found position by position, weight normalisation segment by segment.

A case is described by :class:`Case`; ``out`` is the output spatial size the op under test reports
(``o_shape``), checked separately against hand-computed sizes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

__all__ = ["CASES", "Case", "case_of", "conv_products", "join_filter", "l2_normalize_products", "layout_bck",
           "make_op", "random_bck", "random_inputs", "split_filter"]


@dataclass(frozen=True)
class Case:
    """One block-sparse (transposed) convolution.  ``padding``: ``"SAME"``, ``"VALID"`` or
    ``(before, after)`` per axis; ``out``: output spatial size."""

    BCK: tuple
    TRS: tuple
    strides: tuple
    dilates: tuple
    padding: object
    out: tuple
    transposed: bool = False

    @property
    def C(self):
        return 1 + max(max(c) for c, _ in self.BCK)

    @property
    def K(self):
        return 1 + max(max(k) for _, k in self.BCK)

    def block_shape(self, b):
        c, k = self.BCK[b]
        return ((len(c), len(k)) if self.transposed else (len(k), len(c))) + tuple(self.TRS)

    def pad_before(self):
        if self.padding == "SAME":
            return tuple(((s - 1) * d) // 2 for s, d in zip(self.TRS, self.dilates))
        if self.padding == "VALID":
            return (0,) * len(self.TRS)
        return tuple(p[0] for p in self.padding)


def random_bck(rng, C, K, blocks, cmax, kmax, cmin=1, kmin=1):
    """``blocks`` random blocks with arbitrary (non-contiguous, shuffled) channels and sizes in
    ``[cmin, cmax] x [kmin, kmax]``; no (c, k) pair twice."""
    taken = np.zeros((C, K), dtype=bool)
    bck = []
    while len(bck) < blocks:
        c = rng.choice(C, rng.integers(cmin, cmax + 1), replace=False)
        k = rng.choice(K, rng.integers(kmin, kmax + 1), replace=False)
        if not taken[np.ix_(c, k)].any():
            taken[np.ix_(c, k)] = True
            bck.append((c.tolist(), k.tolist()))
    return bck


def split_filter(case, F):
    """The per-block filters of a flat or stacked ``F``."""
    F = np.asarray(F, dtype=np.float64)
    if F.ndim > 1:
        return [F[b] for b in range(F.shape[0])]
    out, start = [], 0
    for b in range(len(case.BCK)):
        size = int(np.prod(case.block_shape(b)))
        out.append(F[start:start + size].reshape(case.block_shape(b)))
        start += size
    return out


def join_filter(blocks, like):
    """Per-block arrays as one array shaped like ``like`` (flat or stacked)."""
    if np.ndim(like) > 1:
        return np.stack(blocks)
    return np.concatenate([np.ravel(b) for b in blocks])


def _dense(case, blocks):
    """``W[k, c, taps...]``: the filter from input channel ``c`` to output channel ``k``."""
    W = np.zeros((case.K, case.C) + tuple(case.TRS))
    for (cs, ks), f in zip(case.BCK, blocks):
        kc = f.transpose(1, 0, *range(2, f.ndim)) if case.transposed else f
        W[np.ix_(ks, cs)] = kc
    return W


def _pack(case, dW):
    out = []
    for cs, ks in case.BCK:
        f = dW[np.ix_(ks, cs)]
        out.append(f.transpose(1, 0, *range(2, f.ndim)) if case.transposed else f)
    return out


def _frame(case, q_size, image_size):
    """Slices of the padded image frame read by every tap, and the frame's size."""
    before = case.pad_before()
    size = [max(b + x, (q - 1) * s + (t - 1) * d + 1)
            for b, x, q, s, t, d in zip(before, image_size, q_size, case.strides, case.TRS, case.dilates)]
    taps = []
    for tap in itertools.product(*(range(t) for t in case.TRS)):
        taps.append((tap, tuple(slice(t * d, t * d + (q - 1) * s + 1, s)
                                for t, d, q, s in zip(tap, case.dilates, q_size, case.strides))))
    inner = tuple(slice(b, b + x) for b, x in zip(before, image_size))
    return taps, size, inner


def _correlate(case, image, W, q_size):
    """``out[n, k, q] = sum_{c, t} W[k, c, t] * padded_image[n, c, q * s + t * d]``."""
    taps, size, inner = _frame(case, q_size, image.shape[2:])
    frame = np.zeros(image.shape[:2] + tuple(size))
    frame[(slice(None), slice(None)) + inner] = image
    out = np.zeros((image.shape[0], W.shape[0]) + tuple(q_size))
    for tap, window in taps:
        out += np.einsum("kc,nc...->nk...", W[(slice(None), slice(None)) + tap],
                         frame[(slice(None), slice(None)) + window], optimize=True)
    return out


def _scatter(case, out_side, W, image_size):
    """The adjoint of :func:`_correlate`: ``image[n, c, q * s + t * d] += W[k, c, t] * out[n, k, q]``."""
    q_size = out_side.shape[2:]
    taps, size, inner = _frame(case, q_size, image_size)
    frame = np.zeros((out_side.shape[0], W.shape[1]) + tuple(size))
    for tap, window in taps:
        frame[(slice(None), slice(None)) + window] += np.einsum(
            "kc,nk...->nc...", W[(slice(None), slice(None)) + tap], out_side, optimize=True)
    return frame[(slice(None), slice(None)) + inner]


def _filter_grad(case, image, out_side):
    """``dW[k, c, t] = sum_{n, q} out[n, k, q] * padded_image[n, c, q * s + t * d]``."""
    taps, size, inner = _frame(case, out_side.shape[2:], image.shape[2:])
    frame = np.zeros(image.shape[:2] + tuple(size))
    frame[(slice(None), slice(None)) + inner] = image
    dW = np.zeros((out_side.shape[1], image.shape[1]) + tuple(case.TRS))
    summed = [0, *range(2, out_side.ndim)]  # the minibatch and the output positions
    for tap, window in taps:
        dW[(slice(None), slice(None)) + tap] = np.tensordot(
            out_side, frame[(slice(None), slice(None)) + window], axes=(summed, summed))
    return dW


def edge_patterns(case, in_size):
    """``(patterns, E)``: each output position's edge pattern (row-major), ``-1`` for none."""
    before = case.pad_before()
    out_size = case.out
    found, patterns = {}, []
    for pos in itertools.product(*(range(n) for n in out_size)):
        padded = []
        for tap in itertools.product(*(range(t) for t in case.TRS)):
            hits = []
            for p, t, s, d, b, n in zip(pos, tap, case.strides, case.dilates, before, in_size):
                if case.transposed:  # output p comes from input (p + b - t d) / s, if whole
                    j = p + b - t * d
                    hits.append(j % s == 0 and not 0 <= j // s < n)
                else:
                    hits.append(not 0 <= p * s - b + t * d < n)
            if any(hits):
                padded.append(tap)
        patterns.append(found.setdefault(tuple(padded), len(found)) if padded else -1)
    return np.array(patterns), len(found)


def conv_products(case, F, x, dy, edge_bias=None):
    """``(y, dx, dF, d_edge_bias)`` in float64 for output gradient ``dy``.

    ``F``: flat or stacked filter (``dF`` comes back the same way); ``x``: ``(N, C) + in_size``;
    ``edge_bias``: ``(K, E)`` or None (then ``d_edge_bias`` is None).
    """
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    W = _dense(case, split_filter(case, F))
    in_size = x.shape[2:]
    if case.transposed:
        y = _scatter(case, x, W.transpose(1, 0, *range(2, W.ndim)), case.out)
        dx = _correlate(case, dy, W.transpose(1, 0, *range(2, W.ndim)), in_size)
        dW = _filter_grad(case, dy, x).transpose(1, 0, *range(2, W.ndim))
    else:
        y = _correlate(case, x, W, case.out)
        dx = _scatter(case, dy, W, in_size)
        dW = _filter_grad(case, x, dy)
    y, deb = np.ascontiguousarray(y), None
    if edge_bias is not None:
        patterns, count = edge_patterns(case, in_size)
        edge_bias = np.asarray(edge_bias, dtype=np.float64)
        assert edge_bias.shape == (case.K, count), (edge_bias.shape, count)
        flat_y, flat_dy = y.reshape(y.shape[:2] + (-1,)), dy.reshape(dy.shape[:2] + (-1,))
        deb = np.zeros((case.K, count))
        for pos, e in enumerate(patterns):
            if e >= 0:
                flat_y[:, :, pos] += edge_bias[:, e]
                deb[:, e] += flat_dy[:, :, pos].sum(axis=0)
    return y, dx, join_filter(_pack(case, dW), F), deb


def l2_normalize_products(case, F, dout, gain=None, epsilon=1e-6):
    """``(out, dF, dgain)``: each block's filter divided, per output channel ``k`` of the block, by
    ``sqrt(max(sum of its squares, epsilon))`` and times ``gain[k]``; gradients for ``dout``."""
    blocks, grads = split_filter(case, F), split_filter(case, dout)
    outs, dFs = [], []
    dgain = None if gain is None else np.zeros(case.K)
    for (cs, ks), f, g in zip(case.BCK, blocks, grads):
        axis = 1 if case.transposed else 0  # the block's output-channel axis
        f, g = np.moveaxis(f, axis, 0), np.moveaxis(g, axis, 0)
        o, d = np.empty_like(f), np.empty_like(f)
        for i, k in enumerate(ks):
            ss = np.sum(f[i] ** 2)
            norm = np.sqrt(max(ss, epsilon))
            scale = 1.0 if gain is None else float(gain[k])
            o[i] = scale * f[i] / norm
            inner = np.sum(g[i] * f[i])
            d[i] = scale * (g[i] - (f[i] * inner / ss if ss >= epsilon else 0.0)) / norm
            if gain is not None:
                dgain[k] += inner / norm
        outs.append(np.moveaxis(o, 0, axis))
        dFs.append(np.moveaxis(d, 0, axis))
    return join_filter(outs, F), join_filter(dFs, F), dgain


#: Spatial settings both frontends' tests run (small sizes; ids say what each covers).
CASES = {
    "1d-same-s2": dict(TRS=(3,), DHW=(9,), strides=2, dilates=1, padding="SAME"),
    "2d-same-stride-dilate": dict(TRS=(3, 3), DHW=(6, 5), strides=(2, 1), dilates=(1, 2), padding="SAME"),
    "2d-same-even-filter": dict(TRS=(2, 3), DHW=(5, 4), strides=1, dilates=1, padding="SAME"),
    "2d-valid-stride-dilate": dict(TRS=(3, 2), DHW=(7, 6), strides=2, dilates=(2, 1), padding="VALID"),
    "2d-explicit-asymmetric": dict(TRS=(3, 3), DHW=(5, 6), strides=(2, 1), dilates=1, padding=((2, 0), 1)),
    "3d-same": dict(TRS=(2, 2, 3), DHW=(3, 4, 4), strides=(1, 2, 1), dilates=(2, 1, 1), padding="SAME"),
    "original-3tuple-1d": dict(TRS=(1, 1, 3), DHW=(1, 1, 8), strides=(1, 1, 2), dilates=(1, 1, 1), padding="SAME"),
}


def layout_bck(rng, kind):
    """A test layout: ``"random"`` (unequal blocks of shuffled, non-contiguous channels) or
    ``"uniform"`` (equal blocks, two of them sharing their outputs, one output channel unused)."""
    if kind == "random":
        return random_bck(rng, 7, 6, 4, 3, 3)
    return [([0, 1, 2], [3, 4]), ([3, 4, 5], [3, 4]), ([6, 2, 0], [0, 1]), ([3, 4, 5], [6, 5])]


def case_of(op, BCK, padding, transposed):
    """The :class:`Case` of a frontend op built from ``BCK`` and ``padding``."""
    pad = padding if isinstance(padding, str) else tuple(op.padding)
    return Case(tuple(BCK), op.TRS, op.strides, op.dilates, pad, tuple(op.MPQ), transposed)


def make_op(cls, rng, case, layout="random", edge_bias=True, **extra):
    """``(op, Case)``: ``cls`` (a frontend's ``BlocksparseConv`` / ``BlocksparseDeconv``) built on
    :data:`CASES` ``[case]`` (``extra`` overrides) and a :func:`layout_bck` layout."""
    bck = layout_bck(rng, layout)
    args = dict(CASES[case], **extra)
    op = cls(bck, edge_bias=edge_bias, **args)
    return op, case_of(op, bck, args["padding"], op.spec.transposed)


def random_inputs(rng, op, N=2):
    """float32 ``(F, x, dy, edge_bias)`` for an op (``edge_bias`` None without one)."""
    draw = lambda shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    eb = draw(op.edge_bias_shape()) if op.spec.edge_bias else None
    return draw(op.f_shape()), draw(op.i_shape(N)), draw(op.o_shape(N)), eb
