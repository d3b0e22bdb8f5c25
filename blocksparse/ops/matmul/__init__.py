"""The block-sparse matmul family: ``y = x @ W`` with ``W`` given by a block layout.

:mod:`.xprop` / :mod:`.xprop_tma`  fprop and bprop (pointer loads / TMA loads, Hopper+)
:mod:`.updat` / :mod:`.updat_tma`  the weight gradient
:mod:`.configs`                    tile tables and the ahead-of-time specialisation list
:mod:`.aot`                        what ``triton.compile`` gets for each specialisation
"""
