"""The toy family's kernel library, built once per session (see ``toy_build.py``)."""
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_build import can_build

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def toy_build(tmp_path_factory):
    """The build directory of the toy family: ``bsk_specs.c``, ``cubins/``, ``_kernels.so``."""
    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    out = tmp_path_factory.mktemp("toy")
    done = subprocess.run([sys.executable, str(HERE / "toy_build.py"), str(out)], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


@pytest.fixture(scope="session")
def toy_library(toy_build):
    from blocksparse.aot.abi import KernelLibrary

    return KernelLibrary(toy_build / "_kernels.so")
