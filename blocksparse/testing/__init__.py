"""What the tests, the benchmarks and the GPU verification scripts share: float64 references,
tolerances, NaN poisoning.  Imports no framework at import time (the torch helpers import torch
when called).

:mod:`.numerics`   ``rel_error``, ``TOLERANCE``, ``tolerance``, ``rounded_once_bound``
:mod:`.poison`     ``poisoned_empty`` -- NaN-filled ``torch.empty`` so unwritten outputs show
:mod:`.matmul`     float64 references of the block-sparse matmul, random layouts
:mod:`.ew`         float64 references of the elementwise ops (values and derivatives)
:mod:`.norms`      float64 references of layer norm and the LSTM gates (numpy or torch), batch norm,
                   ``cwise_linear``
:mod:`.attention`  float64 dense references of block-sparse attention (block + in-block masks)
:mod:`.flash`      float64 reference of the fused block-sparse attention (masks, output, gradients)
:mod:`.conv`       float64 references of the block-sparse convolution, test cases
:mod:`.aot_verify` the GPU checks of compiled kernels through the TensorFlow ops' C: options, runs, reports
"""
from .numerics import TOLERANCE, rel_error, rounded_once_bound, tolerance

__all__ = ["TOLERANCE", "rel_error", "rounded_once_bound", "tolerance"]
