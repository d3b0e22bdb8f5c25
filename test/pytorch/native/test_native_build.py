"""How the native ops' library is linked: against the C++ runtime torch has loaded, so that the
process holds one libstdc++ (a second, static copy crashed on the first error message with a number)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from blocksparse.torch import _native  # noqa: E402

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


@linux
def test_the_link_names_the_loaded_runtime_before_the_libraries():
    (runtime,) = _native._loaded_cxx_runtime()
    with open("/proc/self/maps") as maps:
        assert runtime in maps.read()
    assert "libstdc++.so" in Path(runtime).name and os.path.isfile(runtime)
    objects = [Path(f"{s.stem}.o") for s in _native.SOURCES]
    _, link = _native._commands("c++", _native.SOURCES, objects, Path("ops.so"))
    assert link.index(runtime) > link.index("ops.so")  # after the objects that need it
    assert link.index(runtime) < min(i for i, a in enumerate(link) if a.startswith("-l"))


def test_without_proc_the_toolchain_default_serves(monkeypatch):
    def unreadable(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(_native, "open", unreadable, raising=False)
    assert _native._loaded_cxx_runtime() == []
    objects = [Path(f"{s.stem}.o") for s in _native.SOURCES]
    _, link = _native._commands("c++", _native.SOURCES, objects, Path("ops.so"))
    assert not any("libstdc++" in a for a in link)


def test_the_runtime_is_part_of_the_cache_key(monkeypatch):
    before = _native._digest("c++")
    monkeypatch.setattr(_native, "_loaded_cxx_runtime", lambda: ["/elsewhere/libstdc++.so.6"])
    assert _native._digest("c++") != before


@linux
@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_the_library_defines_no_ostream_of_its_own(native):
    """The ops' library takes libstdc++'s stream inserters from the shared runtime (a copy of its
    own was what crashed)."""
    (library,) = (Path(native._name).parent / "native").glob("native-*.so")  # the fixture built it there
    defined = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             check=True).stdout
    assert "_ZNSo9_M_insert" not in defined  # std::ostream::_M_insert<long>, <double>, ...
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True,
                               check=True).stdout
    assert "_ZNSo9_M_insertIlEERSoT_" in undefined  # the error messages' numbers, from the runtime


def test_an_error_message_with_numbers_raises(native):
    x, w = torch.ones(4, 6), torch.ones(3, 4, 4)
    with pytest.raises(RuntimeError, match=r"factor must be >= 1; got -7"):
        torch.ops.blocksparse_native.linear(x, w, None, 0, 0, 0, -7)


_CALL = """
import torch
from blocksparse.torch import _native
torch.ops.load_library(str(_native.build()))
try:
    torch.ops.blocksparse_native.linear(torch.ones(4, 6), torch.ones(3, 4, 4), None, 0, 0, 0, -3)
except RuntimeError as exc:
    print(str(exc).splitlines()[0])
"""


@linux
def test_a_toolchain_that_links_the_static_runtime_still_formats_numbers(tmp_path):
    """A compiler that links libstdc++'s static archive (``-static-libstdc++`` here; one machine's
    g++ did so by default) gave the library a second C++ runtime with an uninitialised locale: its
    error messages lost their numbers (this machine) or crashed the process (that one).  Linked
    against the loaded runtime first, the library binds every runtime symbol to the one copy."""
    compiler = _native._compiler()
    if compiler is None:
        pytest.skip("needs a C++ compiler")
    wrapper = tmp_path / "cxx-static"
    wrapper.write_text(f'#!/bin/sh\nexec "{compiler}" "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, CXX=str(wrapper), BLOCKSPARSE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", _CALL], capture_output=True, text=True, env=env, timeout=600)
    if "cannot find -lstdc++" in done.stderr:
        pytest.skip("this toolchain has no static libstdc++ to link")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "factor must be >= 1; got -3"
