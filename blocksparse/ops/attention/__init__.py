"""The fused block-sparse attention family: FlashAttention-2 style kernels that visit only the
blocks a layout keeps.

:mod:`.blocklist`  the lookup tables (row and column block lists; the format, byte for byte)
:mod:`.fwd`        forward: online softmax, output and log-sum-exp
:mod:`.bwd`        backward: dq (with the row statistics), dk/dv
:mod:`.tiles`      tile loads/stores (pointers or tensor descriptors) and partial-tile masks
:mod:`.configs`    tile configs per head dim
:mod:`.aot`        compile signatures of the kernels (``triton.compile`` without a GPU)
"""
