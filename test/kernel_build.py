"""A small kernel library for the tests, built once per session from the source tree (import as
``from kernel_build import ...``; the fixture is ``kernel_library_path`` in ``test/conftest.py``)."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Both archs, TMA and pointer kernels, the pointer kernels' PTX (the same compiles as sm_80's), one
#: dtype and block size of the matmul: the subset the tests build (the norms and LSTM families'
#: tests compile their own few kernels).
KERNEL_BUILD = ("--archs", "sm_80,sm_90,compute_80", "--dtypes", "bf16", "--block-sizes", "32", "--families", "matmul")


def can_build():
    """Whether this machine can build kernel libraries: the sources, Triton, a C compiler."""
    return ((ROOT / "src" / "runtime" / "bsk.c").is_file() and importlib.util.find_spec("triton") is not None
            and any(shutil.which(c) for c in ("cc", "gcc", "clang")))


def build(out, *args):
    """``python -m blocksparse.aot --out OUT --library *args``; the library's path."""
    done = subprocess.run([sys.executable, "-m", "blocksparse.aot", "--out", str(out), "--library", *args],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert done.returncode == 0, f"blocksparse.aot failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return Path(out) / "_kernels.so"


def build_subset(out, family, names):
    """Build a kernel library of the specs called ``names`` of ``family`` into ``out``
    (``subset_build.py``); its path."""
    done = subprocess.run([sys.executable, str(ROOT / "test" / "subset_build.py"), str(out),
                           *(f"{family}:{n}" for n in names)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return Path(out) / "_kernels.so"


def resource_usage(names, processes=2):
    """Registers and spills of the specs ``names`` (``family:spec_name``), compiled as the kernel
    library compiles them (``python -m blocksparse.aot.resources``, in ``processes`` processes);
    a list of dicts with ``family``, ``name``, ``regs``, ``stack``, ``local``, ``shared``."""
    import json

    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").is_file():
        import pytest

        pytest.skip("Triton ships no cuobjdump here")
    procs = [subprocess.Popen([sys.executable, "-m", "blocksparse.aot.resources", *names[i::processes]], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(processes)]
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        rows += [json.loads(line) for line in out.splitlines()]
    assert sorted(f"{r['family']}:{r['name']}" for r in rows) == sorted(names)
    return rows


def compiled_in_subprocess(script, arg):
    """Run ``script`` (Python source that compiles kernels for a GPU and prints one JSON line last)
    with ``arg`` as its ``sys.argv[1]``, in a process with Triton's interpreter off; the parsed
    line.  Compiling for sm_80 / sm_90 needs no GPU, only the interpreter unset."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
