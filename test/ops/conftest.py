"""Kernel tests (launched on torch tensors) fixtures (see ``test/torch_setup.py``)."""
from torch_setup import IGNORE_WITHOUT_TORCH, HAVE_TORCH

collect_ignore_glob = IGNORE_WITHOUT_TORCH
if HAVE_TORCH:
    from torch_setup import poison_empty  # noqa: F401
