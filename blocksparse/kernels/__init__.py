"""Triton kernels of the block-sparse products, framework-neutral: pointers, strides, lookup tables.

``xprop``  fprop / bprop (:mod:`.xprop`), ``updat`` the weight gradient (:mod:`.updat`); tile
configurations in :mod:`.configs`.  PyTorch launches them JIT; the TensorFlow op library launches
the same kernels compiled ahead of time.
"""
