"""PyTorch-frontend fixtures.  The whole folder is skipped where torch is not installed (the
matrix cells test with TensorFlow only)."""
import importlib.util

import pytest

if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["*.py"]
else:
    import os

    import torch

    if not torch.cuda.is_available():
        # Without a GPU the Triton kernels run through Triton's interpreter.  It must be on before
        # any kernel is decorated, i.e. before blocksparse.kernels is first imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")

    @pytest.fixture(autouse=True)
    def poison_empty(monkeypatch):
        """Fill every fresh ``torch.empty`` tensor with NaN, so an output tile a kernel never
        writes shows up as NaN instead of passing by luck."""
        def poisoned(factory):
            def make(*args, **kwargs):
                t = factory(*args, **kwargs)
                if t.is_floating_point():
                    t.fill_(float("nan"))
                return t
            return make

        monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
        monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))
        monkeypatch.setattr(torch.Tensor, "new_empty", poisoned(torch.Tensor.new_empty))

    def pytest_collection_modifyitems(config, items):
        gpu = torch.cuda.is_available()
        interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        for item in items:
            if "gpu" in item.keywords and not gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
            if "interpreter" in item.keywords and not interpret:
                item.add_marker(pytest.mark.skip(reason="needs TRITON_INTERPRET=1 (CPU runs)"))
