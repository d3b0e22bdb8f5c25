"""TensorFlow glue of the matmul family: implementation choice (:mod:`.backend`), the reference
path (:mod:`.reference`), the GPU path through the op library (:mod:`.gpu`), the differentiable op
(:mod:`.autodiff`), ``group_param_grads`` (:mod:`.grouping`), initialisers / weight norm
(:mod:`.weights`) and ``SparseProj`` (:mod:`.sparse_proj`)."""
