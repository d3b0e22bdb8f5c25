""":func:`blocksparse.build_info`: what this installation of blocksparse was built with."""
import json
from pathlib import Path

__all__ = ["MANIFEST", "build_info"]

#: Written next to the op library by ``scripts/build_ops.py`` (``make compile``).
MANIFEST = Path(__file__).with_name("_build_info.json")


def build_info(arch=None):
    """The build manifest of this installation, as a new dict.

    Parameters
    ----------
    arch : int, str or tuple, optional
        A GPU's compute capability (``100``, ``"sm_100"``, ``"10.0"`` or ``(10, 0)``): also say
        which compiled image would serve it (``"serving"``, see below).

    Returns
    -------
    dict
        A platform wheel returns ``{"compiled": True, ...}`` with ``version``, ``tensorflow`` (the
        version built against) and ``tensorflow_window``, ``cuda`` (of the headers the launchers
        were compiled with), ``triton``, ``archs`` (those with cubins, e.g. ``["sm_80", "sm_90"]``),
        ``ptx`` (the forward-compatible PTX targets, e.g. ``["compute_80"]``; empty without),
        ``families``, ``git_revision``, ``platform_tag`` and ``specializations`` (one record per
        compiled kernel, each with its ``image``, ``"cubin"`` or ``"ptx"``, and ``target``).  A
        source tree or a wheel without the op library returns ``{"compiled": False, "version":
        ..., "reason": ...}``.  Either way ``"kernels"`` says how the PyTorch frontend launches
        kernels: ``{"launch": "aot", "library": path, "source": "installed" |
        "BLOCKSPARSE_KERNELS", "archs": [...], "ptx": [...]}`` from a kernel library, or
        ``{"launch": "jit", "library": None, "reason": ...}`` through Triton's JIT.  With ``arch``,
        ``"serving"`` (for the TensorFlow op library) and ``"kernels"]["serving"]`` (for the
        kernel library) say ``{"arch": "sm_100", "image": "cubin" | "ptx" | None, "target":
        "sm_100a" | "compute_80" | None}``: a cubin for that GPU, else the PTX the driver
        JIT-compiles, else none -- then ``"fallback"`` is ``"reference"`` (TensorFlow) or
        ``"jit"`` (PyTorch).  Nothing here imports a framework or loads a library.

    >>> info = build_info(arch="sm_100")
    >>> isinstance(info["compiled"], bool), info["kernels"]["serving"]["arch"]
    (True, 'sm_100')
    """
    from ._kernels import describe
    from .aot.targets import parse_gpu, serving

    gpu = parse_gpu(arch) if arch is not None else None
    try:
        info = json.loads(MANIFEST.read_text(encoding="utf-8"))
    except FileNotFoundError:
        from . import __version__

        info = {"compiled": False, "version": __version__,
                "reason": "no compiled TensorFlow op library in this installation (a source tree "
                          "or a pure wheel); `make compile` builds one"}
    if gpu is not None:
        info["serving"] = serving(info.get("specializations", ()), gpu, "reference")
    info["kernels"] = describe(gpu)
    return info
