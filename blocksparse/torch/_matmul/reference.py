"""The reference path: the three products with PyTorch ops only (index_select / einsum / index_add).

It serves CPU tensors, block size 8, and anything the Triton kernels cannot run; it is also the
oracle the kernels are tested against.  Accumulates in float32 (float64 stays float64).
"""
import torch

from .._checks import autocast_free


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _blocks(t, axis, bs):
    """View activations as (N, feature_blocks, bs) whatever their layout (N may be 0: no -1 sizes)."""
    blocks = t.shape[axis] // bs
    if axis == 1:
        return t.reshape(t.shape[0], blocks, bs)
    return t.reshape(blocks, bs, t.shape[1]).permute(2, 0, 1)


def _unblocks(t, axis):
    """Inverse of :func:`_blocks` for a fresh (N, blocks, bs) result."""
    flat = t.reshape(t.shape[0], t.shape[1] * t.shape[2])
    return flat if axis == 1 else flat.t().contiguous()


def unpacked(w, pack):
    """The ``(blocks, bs, bs)`` blocks of a weight stored with packing ``pack``
    (:attr:`blocksparse.layout.Layout.packing`)."""
    if pack == 1:
        return w
    bs = w.shape[1] // pack
    return w.reshape(-1, pack, bs, pack, bs).transpose(2, 3).reshape(-1, bs, bs)


def packed(w, pack):
    """Inverse of :func:`unpacked`."""
    if pack == 1:
        return w
    bs = w.shape[1]
    return w.reshape(-1, pack, pack, bs, bs).transpose(2, 3).reshape(-1, pack * bs, pack * bs)


@autocast_free
def xprop(x, w, inp_idx, out_idx, out_blocks, bs, axis, trans, pack=1, bias=None):
    """``y[:, out] += x[:, inp] @ w[b]`` (``w[b].T`` if ``trans``) for every block ``b`` (plus ``bias`` per
    output feature, before the rounding to ``x``'s dtype)."""
    w = unpacked(w, pack)
    acc = _acc_dtype(x.dtype)
    xb = _blocks(x, axis, bs).index_select(1, inp_idx).to(acc)      # (N, blocks, bs)
    eq = "nbk,bjk->nbj" if trans else "nbj,bjk->nbk"
    contrib = torch.einsum(eq, xb, w.to(acc))                          # (N, blocks, bs)
    y = _unblocks(contrib.new_zeros((xb.shape[0], out_blocks, bs)).index_add_(1, out_idx, contrib), axis)
    if bias is not None:  # (in x's dtype first, as the kernels and nn.Linear under autocast take it)
        b = bias.to(x.dtype).to(acc)
        y = y + (b if axis == 1 else b[:, None])
    return y.to(x.dtype)


@autocast_free
def updat(x, dy, c_idx, k_idx, bs, axis, dw_dtype, pack=1):
    """``dw[b] = x[:, c_b].T @ dy[:, k_b]`` for every block ``b`` (stored with packing ``pack``)."""
    acc = _acc_dtype(x.dtype)
    xb = _blocks(x, axis, bs).index_select(1, c_idx).to(acc)
    db = _blocks(dy, axis, bs).index_select(1, k_idx).to(acc)
    return packed(torch.einsum("nbi,nbj->bij", xb, db).to(dw_dtype), pack)
