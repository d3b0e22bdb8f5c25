"""PyTorch frontend: :class:`BlocksparseMatMul`, :class:`BlocksparseLinear`, :class:`PixelflyLinear`,
:class:`BlocksparseTransformer`, :func:`layer_norm`, :func:`fused_lstm_gates`, the fused
block-sparse :func:`attention` with its prepared :class:`AttentionLayout`, and the block-sparse
convolution :class:`BlocksparseConv`, :class:`BlocksparseDeconv` and :class:`BlocksparseConvLayer`.

Requires PyTorch (``pip install blocksparse[torch]``).  :class:`PixelflyLinear`: a flat block
butterfly layer with an optional low-rank term, any block size.  On CUDA tensors the Triton kernels
run -- launched from the kernel library (ahead-of-time cubins) where it has them, else through
Triton's JIT (:mod:`blocksparse.torch._launch`); elsewhere (and for block size 8) the reference path
does.  ``BLOCKSPARSE_BACKEND`` forces a path, ``BLOCKSPARSE_KERNELS`` names the kernel library (see
:mod:`blocksparse._env`).
"""
try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("blocksparse.torch needs PyTorch >= 2.4: pip install 'blocksparse[torch]'") from exc

from .conv import BlocksparseConv, BlocksparseConvLayer, BlocksparseDeconv
from .fused_attention import AttentionLayout, attention
from .lstm import fused_lstm_gates
from .matmul import BlocksparseLinear, BlocksparseMatMul
from .norms import layer_norm
from .pixelfly import PixelflyLinear
from .transformer import BlocksparseTransformer

__all__ = ["AttentionLayout", "BlocksparseConv", "BlocksparseConvLayer", "BlocksparseDeconv",
           "BlocksparseLinear", "BlocksparseMatMul", "BlocksparseTransformer", "PixelflyLinear",
           "attention", "fused_lstm_gates", "layer_norm"]
