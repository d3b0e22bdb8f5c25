"""Layout builders: 0/1 block masks for common structures (numpy only, no framework import).

The masks feed :class:`blocksparse.layout.Layout` (matmul weights) or the attention layouts
``(heads, q_blocks, k_blocks)``.

:mod:`.attention`  causal, Sparse-Transformer "fixed", sliding window, BigBird, user masks:
                   ``causal``, ``fixed``, ``sliding_window``, ``bigbird``, ``from_mask`` (+ ``BlockMasks``),
                   ``check_attention_layout``
:mod:`.butterfly`  flat block butterfly (pixelfly): ``flat_butterfly``, ``butterfly_layout``,
                   ``default_butterfly_size``; ``random_row_layout`` (fixed blocks per row)
"""
