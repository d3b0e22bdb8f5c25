"""Weight helpers of the PyTorch ``BlocksparseMatMul``: initializers and weight normalisation,
the counterparts of the TensorFlow object's ``ortho_init`` / ``identity_init`` / ``l2_normalize``."""
from __future__ import annotations

import torch

from .._checks import float_dtype

__all__ = ["Initializer", "l2_normalize"]


class Initializer:
    """``init(shape=None, dtype=torch.float32, device=None)`` -> a new ``w_shape`` tensor whose
    values numpy computes (``make()``, once per call; seeded by ``np.random.seed`` where random)."""

    def __init__(self, make, w_shape, name):
        self._make = make
        self.w_shape = tuple(w_shape)
        self.name = name

    def __repr__(self):
        return f"{self.name}(w_shape={self.w_shape})"

    def __call__(self, shape=None, dtype=torch.float32, device=None):
        if shape is not None and tuple(shape) != self.w_shape:
            raise ValueError(f"{self.name}: shape must be the layout's w_shape {self.w_shape}; got {tuple(shape)}")
        dtype = float_dtype(f"{self.name}: dtype", dtype)
        return torch.from_numpy(self._make()).to(device=device, dtype=dtype)


def l2_normalize(w, coords, kb, gain, epsilon, dtype):
    """``w[b, :, j] / sqrt(max(sum of squares of output feature k*bs + j over the blocks of layout
    column k, epsilon))``, times ``gain[k*bs + j]``; float32 math (float64 stays float64), as
    ``dtype``; differentiable in ``w`` and ``gain``.  ``coords``: the layout's block columns
    (an int64 tensor on ``w``'s device); ``kb``: the layout's column count."""
    work = torch.float64 if w.dtype == torch.float64 else torch.float32
    w = w.to(work)
    sum_sq = w.new_zeros(kb, w.shape[-1]).index_add(0, coords, (w * w).sum(1))
    scale = sum_sq.clamp_min(epsilon).rsqrt()
    if gain is not None:
        scale = scale * gain.to(work).reshape(kb, w.shape[-1])
    return (w * scale.index_select(0, coords)[:, None, :]).to(dtype)
