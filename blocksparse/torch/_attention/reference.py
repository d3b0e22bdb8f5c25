"""The reference path of the fused attention: dense attention with the layout's element mask, in
PyTorch ops only.

It serves CPU tensors, float32 / float64 and anything the kernels cannot run; it materialises the
``(B, HQ, S, S)`` scores, so it is meant for moderate sequence lengths.  Computes in float32
(float64 stays float64); ``lse`` is in base-2 units like the kernels'.  Rows that attend to
nothing give zeros, never NaN.  Positions past a ragged batch's lengths are zeroed before the
products, as the kernels never read them: padding that holds NaN or inf (an uninitialised buffer)
does not reach the rows that are in.
"""
import math

import torch

from .._checks import autocast_free

LN2 = math.log(2.0)


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _expand_kv(t, group):
    """Key/value heads repeated for the query heads that share them (GQA)."""
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _keep(mask, seqlens, B, S):
    """(B or 1, HL, S, S) keep mask: the layout's, and a ragged batch's lengths (rows and keys)."""
    keep = mask[None]
    if seqlens is not None:
        pos = torch.arange(S, device=mask.device)
        length = seqlens.to(mask.device).long().clamp(0, S)[:, None, None, None]
        keep = keep & (pos[None, None, :, None] < length) & (pos[None, None, None, :] < length)
    return keep


def _inside(t, seqlens):
    """``t`` (B, H, S, D) with the rows past each batch element's length zeroed (no lengths: ``t``)."""
    if seqlens is None:
        return t
    pos = torch.arange(t.shape[2], device=t.device)
    length = seqlens.to(t.device).long()[:, None, None, None]
    return torch.where(pos[None, None, :, None] < length, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _probs(q, k, mask, seqlens, scale):
    """Softmax probabilities (B, HQ, S, S) and log-sum-exp (base 2) in the accumulation dtype."""
    acc = _acc(q.dtype)
    B, HQ, S, _ = q.shape
    k = _expand_kv(k, HQ // k.shape[1]).to(acc)
    s = torch.matmul(q.to(acc), k.transpose(-1, -2)) * scale
    keep = _keep(mask, seqlens, B, S)
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    empty = total == 0
    p = p / torch.where(empty, torch.ones_like(total), total)
    lse = torch.where(empty, torch.full_like(total, float("-inf")), m + torch.log(total)) / LN2
    return p, lse.squeeze(-1).float()


@autocast_free
def forward(q, k, v, mask, seqlens, scale):
    """``(o, lse)`` of attention with the keep mask ``mask`` (HL, S, S) (HL 1 or HQ)."""
    q, k, v = (_inside(t, seqlens) for t in (q, k, v))
    p, lse = _probs(q, k, mask, seqlens, scale)
    v = _expand_kv(v, q.shape[1] // v.shape[1]).to(p.dtype)
    return torch.matmul(p, v).to(q.dtype), lse


@autocast_free
def backward(do, q, k, v, o, mask, seqlens, scale):
    """``(dq, dk, dv)`` given the output gradient ``do``."""
    B, HQ, S, D = q.shape
    HK = k.shape[1]
    group = HQ // HK
    do, q, k, v, o = (_inside(t, seqlens) for t in (do, q, k, v, o))
    p, _ = _probs(q, k, mask, seqlens, scale)
    acc = p.dtype
    do_, o_, q_ = do.to(acc), o.to(acc), q.to(acc)
    k_, v_ = (_expand_kv(t, group).to(acc) for t in (k, v))
    dv = torch.matmul(p.transpose(-1, -2), do_)
    dp = torch.matmul(do_, v_.transpose(-1, -2))
    ds = p * (dp - (o_ * do_).sum(-1, keepdim=True))
    dq = torch.matmul(ds, k_) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q_) * scale

    def per_kv_head(t):
        return t.reshape(B, HK, group, S, D).sum(2)

    return dq.to(q.dtype), per_kv_head(dk).to(k.dtype), per_kv_head(dv).to(v.dtype)
