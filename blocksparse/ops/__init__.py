"""Op families: one folder each, framework-neutral (Triton kernels on pointers, strides and lookup
tables; tile tables; ahead-of-time specialisations).

===========  ===============================================================================
family       holds
===========  ===============================================================================
matmul       block-sparse ``y = x @ W``: fprop / bprop (``xprop*``), updat (``updat*``), tiles
norms        layer norm over either activation layout (segments, fused relu), tiles
lstm         the fused LSTM gates (one step's nonlinearities and cell update)
transformer  block-sparse attention ops: attention lookup tables (``lut``), ``nt`` / ``nn`` / ``tn``
             products, the masked softmax, the frontends' shared API (``frontend``), ahead-of-time specs
attention    the fused flash-style block-sparse attention: block lists, forward / backward, tiles
conv         block-sparse convolution: channel blocks, geometry, edge bias, grouped-conv plans
common       what several families share (the interpreter fix, deterministic partial-row sums and their
             ahead-of-time specs)
===========  ===============================================================================

A family's frontends live beside the public modules: ``blocksparse/torch/_<family>/`` (PyTorch
plans and call paths) and ``blocksparse/_tf/<family>/`` (TensorFlow glue and reference path).
Families whose kernels are compiled ahead of time into the kernel library (launched by the PyTorch
frontend, and by the TensorFlow op library where an op serves them) are listed in
:data:`AOT_FAMILIES`, each registering them in ``blocksparse/ops/<family>/aot.py`` (:mod:`blocksparse.aot.family`); see the README's
"Adding an op family".
"""
import importlib

__all__ = ["AOT_FAMILIES", "family"]

#: Families whose kernels are compiled ahead of time (each has an ``aot`` module).
AOT_FAMILIES = ("matmul", "norms", "lstm", "transformer", "conv", "attention")


def family(name):
    """The module ``blocksparse.ops.<name>``."""
    return importlib.import_module(f"{__name__}.{name}")
