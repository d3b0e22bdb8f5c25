"""Compile the kernel runtime (``src/runtime/``), the families' C (``src/ops/*.c``) and the
generated launchers with the system C compiler into the kernel library (``_kernels.so``): the
PyTorch frontend loads it with ctypes, the TensorFlow op library links against it.  Needs the
source tree; ``cuda.h`` comes from Triton's wheel, and nothing links against CUDA (``libcuda`` is
opened at run time)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["RUNTIME_DIR", "OPS_DIR", "KERNELS_LIBRARY", "LINK_LIBS", "cuda_include", "cuda_version",
           "c_compiler", "compile_c", "path_maps", "runtime_sources", "build_kernel_library",
           "NativeBuildError"]

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_DIR = ROOT / "src" / "runtime"
#: The families' own C (selection, grids, arguments of the TensorFlow ops), one file per family.
OPS_DIR = ROOT / "src" / "ops"
RUNTIME_SOURCES = ("bsk.c", "driver.c")
#: The kernel library's file name: a library linked against it finds it beside itself ($ORIGIN).
KERNELS_LIBRARY = "_kernels.so"
#: Before glibc 2.34 dlopen and pthread_once live in libdl / libpthread (see driver.c).
LINK_LIBS = ("-Wl,--push-state,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0",
             "-Wl,--pop-state")
C_FLAGS = ("-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall",
           "-Werror=incompatible-pointer-types", "-Werror=implicit-function-declaration")


class NativeBuildError(RuntimeError):
    """A compiler is missing or a compile / link step failed (the message holds its output)."""


def cuda_include():
    """The CUDA headers shipped in Triton's wheel (``cuda.h`` for the driver API)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    if not (path / "cuda.h").is_file():
        raise NativeBuildError(f"cuda.h not found under {path}; the installed Triton lacks its "
                               "NVIDIA backend headers")
    return path


def cuda_version():
    """CUDA version of those headers, e.g. ``"12.8"``."""
    match = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (cuda_include() / "cuda.h").read_text())
    version = int(match.group(1))
    return f"{version // 1000}.{version % 1000 // 10}"


def c_compiler():
    """``$CC``, else the first of cc, gcc, clang on PATH."""
    for name in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang")):
        if shutil.which(name):
            return name
    raise NativeBuildError("no C compiler found: set CC or install gcc")


def run(command, what):
    """Run a compiler ``command``; raise :class:`NativeBuildError` with its output on failure."""
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    if done.returncode:
        raise NativeBuildError(f"{what} failed ({done.returncode}):\n$ {' '.join(map(str, command))}\n"
                               f"{done.stdout}{done.stderr}")
    return done


def _check_runtime_sources():
    if not (RUNTIME_DIR / "bsk.h").is_file():
        raise NativeBuildError(f"{RUNTIME_DIR} not found: building the kernel runtime needs the "
                               "blocksparse source tree")


def path_maps(**dirs):
    """``-ffile-prefix-map`` flags: paths the compiler embeds (``__FILE__``) name no build
    directory, so that builds of one source in different places give the same bytes."""
    return [f"-ffile-prefix-map={Path(d).resolve()}={name}" for name, d in dirs.items()]


def compile_c(sources, out_dir, cc=None, jobs=None):
    """Compile C ``sources`` to objects in ``out_dir``."""
    _check_runtime_sources()
    cc = cc or c_compiler()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = [*C_FLAGS, f"-I{RUNTIME_DIR}", f"-I{OPS_DIR}", f"-I{cuda_include()}",
             *path_maps(src=ROOT, build=out_dir.parent, cuda=cuda_include())]

    def one(source):
        obj = out_dir / (Path(source).stem + ".o")
        run([cc, *flags, "-c", source, "-o", obj], f"compiling {Path(source).name}")
        return obj

    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        return list(pool.map(one, [str(s) for s in sources]))


def runtime_sources():
    """The hand-written C files: the runtime and every family's (``src/ops/*.c``)."""
    _check_runtime_sources()
    return [RUNTIME_DIR / name for name in RUNTIME_SOURCES] + sorted(OPS_DIR.glob("*.c"))


def build_kernel_library(generated_c, out, cc=None, jobs=None):
    """The kernel library (no TensorFlow): the runtime, the families' C and ``generated_c``.

    It has no soname, on purpose: the dynamic loader would take any library of that soname
    already in the process (another build, loaded by path) for the one the TensorFlow op library
    needs; without one it finds the file beside the op library, and shares it only when it is
    the same file.
    """
    cc = cc or c_compiler()
    out = Path(out)
    objects = compile_c([*runtime_sources(), generated_c], out.parent / (out.stem + "_objects"), cc, jobs)
    run([cc, "-shared", *objects, "-o", out, *LINK_LIBS], f"linking {out.name}")
    return out
