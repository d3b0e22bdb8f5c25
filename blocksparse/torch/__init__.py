"""PyTorch frontend: :class:`BlocksparseMatMul` and :class:`BlocksparseLinear`.

Requires PyTorch (``pip install blocksparse[torch]``).  :class:`PixelflyLinear`: a flat block
butterfly layer with an optional low-rank term, any block size.  On CUDA tensors the Triton kernels run;
elsewhere (and for block size 8) the reference path does.  ``BLOCKSPARSE_BACKEND`` forces a path
(see :mod:`blocksparse._env`).
"""
try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("blocksparse.torch needs PyTorch >= 2.4: pip install 'blocksparse[torch]'") from exc

from .matmul import BlocksparseLinear, BlocksparseMatMul
from .pixelfly import PixelflyLinear

__all__ = ["BlocksparseMatMul", "BlocksparseLinear", "PixelflyLinear"]
