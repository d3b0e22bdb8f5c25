"""The LSTM family: the fused gate nonlinearities and cell update of one LSTM step.

:mod:`.gates`    forward and backward kernels
:mod:`.configs`  tile table
:mod:`.aot`      the specs compiled ahead of time for the TensorFlow op library
"""
