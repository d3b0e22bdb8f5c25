"""The native ops (``blocksparse/torch/csrc``) built into a fresh cache and loaded once a session --
a process can load the ops' library only once -- and the stand-in runtime (``stand_in.py``)."""
import ctypes
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def native(tmp_path_factory):
    """The ops built into a fresh cache, loaded (unless this process loaded them already), and the
    stand-in runtime."""
    torch = pytest.importorskip("torch")
    from blocksparse.torch import _native
    from stand_in import FAKE_RUNTIME

    if _native._compiler() is None or shutil.which("cc") is None:
        pytest.skip("needs C and C++ compilers")
    if not _native.supported():
        pytest.skip(f"the native op needs torch {_native.MIN_TORCH} or newer; this is {torch.__version__}")
    cache = tmp_path_factory.mktemp("native-cache")
    library = _native.build(cache)
    if not _native._state.get("loaded"):
        torch.ops.load_library(str(library))
        _native._state["loaded"] = True
    src = cache / "fake.c"
    src.write_text(FAKE_RUNTIME)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", str(src), "-o", str(cache / "fake.so")], check=True)
    return ctypes.CDLL(str(cache / "fake.so"))
