"""PyTorch frontend: :class:`BlocksparseMatMul` and :class:`BlocksparseLinear`.

Requires PyTorch (``pip install blocksparse[torch]``).  On CUDA tensors the Triton kernels run --
launched from the kernel library (ahead-of-time cubins) where it has them, else through Triton's
JIT (:mod:`blocksparse.torch._launch`); elsewhere (and for block size 8) the reference path does.
``BLOCKSPARSE_BACKEND`` forces a path, ``BLOCKSPARSE_KERNELS`` names the kernel library (see
:mod:`blocksparse._env`).
"""
try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("blocksparse.torch needs PyTorch >= 2.4: pip install 'blocksparse[torch]'") from exc

from .matmul import BlocksparseLinear, BlocksparseMatMul

__all__ = ["BlocksparseMatMul", "BlocksparseLinear"]
