"""Helpers of the PyTorch acceptance tests: float64 numpy references written from the documented
formulas, and the comparison every test makes (relative error against the dtype's tolerance)."""
import copy
import io
import pickle

import numpy as np
import torch

from blocksparse.testing import rel_error, tolerance

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def f64(t):
    """A tensor's values (whatever its dtype or strides) as a float64 numpy array."""
    return t.detach().to(torch.float64).cpu().numpy()


def close(out, ref, dtype, roundings=1):
    """Assert ``out`` (tensor) matches the float64 ``ref`` within ``dtype``'s tolerance, times
    ``roundings`` where ``out`` comes from that many products chained in ``dtype`` (each rounded)."""
    err, tol = rel_error(out, ref), roundings * tolerance(dtype)
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g} ({dtype}, {roundings} rounding(s))"


def coarser(*dtypes):
    """The dtype of ``dtypes`` with the loosest tolerance (a result computed from all of them)."""
    return max(dtypes, key=tolerance)


def draw(rng, shape, dtype, requires_grad=False):
    """Standard-normal values of ``shape`` as a tensor of ``dtype``."""
    t = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    return t.requires_grad_(requires_grad)


def dense_weight(mask, w, block_size):
    """The dense ``(C, K)`` matrix of packed blocks ``w`` ``(blocks, bs, bs)``: block ``b`` is the
    ``b``-th nonzero of ``mask`` in row-major order (``coords``: the same order, given)."""
    mask = np.asarray(mask)
    coords = np.argwhere(mask)
    bs = block_size
    dense = np.zeros((mask.shape[0] * bs, mask.shape[1] * bs))
    for b, (c, k) in enumerate(coords):
        dense[c * bs:(c + 1) * bs, k * bs:(k + 1) * bs] = w[b]
    return dense


def dense_from_coords(coords, w, block_size, C, K):
    """As :func:`dense_weight`, block ``b`` at ``coords[b] = (c, k)`` (any block order)."""
    bs = block_size
    dense = np.zeros((C, K))
    for b, (c, k) in enumerate(coords):
        dense[c * bs:(c + 1) * bs, k * bs:(k + 1) * bs] = w[b]
    return dense


def block_grads(coords, x, dy, block_size):
    """``dW[b] = x[:, c-block].T @ dy[:, k-block]`` for ``x`` ``(N, C)``, ``dy`` ``(N, K)``."""
    bs = block_size
    return np.stack([x[:, c * bs:(c + 1) * bs].T @ dy[:, k * bs:(k + 1) * bs] for c, k in coords]) \
        if len(coords) else np.zeros((0, bs, bs))


def clone(module, how):
    """A copy of ``module`` made as a user would: ``"deepcopy"``, ``"pickle"`` or ``"torch.save"`` (and load)."""
    if how == "deepcopy":
        return copy.deepcopy(module)
    if how == "pickle":
        return pickle.loads(pickle.dumps(module))
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)
