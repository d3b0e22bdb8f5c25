"""How an op family registers its ahead-of-time kernels: the only family-facing part of the AOT path.

A family lists itself in :data:`blocksparse.ops.AOT_FAMILIES` and gives ``blocksparse/ops/<family>/aot.py``
four functions::

    specializations(archs)  -> sequence of specs      every kernel to compile for those archs
    kernel(spec)            -> the @triton.jit function
    compile_args(spec)      -> CompileArgs           signature, constexprs, hints, warps, stages
    fields(spec)            -> dict                  what selects the spec at run time

A *spec* is any object with ``name`` (a C identifier, unique within the family) and ``arch``
(compute capability as ``10 * major + minor``).  ``fields`` go into the build manifest (JSON) and,
where they are ``str`` / ``int`` / ``bool``, into the C runtime's spec table as keys a family's C
code can read (``bsk_spec_key``); nested values stay in the manifest only.  The compiler, code
generator and C runtime need nothing else: see the README's "Adding an op family".

Optionally, ``leaner(spec) -> spec or None``: the same kernel with a tile needing less shared memory
(fewer pipeline stages, a smaller tile).  PTX must also run on GPUs the build does not know, which
may offer only :func:`blocksparse.aot.targets.shared_limit` of an unknown arch; a PTX kernel over
that is recompiled with ``leaner`` tiles until it fits (see :func:`blocksparse.aot.build_sources`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

__all__ = ["CompileArgs", "Family", "registered"]

_FUNCTIONS = ("specializations", "kernel", "compile_args", "fields")


@dataclass(frozen=True)
class CompileArgs:
    """What ``triton.compile`` gets for one spec.

    ``signature``: every kernel parameter in order, Triton types (``"*bf16"``, ``"i32"``, ``"fp32"``,
    ``"tensordesc<bf16[64, 32]>"``) or ``"constexpr"``; ``constexprs``: their values; ``divisible``:
    parameters compiled assuming a multiple of 16 (pointers: 16-byte aligned), which the runtime
    checks at every launch; ``num_warps`` / ``num_stages``: compile options.
    """

    signature: dict
    constexprs: dict
    divisible: frozenset = field(default_factory=frozenset)
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class Family:
    """A registered family: its ``name`` and the module holding the four functions."""

    name: str
    module: ModuleType

    def __post_init__(self):
        missing = [f for f in _FUNCTIONS if not callable(getattr(self.module, f, None))]
        if missing:
            raise TypeError(f"op family {self.name!r}: {self.module.__name__} must define "
                            f"{', '.join(_FUNCTIONS)}; it lacks {', '.join(missing)}")
        if not self.name.isidentifier():
            raise ValueError(f"op family names must be identifiers; got {self.name!r}")

    def specializations(self, archs):
        return tuple(self.module.specializations(tuple(archs)))

    def kernel(self, spec):
        return self.module.kernel(spec)

    def compile_args(self, spec) -> CompileArgs:
        return self.module.compile_args(spec)

    def fields(self, spec) -> dict:
        return dict(self.module.fields(spec))

    def leaner(self, spec):
        """``spec`` with a tile needing less shared memory, or None (also for families without the hook)."""
        hook = getattr(self.module, "leaner", None)
        return hook(spec) if callable(hook) else None


def registered(names=None):
    """The :class:`Family` of each name (default: :data:`blocksparse.ops.AOT_FAMILIES`)."""
    if names is None:
        from ..ops import AOT_FAMILIES as names
    return tuple(Family(name, importlib.import_module(f"blocksparse.ops.{name}.aot")) for name in names)
