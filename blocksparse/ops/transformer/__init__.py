"""The block-sparse transformer family: attention scores on a block layout.

:mod:`.lut`       attention layouts, block order, lookup tables and in-block masks (numpy only)
:mod:`.frontend`  what both frontends' ``BlocksparseTransformer`` share (checks, shape helpers)
:mod:`.products`  Triton kernels of ``nt`` (q kᵀ on the layout's blocks), ``nn`` (w v), ``tn`` (wᵀ x)
:mod:`.softmax`   Triton kernels of the block-sparse masked softmax and its gradient
:mod:`.aot`       their ahead-of-time specs (the TensorFlow op library); :mod:`.capi` its C entry points

Importing this package imports neither Triton nor a framework; the kernel modules import Triton.
"""
