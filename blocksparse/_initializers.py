"""Initial values for packed block-sparse weights, computed with numpy (no framework import).

Both return a ``(blocks, bs, bs)`` float32 array in the block order of the given
:class:`~blocksparse.layout.Layout`; the frontends wrap them as initializers.
"""
import numpy as np

__all__ = ["fan_in_bounds", "identity_blocks", "ortho_blocks"]


def fan_in_bounds(layout):
    """``nn.Linear``'s uniform bounds for a block-sparse weight: ``1 / sqrt(fan_in)`` with the fan-in
    of an output feature counting only the blocks of its layout column.

    Returns ``(per_block, per_feature)``: float64 arrays of shape ``(blocks,)`` (the bound of each
    block's column) and ``(K,)`` (the bound of each output feature, for the bias).
    """
    fan_in = np.bincount(layout.coords[:, 1], minlength=layout.KB) * layout.block_size
    per_column = 1.0 / np.sqrt(np.maximum(fan_in, 1))
    return per_column[layout.coords[:, 1]], np.repeat(per_column, layout.block_size)


def identity_blocks(layout):
    """Identity blocks on the (wrapped) diagonal of the layout, zeros elsewhere.

    Block ``(c, k)`` is the ``bs x bs`` identity when ``c % KB == k % CB`` -- for a square layout
    exactly the diagonal blocks, for a rectangular one the diagonal repeated along the longer
    side -- and zero otherwise (the rule of the original package).
    """
    c, k = layout.coords[:, 0], layout.coords[:, 1]
    on = (c % layout.KB) == (k % layout.CB)
    w = np.zeros(layout.w_shape, dtype=np.float32)
    w[on] = np.eye(layout.block_size, dtype=np.float32)
    return w


def ortho_blocks(layout, rng=None):
    """Random weights with orthonormal columns per layout column.

    When the layout is sparse, the blocks of each layout column ``k`` (stacked along ``C``,
    ``(n*bs, bs)``) get orthonormal columns: different layout columns are already nearly
    orthogonal because they share few input rows.  When every block is present the whole dense
    ``(C, K)`` matrix is made semi-orthogonal (orthonormal columns when ``C >= K``, rows
    otherwise).  ``rng`` is a ``numpy.random.Generator``; None uses numpy's global generator so
    that ``np.random.seed`` makes the result reproducible, as in the original package.
    """
    normal = np.random.standard_normal if rng is None else rng.standard_normal
    bs = layout.block_size
    w = np.empty(layout.w_shape, dtype=np.float32)
    if layout.blocks < layout.CB * layout.KB:
        for k in range(layout.KB):
            ids = layout.block_ids[:, k]
            ids = ids[ids >= 0]  # the column's blocks, in order of c
            if ids.size == 0:
                continue
            u, _, _ = np.linalg.svd(normal((ids.size * bs, bs)), full_matrices=False)
            w[ids] = u.reshape(ids.size, bs, bs)
    else:
        u, _, vt = np.linalg.svd(normal((layout.C, layout.K)), full_matrices=False)
        w[:] = layout.pack(u @ vt)
    return w
