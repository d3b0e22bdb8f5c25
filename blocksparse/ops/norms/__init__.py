"""The norms family: layer normalisation over either activation layout.

:mod:`.layer_norm`  forward and backward kernels (``(N, C)`` rows or ``(C, N)`` columns, segments,
                    fused relu)
:mod:`.configs`     tile tables: tokens x features per program, warps, programs per SM
"""
