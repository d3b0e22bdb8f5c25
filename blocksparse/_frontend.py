"""What both frontends' ``BlocksparseMatMul`` share: argument checks and shape helpers (no
framework import)."""
import numbers

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
