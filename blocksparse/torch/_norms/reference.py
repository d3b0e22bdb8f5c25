"""The reference path of layer norm: PyTorch ops only, float32 accumulation (float64 stays float64).

It serves CPU tensors, float64 and anything the Triton kernels cannot run, with the kernels'
interface: statistics ``(segments, N)``, gradients in the parameters' dtypes.
"""
import torch


def stats_dtype(dtype):
    """dtype of ``mean`` / ``rstd`` (and of the accumulation) for activations of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped(t, axis, segments, dtype):
    """Activations of either layout as ``(N, segments, features per segment)`` in ``dtype``."""
    if axis == 1:
        return t.reshape(t.shape[0], segments, t.shape[1] // segments).to(dtype)
    return t.reshape(segments, t.shape[0] // segments, t.shape[1]).permute(2, 0, 1).to(dtype)


def _ungrouped(t, axis, dtype):
    """Inverse of :func:`_grouped` (a fresh contiguous tensor)."""
    n, c = t.shape[0], t.shape[1] * t.shape[2]
    if axis == 1:
        return t.reshape(n, c).to(dtype).contiguous()
    return t.permute(1, 2, 0).reshape(c, n).to(dtype).contiguous()


def _param(p, segments, dtype):
    return None if p is None else p.reshape(segments, -1).to(dtype)


def _affine(xhat, g, b):
    y = xhat if g is None else xhat * g
    return y if b is None else y + b


def layer_norm_fwd(x, g, b, *, axis, epsilon, relu, segments):
    """``(y, mean, rstd)``; see :func:`blocksparse.torch.layer_norm`."""
    acc = stats_dtype(x.dtype)
    xs = _grouped(x, axis, segments, acc)
    mean = xs.mean(-1)
    mean = mean + (xs - mean[..., None]).mean(-1)  # exact for constant rows (the first mean can be an ulp off)
    xc = xs - mean[..., None]
    rstd = torch.rsqrt((xc * xc).mean(-1) + epsilon)
    y = _affine(xc * rstd[..., None], _param(g, segments, acc), _param(b, segments, acc))
    if relu:
        y = torch.relu(y)
    return _ungrouped(y, axis, x.dtype), mean.t().contiguous(), rstd.t().contiguous()


def layer_norm_bwd(dy, x, g, b, mean, rstd, *, axis, relu, segments):
    """``(dx, dg, db)`` (None for an absent parameter) from the forward's statistics."""
    acc = stats_dtype(x.dtype)
    mean, rstd = mean.t()[..., None].to(acc), rstd.t()[..., None].to(acc)
    xhat = (_grouped(x, axis, segments, acc) - mean) * rstd
    dys = _grouped(dy, axis, segments, acc)
    gs, bs = _param(g, segments, acc), _param(b, segments, acc)
    if relu:
        dys = dys * (_affine(xhat, gs, bs) > 0)
    dxhat = dys if gs is None else dys * gs
    dx = (dxhat - xhat * (xhat * dxhat).mean(-1, keepdim=True) - dxhat.mean(-1, keepdim=True)) * rstd
    dg = None if g is None else (dys * xhat).sum(0).reshape(-1).to(g.dtype)
    db = None if b is None else dys.sum(0).reshape(-1).to(b.dtype)
    return _ungrouped(dx, axis, x.dtype), dg, db
