"""Independent float64 numpy references of the block-sparse (transposed) convolution, written from
the documented semantics only: per axis, tap ``t`` of output ``q`` reads image position
``q * stride - before + t * dilate`` (zeros outside the image)."""
import string

import numpy as np


def pads(padding, taps, sizes, strides, dilates):
    """``[(before, out)]`` per axis of the forward relation image (``sizes``) -> output."""
    out = []
    for axis, (S, X, s, d) in enumerate(zip(taps, sizes, strides, dilates)):
        ext = (S - 1) * d + 1
        if padding == "SAME":
            before, Q = (ext - 1) // 2, -(-X // s)
        elif padding == "VALID":
            before, Q = 0, (X - ext) // s + 1
        else:
            p = padding[axis] if isinstance(padding, (tuple, list)) else padding
            before, after = (p, p) if isinstance(p, int) else p
            Q = (X + before + after - ext) // s + 1
        out.append((before, Q))
    return out


def tap_matrix(S, X, Q, stride, dilate, before):
    """``A[t, q, x] = 1`` where tap ``t`` of output ``q`` reads image position ``x``."""
    A = np.zeros((S, Q, X))
    for t in range(S):
        for q in range(Q):
            x = q * stride - before + t * dilate
            if 0 <= x < X:
                A[t, q, x] = 1.0
    return A


def dense_filter(BCK, F_blocks, transposed):
    """The dense filter (K, C, *TRS) (conv) or (C, K, *TRS) (deconv) from per-block filters."""
    C = max(max(c) for c, _ in BCK) + 1
    K = max(max(k) for _, k in BCK) + 1
    trs = F_blocks[0].shape[2:]
    W = np.zeros(((C, K) if transposed else (K, C)) + trs)
    for (cs, ks), f in zip(BCK, F_blocks):
        rows, cols = (cs, ks) if transposed else (ks, cs)
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                W[r, c] += f[i, j]
    return W


def conv_terms(x, W, TRS, strides, dilates, padding, transposed=False, MPQ=None):
    """``(subscripts, operands)`` with ``y = einsum(subscripts, *operands)``, operands ``[W, *A, x]``.

    conv: x (N, C, *DHW), W (K, C, *TRS) -> (N, K, *MPQ).  deconv (``transposed``): x (N, C, *DHW),
    W (C, K, *TRS) -> (N, K, *MPQ), the adjoint (in x) of the conv (N, K, *MPQ) -> (N, C, *DHW)."""
    nd = len(TRS)
    taps, outs, ins = "tuv"[:nd], "pqr"[:nd], "hwz"[:nd]
    image = MPQ if transposed else x.shape[2:]
    A = []
    for (before, Q), S, X, s, d in zip(pads(padding, TRS, image, strides, dilates), TRS, image, strides, dilates):
        A.append(tap_matrix(S, X, Q, s, d, before))
    if transposed:  # A[t, d (deconv input), m (deconv output)]
        assert tuple(a.shape[1] for a in A) == tuple(x.shape[2:]), "MPQ does not map back to DHW"
        subs = "ck" + taps + "," + ",".join(f"{t}{i}{o}" for t, o, i in zip(taps, outs, ins))
    else:
        subs = "kc" + taps + "," + ",".join(f"{t}{o}{i}" for t, o, i in zip(taps, outs, ins))
    return subs + ",nc" + ins + "->nk" + outs, [np.asarray(W, np.float64), *A, np.asarray(x, np.float64)]


def conv(x, W, TRS, strides, dilates, padding, transposed=False, MPQ=None):
    subs, ops = conv_terms(x, W, TRS, strides, dilates, padding, transposed, MPQ)
    return np.einsum(subs, *ops)


def block_filters(BCK, W, transposed):
    """Per-block slices of a dense filter (the inverse of ``dense_filter`` for disjoint pairs)."""
    out = []
    for cs, ks in BCK:
        rows, cols = (list(cs), list(ks)) if transposed else (list(ks), list(cs))
        out.append(W[np.ix_(rows, cols)])
    return out


def edge_patterns(TRS, image, out, strides, dilates, padding, transposed):
    """Pattern id per position of the op's output (row-major, -1 = interior), and the count.

    conv: position q's padded taps; deconv: image position x's taps t for which
    (x + before - t * dilate) / stride is a whole number outside the deconv's input."""
    import itertools

    geo = pads(padding, TRS, image, strides, dilates)
    positions = list(itertools.product(*[range(n) for n in (image if transposed else out)]))
    ids, result = {}, []
    for pos in positions:
        padded = []
        for tap in itertools.product(*[range(S) for S in TRS]):
            bad = False
            for a, (t, p) in enumerate(zip(tap, pos)):
                before, Q = geo[a]
                if transposed:
                    j = p + before - t * dilates[a]
                    bad |= j % strides[a] == 0 and not 0 <= j // strides[a] < Q
                else:
                    xx = p * strides[a] - before + t * dilates[a]
                    bad |= not 0 <= xx < image[a]
            if bad:
                padded.append(tap)
        if not padded:
            result.append(-1)
            continue
        result.append(ids.setdefault(tuple(padded), len(ids)))
    return np.array(result), len(ids)


def add_edge_bias(y, eb, pattern):
    """y (N, K, *spatial) + eb[k, pattern(pos)] (float64)."""
    N, K = y.shape[:2]
    flat = y.reshape(N, K, -1).copy()
    for i, p in enumerate(pattern):
        if p >= 0:
            flat[:, :, i] += eb[:, p]
    return flat.reshape(y.shape)


def l2_normalize(F_blocks, ks_list, gain, epsilon, transposed):
    """Per block and output channel: that channel's slice over (Cb, TRS) scaled to unit norm, * gain[k]."""
    out = []
    for f, ks in zip(F_blocks, ks_list):
        f = np.asarray(f, np.float64)
        g = f if not transposed else np.swapaxes(f, 0, 1)   # (Kb, Cb, ...)
        norm = np.sqrt(np.maximum((g.reshape(g.shape[0], -1) ** 2).sum(1), epsilon))
        g = g / norm.reshape((-1,) + (1,) * (g.ndim - 1))
        if gain is not None:
            g = g * np.asarray(gain, np.float64)[list(ks)].reshape((-1,) + (1,) * (g.ndim - 1))
        out.append(g if not transposed else np.swapaxes(g, 0, 1))
    return out


def einsum_grad(subs, operands, G, which):
    """Gradient of sum(G * einsum(subs, *operands)) with respect to operands[which]."""
    ins, out = subs.split("->")
    ins = ins.split(",")
    others = [o for i, o in enumerate(operands) if i != which]
    other_subs = [s for i, s in enumerate(ins) if i != which]
    return np.einsum(",".join(other_subs + [out]) + "->" + ins[which], *others, G)
