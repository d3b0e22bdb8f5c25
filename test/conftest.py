"""Shared fixtures.

Random inputs are fresh on every run but reproducible: the run's base seed is printed in the
header and can be replayed with ``BLOCKSPARSE_TEST_SEED=<seed> make test``.
"""
import importlib.util
import os
import secrets
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

BASE_SEED = int(os.environ.get("BLOCKSPARSE_TEST_SEED") or secrets.randbits(32))

# TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX-512 / AMX; without them its
# CPU has no gradient of a grouped convolution ("Gradients for grouped convolutions are not supported
# on CPU"), which the tests of the convolution's grouped path (a GPU path, forced onto the CPU there)
# need. Set before TensorFlow is imported; an explicit setting is kept.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# A PyTorch-only install (``blocksparse[torch]``) runs the suite without TensorFlow: its TF tests
# are left out (the PyTorch ones skip themselves where torch is missing)
if importlib.util.find_spec("tensorflow") is None:
    collect_ignore_glob = ["tf/*", "acceptance/*_tf.py", "acceptance/test_tf_*.py", "acceptance/test_keras_*.py"]


def pytest_report_header(config):
    return f"blocksparse test seed: BLOCKSPARSE_TEST_SEED={BASE_SEED}"


def _test_seed(request):
    return [BASE_SEED, zlib.crc32(request.node.nodeid.encode())]


@pytest.fixture
def rng(request):
    """A numpy Generator for this test: the run's base seed mixed with the test id."""
    return np.random.default_rng(_test_seed(request))


@pytest.fixture(autouse=True)
def _framework_seeds(request):
    """The frameworks' global generators (``torch.randn``, a layer's init, TensorFlow ops without a
    seed) start each test from the run's base seed mixed with the test id too: a draw of theirs
    replays with ``BLOCKSPARSE_TEST_SEED`` and does not depend on which tests ran before."""
    seed = int(np.random.SeedSequence(_test_seed(request)).generate_state(1)[0])
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    if "tensorflow" in sys.modules and hasattr(sys.modules["tensorflow"], "random"):
        sys.modules["tensorflow"].random.set_seed(seed)


@pytest.fixture(scope="session")
def kernel_library_path(tmp_path_factory):
    """Path of a kernel library (``_kernels.so``): ``BLOCKSPARSE_KERNELS`` if it names one (to test a
    full build), else a small one built now (``kernel_build.KERNEL_BUILD``), else the installed one."""
    from kernel_build import KERNEL_BUILD, build, can_build

    given = os.environ.get("BLOCKSPARSE_KERNELS", "")
    if given and given != "jit":
        return Path(given).resolve()
    if can_build():
        return build(tmp_path_factory.mktemp("kernels"), *KERNEL_BUILD)
    installed = Path(__import__("blocksparse").__file__).with_name("_kernels.so")
    if not installed.is_file():
        pytest.skip("no kernel library installed, and this machine cannot build one")
    return installed


@pytest.fixture(scope="session")
def toy_build(tmp_path_factory):
    """The build directory of the toy family (``toy_family.py``, built by ``toy_build.py``):
    ``bsk_specs.c``, ``cubins/``, ``_kernels.so``."""
    from kernel_build import can_build

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    out = tmp_path_factory.mktemp("toy")
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("toy_build.py")), str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


@pytest.fixture(scope="session")
def toy_library(toy_build):
    """The toy family's kernel library, loaded."""
    from blocksparse.aot.abi import KernelLibrary

    return KernelLibrary(toy_build / "_kernels.so")


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests without a CUDA GPU, and ``interpreter`` tests unless Triton's
    interpreter is on (CPU runs set it in ``test/torch_setup.py``)."""
    marked = [item for item in items if "gpu" in item.keywords or "interpreter" in item.keywords]
    if not marked:
        return
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    for item in marked:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "interpreter" in item.keywords and not interpret:
            item.add_marker(pytest.mark.skip(reason="needs TRITON_INTERPRET=1 (CPU runs)"))
