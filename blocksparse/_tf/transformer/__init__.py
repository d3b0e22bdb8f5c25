"""TensorFlow glue of the transformer family: argument checks (:mod:`.arguments`), implementation
choice (:mod:`.backend`), the reference path (:mod:`.reference`) and the differentiable ops
(:mod:`.autodiff`)."""
