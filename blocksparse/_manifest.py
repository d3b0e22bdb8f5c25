""":func:`blocksparse.build_info`: what this installation of blocksparse was built with."""
import json
from pathlib import Path

__all__ = ["MANIFEST", "build_info"]

#: Written next to the op library by ``scripts/build_ops.py`` (``make compile``).
MANIFEST = Path(__file__).with_name("_build_info.json")


def build_info():
    """The build manifest of this installation, as a new dict.

    A platform wheel returns ``{"compiled": True, ...}`` with ``version``, ``tensorflow`` (the
    version built against) and ``tensorflow_window``, ``cuda`` (of the headers the launchers were
    compiled with), ``triton``, ``archs`` (e.g. ``["sm_80", "sm_90"]``), ``families``,
    ``git_revision``, ``platform_tag`` and ``specializations`` (one record per compiled kernel).
    A source tree or a wheel without the op library returns ``{"compiled": False, "version": ...,
    "reason": ...}``.  Either way ``"kernels"`` says how the PyTorch frontend launches kernels:
    ``{"launch": "aot", "library": path, "source": "installed" | "BLOCKSPARSE_KERNELS"}`` from a
    kernel library, or ``{"launch": "jit", "library": None, "reason": ...}`` through Triton's JIT.
    Nothing here imports a framework or loads a library.

    >>> info = build_info()
    >>> isinstance(info["compiled"], bool)
    True
    """
    from ._kernels import describe

    try:
        info = json.loads(MANIFEST.read_text(encoding="utf-8"))
    except FileNotFoundError:
        from . import __version__

        info = {"compiled": False, "version": __version__,
                "reason": "no compiled TensorFlow op library in this installation (a source tree "
                          "or a pure wheel); `make compile` builds one"}
    info["kernels"] = describe()
    return info
