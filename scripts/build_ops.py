#!/usr/bin/env python3
"""Build the kernel library and the TensorFlow op library for the TensorFlow installed here.

    python scripts/build_ops.py [--out DIR] [--archs sm_80,sm_90,compute_80] [--jobs N]
                                [--dtypes bf16] [--block-sizes 32]   (a subset, for tests)
                                [--kernels PATH]                     (reuse a built _kernels.so)

Steps: compile the Triton kernels of every registered op family ahead of time for the archs
(``--archs``, else ``BLOCKSPARSE_CUDA_ARCHS``, else the TensorFlow's build in ``matrix.yaml``, else
sm_80 and sm_90), generate their C launchers, compile those with the kernel runtime and the
families' C into ``DIR/_kernels.so`` (the kernel library: no TensorFlow; the PyTorch frontend loads
it), then the ops (C++, against this TensorFlow's headers, its C++ ABI, C++17) into
``DIR/_tf_ops.so``, linked against ``_kernels.so`` beside it (default DIR: the ``blocksparse``
package), and write ``DIR/_build_info.json``: the manifest that ``blocksparse.build_info()``
returns and ``setup.py`` tags the wheel from.  ``make compile`` (``scripts/build_wheel.sh``) runs
this before building the wheel.  Needs TensorFlow, Triton (the AOT compiler), a C/C++ compiler
and binutils' objdump; no GPU, no CUDA toolkit.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blocksparse import _version  # noqa: E402
from blocksparse.aot import build_sources, parse_filters, resolve_archs  # noqa: E402
from blocksparse.aot import native  # noqa: E402

LIBRARY = "_tf_ops.so"
KERNELS = native.KERNELS_LIBRARY
MANIFEST = "_build_info.json"
TF_SOURCES = ("ops.cc", "kernels.cc", "norms_ops.cc", "norms_kernels.cc", "transformer_ops.cc",
              "transformer_kernels.cc")

#: x86_64 manylinux policies (PEP 600) by glibc minor version, with the newest libstdc++ / libgcc
#: symbol versions each allows (auditwheel's policy table): the oldest one that covers every
#: versioned symbol the library needs names the wheel's platform.
MANYLINUX_X86_64 = (
    (17, {"GLIBCXX": "3.4.19", "CXXABI": "1.3.7", "GCC": "4.8.0"}),
    (24, {"GLIBCXX": "3.4.22", "CXXABI": "1.3.10", "GCC": "4.8.0"}),
    (27, {"GLIBCXX": "3.4.24", "CXXABI": "1.3.11", "GCC": "7.0.0"}),
    (31, {"GLIBCXX": "3.4.28", "CXXABI": "1.3.12", "GCC": "7.0.0"}),
    (34, {"GLIBCXX": "3.4.29", "CXXABI": "1.3.13", "GCC": "7.0.0"}),
    (35, {"GLIBCXX": "3.4.30", "CXXABI": "1.3.13", "GCC": "12.0.0"}),
    (39, {"GLIBCXX": "3.4.33", "CXXABI": "1.3.15", "GCC": "14.0.0"}),
)


class BuildError(RuntimeError):
    pass


def _version_tuple(text):
    return tuple(int(p) for p in text.split("."))


def symbol_versions(library):
    """``{"GLIBC": "2.34", "GLIBCXX": "3.4.30", ...}``: the newest version the library requires
    of each versioned library (from ``objdump -p``'s version references)."""
    objdump = shutil.which("objdump")
    if not objdump:
        raise BuildError("objdump (binutils) is needed to read the library's glibc requirements")
    text = native.run([objdump, "-p", library], "objdump").stdout
    newest = {}
    for name, version in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI|GCC)_(\d+(?:\.\d+)*)\b", text):
        if name not in newest or _version_tuple(version) > _version_tuple(newest[name]):
            newest[name] = version
    return newest


def newest_versions(*tables):
    """The newest version of each name over several :func:`symbol_versions` tables."""
    newest = {}
    for table in tables:
        for name, version in table.items():
            if name not in newest or _version_tuple(version) > _version_tuple(newest[name]):
                newest[name] = version
    return newest


def platform_tag(versions, machine=None):
    """The honest platform tag of a library needing ``versions`` (see :func:`symbol_versions`)."""
    machine = machine or platform.machine()
    if machine != "x86_64":
        return f"linux_{machine}"
    glibc = _version_tuple(versions.get("GLIBC", "2.17"))
    for minor, allowed in MANYLINUX_X86_64:  # a row's limits hold until the next row's glibc
        if all(_version_tuple(versions[k]) <= _version_tuple(v)
               for k, v in allowed.items() if k in versions):
            return f"manylinux_2_{max(minor, glibc[1])}_x86_64"
    raise BuildError(f"the library needs {versions}, newer than every manylinux policy known here")


def _git(*args):
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cxx():
    for name in filter(None, (os.environ.get("CXX"), "c++", "g++", "clang++")):
        if shutil.which(name):
            return name
    raise BuildError("no C++ compiler found: set CXX or install g++")


def _kernel_library(out, archs, work, jobs, reuse, filters):
    """``out/_kernels.so`` (built, or ``reuse`` copied) and its manifest."""
    kernels = out / KERNELS
    if reuse:
        from blocksparse.aot.abi import KernelLibrary

        if Path(reuse).resolve() != kernels.resolve():
            shutil.copyfile(reuse, kernels)
        return KernelLibrary(kernels).manifest
    source, manifest = build_sources(archs, work / "aot", jobs=jobs, **filters)
    native.build_kernel_library(source, kernels, jobs=jobs)
    return manifest


def build(out, archs=None, jobs=None, build_dir=None, kernels=None, **filters):
    """Build ``out/_kernels.so``, ``out/_tf_ops.so`` and ``out/_build_info.json``; return the
    manifest.  ``kernels``: an existing kernel library to ship instead of compiling one."""
    import tensorflow as tf

    tf_version = tf.__version__
    archs = resolve_archs(archs, tf_version)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(build_dir or tempfile.mkdtemp(prefix="blocksparse-ops-"))
    start = time.perf_counter()
    kernel_manifest = _kernel_library(out, archs, work, jobs, kernels, filters)
    cxx = _cxx()
    compile_flags = tf.sysconfig.get_compile_flags()
    flags = [*compile_flags, "-O2", "-fPIC", "-std=c++17", "-Wall", "-Wno-sign-compare",
             f"-I{native.RUNTIME_DIR}", f"-I{native.OPS_DIR}", f"-I{ROOT / 'src' / 'tf'}",
             f"-I{native.cuda_include()}", f'-DBLOCKSPARSE_TF_VERSION="{tf_version}"',
             *native.path_maps(src=ROOT, build=work, tensorflow=tf.sysconfig.get_include(),
                               cuda=native.cuda_include())]
    objects = []
    for name in TF_SOURCES:
        obj = work / "tf" / (Path(name).stem + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        native.run([cxx, *flags, "-c", ROOT / "src" / "tf" / name, "-o", obj], f"compiling {name}")
        objects.append(obj)
    library = out / LIBRARY
    # one runtime and one copy of the cubins: the ops call the kernel library found beside them
    native.run([cxx, "-shared", *objects, "-o", library, f"-L{out}", f"-l:{KERNELS}", "-Wl,-rpath,$ORIGIN",
                *tf.sysconfig.get_link_flags(), *native.LINK_LIBS], f"linking {LIBRARY}")
    versions = newest_versions(symbol_versions(library), symbol_versions(out / KERNELS))
    revision = _git("rev-parse", "HEAD")
    manifest = {
        "compiled": True,
        "version": _version.wheel_version(tf_version),
        "tensorflow": tf_version,
        "tensorflow_window": ",".join(_version.tf_window(tf_version)),
        "cxx11_abi": next((f.split("=")[1] for f in compile_flags if "_GLIBCXX_USE_CXX11_ABI" in f),
                          None),
        "cuda": kernel_manifest["cuda"],
        "triton": kernel_manifest["triton"],
        "archs": kernel_manifest["archs"],
        "ptx": kernel_manifest.get("ptx", []),
        "families": kernel_manifest["families"],
        "git_revision": revision,
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")) if revision else None,
        "compiler": native.run([cxx, "--version"], "c++ --version").stdout.splitlines()[0],
        "symbol_versions": versions,
        "platform_tag": platform_tag(versions),
        "library": LIBRARY,
        "kernels_library": KERNELS,
        "library_bytes": library.stat().st_size + (out / KERNELS).stat().st_size,
        "cubin_bytes": sum(s["cubin_bytes"] for s in kernel_manifest["specializations"]),
        "specializations": kernel_manifest["specializations"],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if not build_dir:
        shutil.rmtree(work, ignore_errors=True)
    print(f"build_ops: {len(manifest['specializations'])} kernels for {', '.join(manifest['archs'] + manifest['ptx'])} "
          f"({manifest['cubin_bytes'] / 2**20:.1f} MiB of cubins and PTX), TensorFlow {tf_version} -> "
          f"{library} + {KERNELS} ({manifest['library_bytes'] / 2**20:.1f} MiB, {manifest['platform_tag']}) "
          f"in {time.perf_counter() - start:.0f} s")
    return manifest


def main(argv=None):
    # Triton's CPU interpreter (TRITON_INTERPRET=1, set by the CPU test runs) cannot compile
    # kernels ahead of time: this script always needs the compiler
    os.environ.pop("TRITON_INTERPRET", None)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "blocksparse"),
                        help="where _tf_ops.so and _build_info.json go (default: the package)")
    parser.add_argument("--archs", help="GPU architectures, e.g. sm_80,sm_90")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the CPUs)")
    parser.add_argument("--build-dir", help="keep intermediate files here (default: a temp dir)")
    parser.add_argument("--dtypes", help="only these kernel dtypes, e.g. bf16,fp32 (tests)")
    parser.add_argument("--block-sizes", help="only these block sizes, e.g. 32 (tests)")
    parser.add_argument("--kernels", help=f"ship this {KERNELS} instead of compiling the kernels")
    args = parser.parse_args(argv)
    filters = parse_filters(args.dtypes, args.block_sizes)
    try:
        build(args.out, args.archs, args.jobs, args.build_dir, args.kernels, **filters)
    except ImportError as exc:
        print(f"build_ops: {exc.name or exc} is needed to build the TensorFlow op library "
              f"(pip install -r requirements/dev.txt): {exc}", file=sys.stderr)
        return 2
    except (BuildError, native.NativeBuildError, ValueError, RuntimeError) as exc:
        print(f"build_ops: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
