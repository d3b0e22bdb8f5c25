"""The native ops (``blocksparse/torch/csrc``) built into a fresh cache and loaded once a session --
a process can load the ops' library only once -- and the stand-in runtime (``stand_in.py``)."""
import ctypes
import shutil
import subprocess
from pathlib import Path

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


def _stand_in(source, name, out):
    """The stand-in C ``source`` compiled against the kernel library's headers, loaded."""
    src_dir = Path(__file__).resolve().parents[3] / "src"
    (out / f"{name}.c").write_text(source)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", f"-I{src_dir / 'ops'}", f"-I{src_dir / 'runtime'}",
                    str(out / f"{name}.c"), "-o", str(out / f"{name}.so"), "-lm"], check=True)
    return ctypes.CDLL(str(out / f"{name}.so"))


@pytest.fixture(scope="session")
def native_norms(native, tmp_path_factory):
    """The stand-in of the kernel library's layer-norm entry points (``stand_in.FAKE_NORMS``),
    compiled against the library's own header, and its entry id in the native op."""
    from stand_in import FAKE_NORMS, norms_entry

    lib = _stand_in(FAKE_NORMS, "fake_norms", tmp_path_factory.mktemp("fake-norms"))
    return lib, norms_entry(lib)


@pytest.fixture(scope="session")
def native_gates(native, tmp_path_factory):
    """The stand-in of the LSTM-gates entry points (``stand_in.FAKE_GATES``) and its entry id."""
    from stand_in import FAKE_GATES, gates_entry

    lib = _stand_in(FAKE_GATES, "fake_gates", tmp_path_factory.mktemp("fake-gates"))
    return lib, gates_entry(lib)
