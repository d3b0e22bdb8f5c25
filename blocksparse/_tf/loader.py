"""The compiled TensorFlow op library (the GPU path): found, checked and loaded on first use.

Generic: it knows no op family (each family's glue reads the kernels it needs from
:attr:`OpLibrary.specs` and registers its gradients when it first builds ops).
The library (``blocksparse/_tf_ops.so`` in a platform wheel, ``BLOCKSPARSE_TF_OPS`` to use another
file) is tied to the TensorFlow it was built against.  :func:`library` loads it only into that
TensorFlow (major.minor): the version is read from the file before anything is loaded.  Missing,
built for another TensorFlow, or failing to load, it is not used; :func:`library` returns None,
one :class:`OpLibraryWarning` says why (when asked to warn), and the reference path serves.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import _env
from .._version import minor_text as _minor
from ..aot.targets import BuiltImages, spec_rank
from . import tf

__all__ = ["LIBRARY_NAME", "OpLibrary", "OpLibraryWarning", "built_for", "library",
           "library_path", "load", "unavailable_reason"]

LIBRARY_NAME = "_tf_ops.so"
_STAMP = re.compile(rb"blocksparse-tf-version=([0-9A-Za-z.+_-]+)\n")


class OpLibraryWarning(RuntimeWarning):
    """The compiled op library is not used; the message says why."""


class WarnOnce:
    """Issues each :class:`OpLibraryWarning` once per key for the life of the process (the one
    registry of "already said"; :meth:`reset` forgets, for tests)."""

    def __init__(self):
        self._said = set()

    def __call__(self, key, message, stacklevel):
        if key not in self._said:
            self._said.add(key)
            warnings.warn(message, OpLibraryWarning, stacklevel=stacklevel + 1)

    def reset(self):
        self._said.clear()


#: Every "the GPU path is not used" warning of the TensorFlow frontend goes through this.
warn_once = WarnOnce()


@dataclass(frozen=True)
class OpLibrary(BuiltImages):
    """A loaded op library: its ``path``, the op wrappers (``module``) and the kernels of its kernel
    library (``specs``: the build manifest's records, each with its ``family`` and that family's
    fields, see :mod:`blocksparse.aot.family`)."""

    path: str
    module: object
    specs: tuple

    def serves(self, arch, family, **fields):
        """Whether a ``family`` kernel with these ``fields`` is one the runtime's selection would run
        on a GPU of compute capability ``arch`` (:func:`blocksparse.aot.targets.spec_rank`: a cubin of
        the GPU, else PTX, within its shared memory)."""
        return any(s["family"] == family and spec_rank(s, arch) and all(s.get(k) == v for k, v in fields.items())
                   for s in self.specs)

    def group(self, arch, product, dtype, block_size, axis):
        """``G`` of the tables the matmul kernels for this product read on a GPU of compute capability
        ``arch`` (10 * major + minor), or None when no kernel serves it.

        The kernels that would run are those the runtime's selection ranks best (a cubin over PTX,
        the newest arch, within the GPU's shared memory: :func:`blocksparse.aot.targets.spec_rank`);
        the many-token specialisations of one product among them share their ``G`` (the pointer
        kernels that stand in for TMA ones were compiled with it), so the tables do not depend on
        which one runs; few-token ones (``max_tokens``) that read these tables serve few-token calls,
        the others are for the PyTorch plans.  On axis 0 a pointer kernel must serve too (token
        counts whose rows descriptors cannot address are known only when the op runs), so ``G`` is
        the best pointer kernel's: the runtime then takes a TMA kernel of that ``G`` where rows allow.
        """
        key = (product, dtype, block_size, axis)
        ranks = [(spec_rank(s, arch), s) for s in self.specs if s["family"] == "matmul"
                 and (s["product"], s["dtype"], s["block_size"], s["axis"]) == key
                 and (axis == 1 or not s["tma"]) and not s.get("max_tokens")]
        best = max((r for r, _ in ranks), default=0)
        if not best:
            return None
        groups = {s["group"] for r, s in ranks if r == best}
        if len(groups) > 1:
            raise RuntimeError(f"{self.path}: the kernels for {product} {dtype} bs={block_size} "
                               f"axis={axis} on sm_{arch} read tables of different G {groups}")
        return groups.pop()


def library_path():
    """``BLOCKSPARSE_TF_OPS`` if set, else the library inside the installed package."""
    return Path(_env.tf_ops_path() or Path(__file__).resolve().parents[1] / LIBRARY_NAME)


def built_for(path):
    """The TensorFlow version stamped into the library at ``path``, or None if it has no stamp."""
    match = _STAMP.search(Path(path).read_bytes())
    return match.group(1).decode() if match else None


def _install_hint():
    minor = _minor(tf.__version__)
    return (f"install the blocksparse wheel built for TensorFlow {minor} "
            f"(pip install 'blocksparse[tensorflow]~={minor}.0'), or build one with `make compile`")


@lru_cache(maxsize=None)
def load(path):
    """``(OpLibrary, None)`` or ``(None, why it cannot be used)`` for the library at ``path``.

    Once per path: TensorFlow hands out the op wrappers only the first time a library is
    loaded into the process.
    """
    path = Path(path)
    if not path.is_file():
        return None, f"it is not installed ({path} not found); {_install_hint()}"
    stamp = built_for(path)
    if stamp is None:
        return None, f"{path} is not a blocksparse op library (it carries no build stamp)"
    if _minor(stamp) != _minor(tf.__version__):
        return None, (f"{path} was built for TensorFlow {stamp} and this is TensorFlow "
                      f"{tf.__version__}; {_install_hint()}")
    try:
        module = tf.load_op_library(str(path))
        from ..aot.abi import KernelLibrary

        specs = tuple(KernelLibrary(path).specs)
    except Exception as exc:  # TensorFlow's NotFoundError, OSError, KernelError: all mean unusable
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"{path} could not be loaded: {first}"
    if not hasattr(module, "blocksparse_matmul"):
        return None, (f"{path} registered no ops: another library had registered blocksparse's "
                      "ops in this process first")
    return OpLibrary(str(path), module, specs), None


def library(warn=True):
    """The loaded :class:`OpLibrary`, or None.  The first time a library cannot be used, and
    ``warn`` is true, one :class:`OpLibraryWarning` says why."""
    path = str(library_path())
    lib, why = load(path)
    if lib is None and warn:
        warn_once(("library", path), f"blocksparse: the TensorFlow GPU op library is not used, so "
                  f"the reference path (TensorFlow ops) computes the products: {why}", stacklevel=3)
    return lib


def unavailable_reason():
    """Why :func:`library` returns None (None when it loads)."""
    return load(str(library_path()))[1]
