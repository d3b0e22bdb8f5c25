"""The block-sparse matmul family: ``y = x @ W`` with ``W`` given by a block layout.

:mod:`.xprop` / :mod:`.xprop_tma`  fprop and bprop (pointer loads / TMA loads, Hopper+)
:mod:`.updat` / :mod:`.updat_tma`  the weight gradient
:mod:`.configs`                    tile tables and the ahead-of-time specialisation list
:mod:`.aot`                        what ``triton.compile`` gets for each specialisation

Round-2 candidates (issue 16; swept by ``bench/tune_bsmm2.py``, not used by the frontends yet):

:mod:`.xprop_stream` / :mod:`.stream_table`  persistent, stream-K and grouped-output fprop/bprop
:mod:`.updat_balance`                       updat token slices against the wave tail
"""
