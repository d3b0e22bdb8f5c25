"""The block-sparse convolution family, framework-neutral (numpy; Triton for the kernels).

:mod:`.blocks`     ``BCK`` validated, the filter's layout (block shapes, flat offsets, dense index)
:mod:`.geometry`   spatial arithmetic: padding modes, output sizes, transposed-size ranges
:mod:`.edges`      edge-bias patterns of the output positions
:mod:`.grouping`   the blocks as a few grouped convolutions (a GPU path), and when that pays
:mod:`.pointwise`  1x1 convolutions on a block grid as a block-sparse matmul (a GPU path)
:mod:`.implicit`   the tables of the implicit-GEMM kernel (a GPU path), and when it pays
:mod:`.implicit_gemm` that Triton kernel (the convolution and its input gradient)
:mod:`.wgrad`      the filter gradient over the present blocks on those tables (not the default yet)
:mod:`.aot`        its ahead-of-time specs in the kernel library (the PyTorch eager launches)
:mod:`.spec`       :class:`~.spec.ConvSpec` (all of the above for one op) and the shape helpers
                   both frontends share

Both frontends compute with framework ops: the *dense* path convolves with the dense filter that is
zero outside the blocks (any layout; the CPU path), the *grouped* path runs the plan of
:mod:`.grouping` (GPUs, sparse layouts of wide blocks); PyTorch also has the *matmul* path of
:mod:`.pointwise` (the library's block-sparse matmul kernels, for 1x1 block grids) and the
*implicit* path of :mod:`.implicit_gemm` (any convolution layout, reading only the present blocks).
"""
from .spec import ConvShapes, ConvSpec

__all__ = ["ConvShapes", "ConvSpec"]
