"""PyTorch glue of the portable path and the dense masked product (:mod:`.matmul`), and the
per-layer dispatcher that chooses between them and the kernels (:mod:`.dispatch`)."""
