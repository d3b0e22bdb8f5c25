"""float64 numpy reference of the fused block-sparse attention (no framework import).

Dense attention over the element mask a block layout describes, with the gradients written out
(``P = softmax``, ``dV = P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``).  It shares no code with
the implementations under test: the mask is expanded here with ``np.kron``.
"""
import numpy as np

__all__ = ["attention_grads", "element_mask", "keep_mask"]


def element_mask(layout, block_size):
    """The ``(HL, S, S)`` element mask of a ``(NB, NB)`` or ``(HL, NB, NB)`` block layout."""
    lay = np.asarray(layout) != 0
    lay = lay if lay.ndim == 3 else lay[None]
    ones = np.ones((block_size, block_size), dtype=bool)
    return np.stack([np.kron(h, ones).astype(bool) for h in lay])


def keep_mask(mask, *, causal=False, seqlens=None):
    """``(B or 1, HL, S, S)``: ``mask`` (``(HL, S, S)`` or ``(S, S)``), lower-triangular if ``causal``,
    and per batch element only rows and keys below ``seqlens[b]``."""
    keep = np.asarray(mask, dtype=bool)
    keep = keep if keep.ndim == 3 else keep[None]
    S = keep.shape[-1]
    if causal:
        keep = keep & np.tril(np.ones((S, S), dtype=bool))
    keep = keep[None]
    if seqlens is not None:
        pos = np.arange(S)
        length = np.clip(np.asarray(seqlens), 0, S)[:, None, None, None]
        keep = keep & (pos[None, None, :, None] < length) & (pos[None, None, None, :] < length)
    return keep


def _f64(t):
    if hasattr(t, "detach"):  # torch: any device, any dtype (bfloat16 has no numpy twin)
        t = t.detach().double().cpu()
    return np.asarray(t, dtype=np.float64)


def attention_grads(q, k, v, keep, scale, do=None, o_seen=None):
    """``o`` (and ``dq, dk, dv`` given ``do``) in float64 for ``q (B, HQ, S, D)``, ``k, v (B, HK, S, D)``
    (numpy or torch) and a keep mask broadcastable to ``(B, HQ, S, S)``; rows that keep nothing
    give zeros.  ``o_seen``: the output the backward's ``rowsum(do * o)`` reads (a kernel's, rounded
    to its dtype), where that rounding is not to count as the kernel's error."""
    q, k, v = (_f64(t) for t in (q, k, v))
    B, HQ, S, D = q.shape
    group = HQ // k.shape[1]
    kx, vx = (np.repeat(t, group, axis=1) for t in (k, v))
    keep = np.broadcast_to(keep, (B, HQ, S, S))
    s = np.where(keep, np.einsum("bhqd,bhkd->bhqk", q, kx) * scale, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    o = np.einsum("bhqk,bhkd->bhqd", p, vx)
    if do is None:
        return o
    do = _f64(do)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)
    dp = np.einsum("bhqd,bhkd->bhqk", do, vx)
    ds = p * (dp - (do * (o if o_seen is None else _f64(o_seen))).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bhkd->bhqd", ds, kx) * scale
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q) * scale

    def per_kv_head(t):
        return t.reshape(B, HQ // group, group, S, D).sum(2)

    return o, dq, per_kv_head(dk), per_kv_head(dv)
