"""The norms family: layer normalisation over either activation layout.

:mod:`.layer_norm`  forward and backward kernels (``(N, C)`` rows or ``(C, N)`` columns, segments,
                    fused relu)
:mod:`.split_bwd`   the ``(C, N)`` backward of long segments in two launches over feature slices
:mod:`.configs`     tile tables: tokens x features per program, warps, programs per SM
:mod:`.aot`         the specs compiled ahead of time for the TensorFlow op library
:mod:`.capi`        ctypes view of the norms and LSTM families' C (``src/ops/norms.h``)
"""
