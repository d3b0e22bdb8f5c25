"""TensorFlow glue of the portable path and the dense masked product (:mod:`.products`), for any
block size; :mod:`blocksparse._tf.matmul.backend` chooses between them, the reference path and the
GPU kernels."""
