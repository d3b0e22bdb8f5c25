"""PyTorch fixtures shared by the folders that run torch (``test/pytorch``, ``test/ops``): their
conftests do ``from torch_setup import *``.  Without torch those folders are not collected (the
matrix cells test with TensorFlow only)."""
import importlib.util
import os

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None
#: For a conftest's ``collect_ignore_glob``: everything, where torch is missing.
IGNORE_WITHOUT_TORCH = [] if HAVE_TORCH else ["*.py"]

if HAVE_TORCH:
    import torch

    if not torch.cuda.is_available():
        # Without a GPU the Triton kernels run through Triton's interpreter.  It must be on before
        # any kernel is decorated, i.e. before blocksparse.ops is first imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")

    @pytest.fixture(autouse=True)
    def poison_empty():
        """Every fresh ``torch.empty`` tensor is NaN-filled, so an output tile a kernel never
        writes shows up as NaN instead of passing by luck."""
        from blocksparse.testing.poison import poisoned_empty

        with poisoned_empty():
            yield
