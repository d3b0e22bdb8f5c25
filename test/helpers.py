"""Small helpers shared by the tests (import as ``from helpers import ...``)."""
import numpy as np


def random_layout(rng, CB, KB, density, *, empty_rows=0, empty_cols=0):
    """A random 0/1 layout with at least one block and the requested number of empty rows/cols."""
    while True:
        lay = (rng.random((CB, KB)) < density).astype(np.int32)
        if empty_rows:
            lay[rng.choice(CB, empty_rows, replace=False), :] = 0
        if empty_cols:
            lay[:, rng.choice(KB, empty_cols, replace=False)] = 0
        if lay.any():
            return lay


def as_tokens_major(a, axis):
    """(N, F) view of activations stored (N, F) (axis 1) or (F, N) (axis 0), as float64."""
    a = np.asarray(a, dtype=np.float64)
    return a if axis == 1 else a.T


def products(layout, x, w, dy, axis):
    """(y, dx, dw) in float64, activations returned in their stored layout."""
    W = layout.dense(np.asarray(w, dtype=np.float64))
    xt, dyt = as_tokens_major(x, axis), as_tokens_major(dy, axis)
    y, dx = xt @ W, dyt @ W.T
    dw = layout.pack(xt.T @ dyt)
    if axis == 0:
        y, dx = y.T, dx.T
    return y, dx, dw


def rel_err(got, ref):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all(), "non-finite values (unwritten output?)"
    return np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)


#: Relative-error bounds per dtype name (float32 kernels use exact fp32 unless tf32 is allowed).
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 3e-3, "bfloat16": 2e-2}
