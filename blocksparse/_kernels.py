"""The kernel library (``_kernels.so``): the ahead-of-time compiled kernels of every op family and
the C runtime that launches them, with no framework dependency.

Platform wheels ship it in the package (``make compile`` builds it); ``BLOCKSPARSE_KERNELS``
points at another build (``python -m blocksparse.aot --out DIR --library``) or, set to ``jit``,
switches it off.  A source checkout has none: the PyTorch frontend then launches every kernel
through Triton's JIT, and :func:`describe` (part of :func:`blocksparse.build_info`) says so.
"""
from __future__ import annotations

import json
import warnings
from functools import lru_cache
from pathlib import Path

from . import _env

__all__ = ["LIBRARY_NAME", "KernelLibraryWarning", "location", "load", "read_manifest", "describe"]

LIBRARY_NAME = "_kernels.so"
INSTALLED = Path(__file__).with_name(LIBRARY_NAME)


class KernelLibraryWarning(RuntimeWarning):
    """The kernel library named by ``BLOCKSPARSE_KERNELS`` or installed cannot be used; the JIT
    serves instead (the message says why)."""


def location():
    """``(path or None, source, why none)``: source is ``"BLOCKSPARSE_KERNELS"``, ``"installed"``
    or None."""
    value = _env.kernels_path()
    if value == _env.KERNELS_OFF:
        return None, None, f"BLOCKSPARSE_KERNELS={_env.KERNELS_OFF} switches the kernel library off"
    if value:
        return Path(value), "BLOCKSPARSE_KERNELS", None
    if INSTALLED.is_file():
        return INSTALLED, "installed", None
    return None, None, ("no kernel library in this installation (a source tree or a pure wheel; "
                        "`python -m blocksparse.aot --out DIR --library` builds one for "
                        "BLOCKSPARSE_KERNELS)")


@lru_cache(maxsize=None)
def _load(path):
    from .aot.abi import KernelLibrary

    if not Path(path).is_file():
        return None, f"{path} not found"
    try:
        return KernelLibrary(path), None
    except Exception as exc:  # OSError (not loadable), KernelError (another ABI): unusable either way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"{path} could not be loaded: {first}"


#: Loaded libraries by the raw ``BLOCKSPARSE_KERNELS`` value that named them (None: unset, the
#: installed one): the ops ask at every call, and resolving the path costs more than their launch.
_LOADED = {}


def load():
    """The :class:`blocksparse.aot.abi.KernelLibrary` to launch from, or None (the JIT serves).

    Loaded once per path.  A library that was asked for (or installed) but cannot be loaded gives
    one :class:`KernelLibraryWarning` (and is looked for again at the next call)."""
    raw = _env.getenv("BLOCKSPARSE_KERNELS")
    library = _LOADED.get(raw)
    if library is not None:
        return library
    path, source, _ = location()
    if path is None:
        return None
    library, why = _load(str(path))
    if library is None:
        _warn_once(str(path), f"blocksparse: the kernel library from {source} is not used, so "
                              f"Triton's JIT launches the kernels: {why}")
    else:
        _LOADED[raw] = library
    return library


@lru_cache(maxsize=None)
def _warn_once(path, message):
    warnings.warn(message, KernelLibraryWarning, stacklevel=4)


#: How the embedded manifest (``bsk_manifest``) begins: ``blocksparse.aot`` writes ``abi`` first.
_MANIFEST_START = b'{"abi": '


@lru_cache(maxsize=8)
def _manifest_of(path, mtime_ns, size):
    data = Path(path).read_bytes()
    at = data.find(_MANIFEST_START)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    try:
        return json.loads(data[at:end if end >= 0 else len(data)].decode())
    except ValueError:
        return None


def read_manifest(path):
    """The build manifest embedded in the kernel library at ``path``, read from the file without
    loading it (None where it holds none)."""
    stat = Path(path).stat()
    return _manifest_of(str(path), stat.st_mtime_ns, stat.st_size)


def describe(arch=None):
    """What :func:`blocksparse.build_info` reports under ``"kernels"`` (nothing is loaded):
    ``library`` (path or None), ``source`` and ``launch`` (``"aot"`` where a kernel library is
    there -- a file with the build manifest --, else ``"jit"`` with the ``reason``); for a library,
    ``archs`` (those with cubins) and
    ``ptx`` (the PTX targets, empty without); with ``arch`` (a GPU, see
    :func:`blocksparse.aot.targets.parse_gpu`), ``serving``: which image would serve it, or
    ``"fallback": "jit"``."""
    from .aot.targets import parse_gpu, serving

    gpu = parse_gpu(arch) if arch is not None else None
    path, source, why = location()
    if path is not None and not path.is_file():
        path, why = None, f"BLOCKSPARSE_KERNELS names {path}, which does not exist"
    manifest = read_manifest(path) if path is not None else None
    if path is not None and manifest is None:
        path, why = None, f"{path} is not a blocksparse kernel library (it holds no build manifest)"
    info = {"library": str(path) if path else None, "source": source if path else None,
            "launch": "aot" if path else "jit"}
    if why:
        info["reason"] = why
    specs = ()
    if path is not None:
        specs = manifest.get("specializations", ())
        info["archs"], info["ptx"] = manifest.get("archs", []), manifest.get("ptx", [])
    if gpu is not None:
        info["serving"] = serving(specs, gpu, "jit")
    return info
