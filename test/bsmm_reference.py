"""float64 numpy references for the block-sparse products (no framework import).

They work on the dense ``(C, K)`` matrix the packed blocks describe (``Layout.dense``), so they
share no code with any implementation under test.
"""
import numpy as np

#: Relative-error bounds ``||out - ref|| / ||ref||`` per dtype name.
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def rel_error(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"shape {out.shape} != reference shape {ref.shape}"
    assert np.all(np.isfinite(out)), "non-finite values in the output"
    scale = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (scale if scale > 0 else 1.0)


def dense_products(layout, x, w, dy, axis):
    """``(y, dx, dw)`` of ``y = x @ W`` (axis 1) or ``y = W.T @ x`` (axis 0), in float64."""
    dense = layout.dense(np.asarray(w, dtype=np.float64))
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    if axis == 1:
        return x @ dense, dy @ dense.T, layout.pack(x.T @ dy)
    return dense.T @ x, dense @ dy, layout.pack(x @ dy.T)


def l2_normalize_dense(dense, gain=None, epsilon=1e-6):
    """Every column of the dense matrix divided by ``max(norm, sqrt(epsilon))``, times ``gain``."""
    norm = np.sqrt(np.maximum((dense ** 2).sum(axis=0, keepdims=True), epsilon))
    out = dense / norm
    return out if gain is None else out * gain[None, :]
