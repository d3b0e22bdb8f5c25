"""The reference path: the transformer ops with PyTorch ops only (index_select / einsum / index_add /
scatter_reduce).  It serves CPU tensors, block size 8, float64, and anything the Triton kernels
cannot run; it is also what the kernels are checked against.  Nothing ``ctx_q x ctx_k`` is ever
made: the largest intermediate is one row of ``bs x head_dim`` per block.  Accumulates in float32
(float64 stays float64).

Blocks are addressed by flat ids over ``(heads, blocks)``: ``q_ids = h * QB + q`` and
``k_ids = h * KB + k`` (:meth:`.state._State.flat_ids`).
"""
import torch

from .._checks import autocast_free


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _blocked(t, heads, bs):
    """``(N, T, H*D) -> (N, H * T/bs, bs, D)``: position blocks of every head, head-major."""
    n, ctx, features = t.shape
    return (t.reshape(n, ctx // bs, bs, heads, features // heads).permute(0, 3, 1, 2, 4)
            .reshape(n, heads * (ctx // bs), bs, features // heads))


def _unblocked(t, heads):
    """Inverse of :func:`_blocked`."""
    n, hb, bs, d = t.shape
    return t.reshape(n, heads, hb // heads, bs, d).permute(0, 2, 3, 1, 4).reshape(n, hb // heads * bs, heads * d)


@autocast_free
def nt(a, b, q_ids, k_ids, heads, bs):
    """Packed scores ``(N, H, blocks, bs, bs)``: ``a``'s query block times ``b``'s key block, transposed."""
    acc = _acc_dtype(a.dtype)
    qa = _blocked(a, heads, bs).index_select(1, q_ids).to(acc)
    kb = _blocked(b, heads, bs).index_select(1, k_ids).to(acc)
    scores = torch.einsum("nbid,nbjd->nbij", qa, kb)
    return scores.reshape(a.shape[0], heads, q_ids.numel() // heads, bs, bs).to(a.dtype)


@autocast_free
def xn(w, x, gather_ids, scatter_ids, out_blocks, heads, bs, trans):
    """``nn`` (``w[b] @ x[gather]`` summed into ``scatter``) or ``tn`` (``w[b].T``, ``trans=True``)."""
    acc = _acc_dtype(x.dtype)
    xb = _blocked(x, heads, bs).index_select(1, gather_ids).to(acc)
    wb = w.reshape(w.shape[0], w.shape[1] * w.shape[2], bs, bs).to(acc)
    contrib = torch.einsum("nbji,nbjd->nbid" if trans else "nbij,nbjd->nbid", wb, xb)
    out = contrib.new_zeros(x.shape[0], heads * out_blocks, bs, xb.shape[-1]).index_add_(1, scatter_ids, contrib)
    return _unblocked(out, heads).to(x.dtype)


def _row_sum(t, q_ids, rows):
    """Per block, the sum over its query row's blocks of ``t`` (``(N, H*blocks, bs)``)."""
    total = t.new_zeros(t.shape[0], rows, t.shape[2]).index_add_(1, q_ids, t)
    return total.index_select(1, q_ids)


@autocast_free
def softmax(x, q_ids, keep, scale, rows, dtype):
    """Masked softmax of packed ``x`` along each query row; ``keep``: None or
    ``(H*blocks, bs, bs)`` booleans; ``rows``: ``H * QB``."""
    n, heads, blocks, bs, _ = x.shape
    s = x.reshape(n, heads * blocks, bs, bs).to(_acc_dtype(x.dtype)) * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    row_max = s.new_full((n, rows, bs), float("-inf"))
    row_max.scatter_reduce_(1, q_ids[None, :, None].expand(n, -1, bs), s.amax(dim=-1), "amax")
    shift = row_max.index_select(1, q_ids)
    shift = torch.where(shift == float("-inf"), 0.0, shift)  # nothing kept in the row: exp gives 0
    e = torch.exp(s - shift[..., None])
    total = _row_sum(e.sum(dim=-1), q_ids, rows)[..., None]
    # a row that keeps nothing: 0; a NaN sum (an inf or NaN score kept) stays NaN, as torch.softmax gives
    y = torch.where(total == 0, 0.0, e / total.clamp_min(torch.finfo(e.dtype).tiny))
    # contiguous whatever x's strides, as the kernels' outputs (and the ops' fake functions)
    return y.reshape(x.shape).to(dtype).contiguous()


@autocast_free
def softmax_grad(dy, y, q_ids, scale, rows, dtype):
    """``(dy - sum_row(dy * y)) * y * scale`` on packed tensors."""
    n, heads, blocks, bs, _ = y.shape
    acc = _acc_dtype(y.dtype)
    dy32 = dy.reshape(n, heads * blocks, bs, bs).to(acc)
    y32 = y.reshape(n, heads * blocks, bs, bs).to(acc)
    dot = _row_sum((dy32 * y32).sum(dim=-1), q_ids, rows)
    return ((dy32 - dot[..., None]) * y32 * scale).reshape(y.shape).to(dtype).contiguous()
