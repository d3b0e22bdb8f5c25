"""What both frontends' ``BlocksparseMatMul`` share: argument checks and shape helpers (no
framework import)."""
import numbers

import numpy as np

from ._checks import check_minibatch

__all__ = ["check_feature_axis", "LayoutShapes"]


def check_feature_axis(feature_axis):
    """``feature_axis`` as an int after checking it is 0 or 1."""
    if isinstance(feature_axis, bool) or not isinstance(feature_axis, numbers.Integral):
        raise TypeError(f"feature_axis must be an int, 0 or 1; got {feature_axis!r}")
    if feature_axis not in (0, 1):
        raise ValueError(f"feature_axis must be 0 (activations (C, N)) or 1 (activations "
                         f"(N, C)); got {feature_axis}")
    return int(feature_axis)


class LayoutShapes:
    """Shape helpers of a product over ``self.layout`` with activations on ``self.axis``."""

    def i_shape(self, N):
        """Shape of the input activations for minibatch ``N`` (``None`` allowed)."""
        N = check_minibatch(N)
        return (N, self.layout.C) if self.axis else (self.layout.C, N)

    def o_shape(self, N):
        """Shape of the output activations for minibatch ``N`` (``None`` allowed)."""
        N = check_minibatch(N)
        return (N, self.layout.K) if self.axis else (self.layout.K, N)

    def block_coord(self, block):
        """Layout coordinate ``(c, k)`` of block id ``block`` (an int in ``[0, blocks)``)."""
        return self.layout.block_coord(block)

    @property
    def updat_list(self):
        """The layout coordinate ``(c, k)`` of every block, in block order (the packed weight's)."""
        return [(int(c), int(k)) for c, k in self.layout.coords]

    # numpy float64 versions of the products (the original's test helpers): references, not fast paths
    def fprop_test(self, I, W, gate=None):
        """``I`` times the layout's dense matrix (``W``'s blocks, each times ``gate[block]`` if given):
        ``(N, K)`` for ``feature_axis=1``, ``(K, N)`` for 0."""
        dense = self._dense_test(W, gate)
        I = self._activations(I, "I", self.layout.C)
        return I @ dense if self.axis else dense.T @ I

    def bprop_test(self, E, W, gate=None):
        """The input gradient of :meth:`fprop_test` for output gradient ``E``."""
        dense = self._dense_test(W, gate)
        E = self._activations(E, "E", self.layout.K)
        return E @ dense.T if self.axis else dense @ E

    def updat_test(self, I, E, gate=None, dw_gated=False):
        """The weight gradient for input ``I`` and output gradient ``E``, packed (``w_shape``); with
        ``dw_gated``, each block's times ``gate[block]``."""
        I, E = self._activations(I, "I", self.layout.C), self._activations(E, "E", self.layout.K)
        if I.shape[1 - self.axis] != E.shape[1 - self.axis]:
            raise ValueError(f"I and E must have the same minibatch; got shapes {I.shape} and {E.shape}")
        dw = self.layout.pack(I.T @ E if self.axis else I @ E.T)
        return dw * self._gate(gate)[:, None, None] if dw_gated and gate is not None else dw

    def l2_normalize_test(self, W, epsilon=1e-6):
        """:meth:`l2_normalize` without a gain: every output feature's column of the dense matrix
        scaled to unit L2 norm (its squared norm bounded below by ``epsilon``)."""
        dense = self.layout.dense(_as64(W, "W"))
        return self.layout.pack(dense / np.sqrt(np.maximum((dense * dense).sum(0, keepdims=True), epsilon)))

    def _gate(self, gate):
        gate = _as64(gate, "gate").reshape(-1)
        if gate.shape != (self.layout.blocks,):
            raise ValueError(f"gate must hold one value per block ({self.layout.blocks}); got shape {gate.shape}")
        return gate

    def _dense_test(self, W, gate):
        W = _as64(W, "W")
        if W.shape != tuple(self.layout.w_shape):
            raise ValueError(f"W must have shape {tuple(self.layout.w_shape)} (blocks, bs, bs); got {W.shape}")
        return self.layout.dense(W if gate is None else W * self._gate(gate)[:, None, None])

    def _activations(self, a, name, size):
        """Activations ``a`` as float64, checked to be ``(N, size)`` (``(size, N)`` on feature axis 0)."""
        a = _as64(a, name)
        if a.ndim != 2 or a.shape[self.axis] != size:
            want = f"(N, {size})" if self.axis else f"({size}, N)"
            raise ValueError(f"{name} must have shape {want} (feature_axis={self.axis}); got {a.shape}")
        return a


def _as64(a, name):
    """``a`` (a numpy array, a list, or a framework tensor with ``.numpy()``) as a float64 array."""
    if hasattr(a, "detach"):  # a torch tensor (numpy has no bfloat16: floating ones widened first)
        a = a.detach().cpu()
        a = a.double() if a.is_floating_point() else a
    if hasattr(a, "numpy") and not isinstance(a, np.ndarray):
        a = a.numpy()
    a = np.asarray(a)
    if a.dtype.kind not in "iuf" and a.dtype.name != "bfloat16":
        raise TypeError(f"{name} must hold real numbers; got dtype {a.dtype}")
    return a.astype(np.float64)
