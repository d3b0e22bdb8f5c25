"""Acceptance tests of the documented public API (TensorFlow and PyTorch, reference paths; the
PyTorch kernels through Triton's interpreter on tiny shapes)."""
from torch_setup import HAVE_TORCH

if HAVE_TORCH:
    from torch_setup import poison_empty  # noqa: F401
