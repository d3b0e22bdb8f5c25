"""TensorFlow glue of the transformer family: argument checks (:mod:`.arguments`), implementation
choice (:mod:`.backend`), the reference path (:mod:`.reference`), the GPU path through the op
library (:mod:`.gpu`) and the differentiable ops (:mod:`.autodiff`)."""
