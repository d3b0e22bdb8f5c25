"""PyTorch glue of the matmul family: the eager and compiled call paths (:mod:`.ops`), the products
(:mod:`.products`), layout handles and launch plans (:mod:`.plan`), the kernels' launches
(:mod:`.launch`) and the reference path (:mod:`.reference`)."""
