"""The TensorFlow op library under test: built small from the source tree (around the session's
kernel library: a few kernels for sm_80 and sm_90), or, where the tests run without the sources
(matrix cells test the installed wheel), the installed one."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tf_op_build import BUILD_SCRIPT, TEST_BUILD, can_build


@pytest.fixture(scope="session")
def op_library_path(tmp_path_factory, request):
    """Path of an op library for this TensorFlow: ``BLOCKSPARSE_TF_OPS`` if set (to test a full
    build: ``BLOCKSPARSE_TF_OPS=blocksparse/_tf_ops.so make test``), else a small one built now
    around the session's kernel library, else the installed one."""
    pytest.importorskip("tensorflow")
    if os.environ.get("BLOCKSPARSE_TF_OPS"):
        return Path(os.environ["BLOCKSPARSE_TF_OPS"]).resolve()
    if can_build():
        kernels = request.getfixturevalue("kernel_library_path")
        out = tmp_path_factory.mktemp("ops")
        done = subprocess.run([sys.executable, str(BUILD_SCRIPT), "--out", str(out), *TEST_BUILD,
                               "--kernels", str(kernels)], capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, f"build_ops failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        return out / "_tf_ops.so"
    import blocksparse

    installed = Path(blocksparse.__file__).parent / "_tf_ops.so"
    if not installed.is_file():
        pytest.skip("no op library installed, and this machine cannot build one")
    return installed


@pytest.fixture
def op_library(op_library_path, monkeypatch):
    """The loaded library (``BLOCKSPARSE_TF_OPS`` pointing at it for the test)."""
    from blocksparse._tf import loader as ops

    monkeypatch.setenv("BLOCKSPARSE_TF_OPS", str(op_library_path))
    lib = ops.library()
    assert lib is not None, ops.unavailable_reason()
    return lib


@pytest.fixture
def gpu_arch(monkeypatch):
    """Pretend TensorFlow sees a GPU of the given arch: ``gpu_arch(90)`` (ops are only built,
    never run, in these tests)."""
    from blocksparse._tf import device as gpu

    def set_arch(arch):
        monkeypatch.setattr(gpu, "device_arch", lambda: arch)

    return set_arch


@pytest.fixture
def gpu_library_with(op_library, gpu_arch, monkeypatch):
    """Pretend an sm_90 GPU (or ``arch``) and a library holding ``specs`` besides the built ones:
    ``gpu_library_with(*specs, arch=90)``; the library."""
    from dataclasses import replace

    from blocksparse._tf import loader

    def install(*specs, arch=90):
        gpu_arch(arch)
        lib = replace(op_library, specs=tuple(op_library.specs) + specs)
        monkeypatch.setattr(loader, "library", lambda warn=True: lib)
        return lib

    return install
