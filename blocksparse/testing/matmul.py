"""float64 numpy references of the block-sparse matmul, and random layouts (no framework import;
:func:`check_torch_products` imports torch when called).

The references work on the dense ``(C, K)`` matrix the packed blocks describe (``Layout.dense``),
so they share no code with any implementation under test.
"""
import numpy as np

from .numerics import rel_error, tolerance

__all__ = ["dense_products", "dense_products_torch", "l2_normalize_dense", "random_layout", "check_torch_products"]


def random_layout(rng, CB, KB, density, *, empty_rows=0, empty_cols=0, cover=False):
    """A random 0/1 ``(CB, KB)`` layout with at least one block.

    ``empty_rows`` / ``empty_cols``: that many rows / columns left without blocks; ``cover``:
    every row and every column holds a block (benchmarks: no output is trivially zero).
    """
    while True:
        lay = (rng.random((CB, KB)) < density).astype(np.int32)
        if cover:
            lay[rng.integers(0, CB, KB), np.arange(KB)] = 1
            lay[np.arange(CB), rng.integers(0, KB, CB)] = 1
        if empty_rows:
            lay[rng.choice(CB, empty_rows, replace=False), :] = 0
        if empty_cols:
            lay[:, rng.choice(KB, empty_cols, replace=False)] = 0
        if lay.any():
            return lay


def dense_products(layout, x, w, dy, axis):
    """``(y, dx, dw)`` of ``y = x @ W`` (axis 1) or ``y = W.T @ x`` (axis 0), in float64."""
    dense = layout.dense(np.asarray(w, dtype=np.float64))
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    if axis == 1:
        return x @ dense, dy @ dense.T, layout.pack(x.T @ dy)
    return dense.T @ x, dense @ dy, layout.pack(x @ dy.T)


def dense_products_torch(layout, x, w, dy):
    """:func:`dense_products` (``axis=1``) in float64 on the tensors' device: GPU-sized problems
    would take minutes in numpy.  The dense matrix comes from the layout core."""
    import torch

    dense = torch.from_numpy(layout.dense(w.detach().double().cpu().numpy())).to(x.device)
    x, dy = x.detach().double(), dy.detach().double()
    full = (x.t() @ dy).view(layout.CB, layout.block_size, layout.KB, layout.block_size)
    c, k = (torch.from_numpy(layout.coords[:, i].astype(np.int64)).to(x.device) for i in (0, 1))
    return x @ dense, dy @ dense.t(), full[c, :, k, :]


def l2_normalize_dense(dense, gain=None, epsilon=1e-6):
    """Every column of the dense matrix divided by ``max(norm, sqrt(epsilon))``, times ``gain``."""
    norm = np.sqrt(np.maximum((dense ** 2).sum(axis=0, keepdims=True), epsilon))
    out = dense / norm
    return out if gain is None else out * gain[None, :]


def check_torch_products(bsmm, rng, n, dtype, device="cuda", tol=None):
    """Assert ``y = bsmm(x, w)``, ``dx`` and ``dW`` (one backward) of a PyTorch ``BlocksparseMatMul``
    on fresh random ``dtype`` inputs of ``n`` tokens against float64, within ``tol`` (default: the
    dtype's tolerance); the outputs must come back in ``dtype``."""
    import torch

    def t(a):
        return torch.from_numpy(a).to(dtype=dtype, device=device)

    x = t(rng.standard_normal(bsmm.i_shape(n))).requires_grad_()
    w = t(rng.standard_normal(bsmm.w_shape) / np.sqrt(bsmm.block_size)).requires_grad_()
    dy = t(rng.standard_normal(bsmm.o_shape(n)))
    y = bsmm(x, w)
    y.backward(dy)
    refs = dense_products(bsmm.layout, *(a.detach().double().cpu().numpy() for a in (x, w, dy)), bsmm.axis)
    for name, got, ref in zip(("y", "dx", "dw"), (y, x.grad, w.grad), refs):
        assert got.dtype == dtype, (name, got.dtype)
        assert rel_error(got, ref) < (tol or tolerance(dtype)), name
