"""TensorFlow glue of the norms family: ``layer_norm``, the fused LSTM gates, batch norm and
``cwise_linear``.

:mod:`.backend`     which implementation serves ``layer_norm`` and the LSTM gates (the GPU seam)
:mod:`.gpu`         the GPU path: the op library's layer-norm and LSTM-gate ops
:mod:`.layer_norm`  reference ``layer_norm``: float32 statistics, one fused gradient
:mod:`.lstm_gates`  reference LSTM gates: one fused gradient
:mod:`.channels`    ops over the channel axis of ``(N, C, ...)`` tensors: batch norm, ``cwise_linear``
"""
