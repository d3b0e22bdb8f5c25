"""PyTorch frontend: :class:`BlocksparseMatMul` and :class:`BlocksparseLinear`; the block-sparse
convolution :class:`BlocksparseConv`, :class:`BlocksparseDeconv` and :class:`BlocksparseConvLayer`.

Requires PyTorch (``pip install blocksparse[torch]``).  On CUDA tensors the Triton kernels run;
elsewhere (and for block size 8) the reference path does.  ``BLOCKSPARSE_BACKEND`` forces a path
(see :mod:`blocksparse._env`).
"""
try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("blocksparse.torch needs PyTorch >= 2.4: pip install 'blocksparse[torch]'") from exc

from .conv import BlocksparseConv, BlocksparseConvLayer, BlocksparseDeconv
from .matmul import BlocksparseLinear, BlocksparseMatMul

__all__ = ["BlocksparseMatMul", "BlocksparseLinear", "BlocksparseConv", "BlocksparseDeconv", "BlocksparseConvLayer"]
