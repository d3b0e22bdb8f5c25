"""PyTorch-frontend fixtures (see ``test/torch_setup.py``)."""
from torch_setup import IGNORE_WITHOUT_TORCH, HAVE_TORCH

collect_ignore_glob = IGNORE_WITHOUT_TORCH
if HAVE_TORCH:
    from torch_setup import poison_empty  # noqa: F401

    import os
    import warnings

    import pytest

    @pytest.fixture(scope="session")
    def gpu_kernels(tmp_path_factory):
        """Path of a kernel library with every kernel for this GPU: ``BLOCKSPARSE_KERNELS`` if it
        names one, else one built for this GPU's architecture (about a minute, once a session)."""
        import torch

        given = os.environ.get("BLOCKSPARSE_KERNELS", "")
        if given and given != "jit":
            missing = _missing_families(given)
            if not missing:
                return given
            # the tests assert which node or launch serves a call: a library of some families would
            # send the others' calls elsewhere and fail them for the setup, not for the product
            warnings.warn(f"BLOCKSPARSE_KERNELS={given} holds no {', '.join(missing)} kernels: the GPU tests "
                          "build a library of every family instead")
        from kernel_build import build, can_build

        if not can_build():
            pytest.skip("no BLOCKSPARSE_KERNELS library and no way to build one")
        major, minor = torch.cuda.get_device_capability()
        arch = 80 if major == 8 else 10 * major + minor
        return str(build(tmp_path_factory.mktemp("gpu-kernels"), "--archs", f"sm_{arch}"))

    def _missing_families(path):
        """The ahead-of-time families (:data:`blocksparse.ops.AOT_FAMILIES`) the library at ``path`` lacks."""
        from blocksparse.aot.abi import KernelLibrary
        from blocksparse.ops import AOT_FAMILIES

        have = set(KernelLibrary(path).manifest.get("families", ()))
        return [f for f in AOT_FAMILIES if f not in have]

    @pytest.fixture
    def aot(gpu_kernels, monkeypatch):
        """The kernel library serves the calls of the test (a fresh load of its path)."""
        monkeypatch.setenv("BLOCKSPARSE_KERNELS", gpu_kernels)
        monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
