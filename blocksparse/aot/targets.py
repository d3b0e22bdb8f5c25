"""GPU targets of a build and which compiled image serves a GPU: the Python mirror of the runtime's
``bsk_arch_rank``, ``bsk_arch_shared_limit`` and ``bsk_spec_rank`` (``src/runtime/bsk.c``; the
tests hold them equal), for callers that read a build's manifest without loading it
(:func:`blocksparse.build_info`, the TensorFlow frontend's table planning).

A build compiles cubins for ``sm_XY`` targets and, optionally, PTX for ``compute_XY`` targets::

    sm_80 cubin     runs on 8.0 and later minors of 8 (8.6, 8.9)
    sm_90 cubin     Triton compiles sm_90 and newer arch-specifically (sm_90a, sm_100a, sm_120a):
                    runs on exactly that GPU
    compute_80 PTX  the pointer kernels, JIT-compiled by the driver on 8.0 and any later GPU

A GPU takes the newest cubin that runs on it, else the newest PTX, else nothing (the callers'
fallback: Triton's JIT in PyTorch, the reference path in TensorFlow) -- among the kernels that fit
the GPU's shared memory per block (:func:`shared_limit`).  Cheap to import.
"""
from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["CUBIN", "CUBIN_EXACT", "PTX", "IMAGE_NAMES", "PTX_ARCHS", "Targets", "parse_targets", "image_of",
           "rank", "SHARED_LIMITS", "shared_limit", "spec_rank", "parse_gpu", "target_of", "serving",
           "BuiltImages"]

#: How a spec's image reaches GPUs, as the runtime numbers them (BSK_IMAGE_*): a cubin for
#: ``sm_XY`` (runs on X.Y and later minors of X), an arch-specific cubin for ``sm_XYa`` (X.Y only),
#: PTX for ``compute_XY`` (the driver JIT-compiles it on X.Y and any later GPU).
CUBIN, CUBIN_EXACT, PTX = 0, 1, 2
#: The manifest's ``image`` of each kind.
IMAGE_NAMES = {CUBIN: "cubin", CUBIN_EXACT: "cubin", PTX: "ptx"}
#: PTX targets Triton emits without arch-specific features (from sm_90 on it targets sm_90a etc.).
PTX_ARCHS = range(80, 90)
#: Shared memory one block may use (opt-in maximum, bytes) per compute capability; others: 99 KiB.
SHARED_LIMITS = {80: 163 * 1024, 87: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024, 103: 227 * 1024}
_SHARED_DEFAULT = 99 * 1024


class Targets(NamedTuple):
    """``cubins``: architectures (``10 * major + minor``) to compile cubins for; ``ptx``: those to
    compile the portable kernels' PTX for."""

    cubins: tuple
    ptx: tuple

    def __str__(self):
        return ",".join([*(f"sm_{a}" for a in self.cubins), *(f"compute_{a}" for a in self.ptx)])


def parse_targets(text):
    """``"sm_80,sm_90 compute_80"`` (or a list of those) -> :class:`Targets` (sorted, unique).

    ``sm_XY`` (``sm_XYa``, ``XY`` alike) asks for cubins, ``compute_XY`` for PTX (8.0 to 8.9 only:
    the PTX of newer targets is arch-specific and no later GPU can JIT it).
    """
    items = re.split(r"[,\s]+", text.strip()) if isinstance(text, str) else [str(t) for t in text]
    cubins, ptx = set(), set()
    for item in filter(None, items):
        match = re.fullmatch(r"(?:sm_)?(\d{2,3})a?|compute_(\d{2,3})", item.strip())
        if not match:
            raise ValueError(f"archs must be GPU architectures like sm_80, 90 or compute_80; got {item!r}")
        arch = int(match.group(1) or match.group(2))
        if arch < 80:
            raise ValueError(f"the kernels need sm_80 or newer; got {item!r}")
        if match.group(2) and arch not in PTX_ARCHS:
            raise ValueError(f"PTX targets must be compute_80 to compute_89 (Triton compiles sm_90 and newer "
                             f"arch-specifically, which no later GPU can JIT); got {item!r}")
        (ptx if match.group(2) else cubins).add(arch)
    if not cubins and not ptx:
        raise ValueError(f"archs must name at least one architecture; got {text!r}")
    return Targets(tuple(sorted(cubins)), tuple(sorted(ptx)))


def image_of(target):
    """``(compiled arch, image kind)`` of a compiled target: ``"sm_80"``, ``"sm_90a"``, ``"compute_80"``."""
    match = re.fullmatch(r"sm_(\d{2,3})(a?)|compute_(\d{2,3})", target)
    if not match:
        raise ValueError(f"target must be like sm_80, sm_90a or compute_80; got {target!r}")
    if match.group(3):
        return int(match.group(3)), PTX
    return int(match.group(1)), CUBIN_EXACT if match.group(2) else CUBIN


def rank(target, arch):
    """How well the image compiled for ``target`` (see :func:`image_of`) serves a GPU of ``arch``:
    0 when it cannot run there, else larger is better (any cubin over PTX, then the newest
    compiled arch).  Must equal the runtime's ``bsk_arch_rank(*image_of(target), arch)``."""
    compiled, image = image_of(target)
    if image == PTX:
        return compiled if compiled <= arch else 0
    if image == CUBIN_EXACT:
        runs = compiled == arch
    else:
        runs = compiled // 10 == arch // 10 and compiled % 10 <= arch % 10
    return 1000 + compiled if runs else 0


def shared_limit(arch):
    """Shared memory (bytes) one block may use on ``sm_{arch}``; for an architecture the table does
    not know, the smallest of recent ones (99 KiB).  Must equal the runtime's ``bsk_arch_shared_limit``."""
    return SHARED_LIMITS.get(arch, _SHARED_DEFAULT)


def spec_rank(spec, arch):
    """:func:`rank` of a manifest record on ``sm_{arch}``, 0 where its shared memory exceeds
    :func:`shared_limit` (the runtime's ``bsk_spec_rank``)."""
    return rank(target_of(spec), arch) if spec.get("shared", 0) <= shared_limit(arch) else 0


def parse_gpu(arch):
    """A GPU's compute capability as ``10 * major + minor``: from ``100``, ``"sm_100"``, ``"10.0"``
    or ``(10, 0)``."""
    expected = "a compute capability like 100, 'sm_100', '10.0' or (10, 0)"
    if isinstance(arch, bool) or not isinstance(arch, (int, str, tuple)):  # ValueError, as for any bad value
        raise ValueError(f"arch must be {expected}; got {arch!r} of type {type(arch).__name__}")
    if isinstance(arch, tuple) and len(arch) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 99 for v in arch) and 0 <= arch[1] <= 9:
        return 10 * arch[0] + arch[1]
    if isinstance(arch, int) and 10 <= arch <= 999:  # what "sm_NN" / "sm_NNN" can name
        return arch
    if isinstance(arch, str):
        match = re.fullmatch(r"sm_(\d{2,3})a?|(\d{1,2})\.(\d)", arch.strip())
        if match:
            return int(match.group(1)) if match.group(1) else 10 * int(match.group(2)) + int(match.group(3))
    raise ValueError(f"arch must be {expected}; got {arch!r}")


def target_of(spec):
    """The compiled target of a manifest record (``"sm_90a"``, ``"compute_80"``)."""
    return spec.get("target") or f"sm_{spec['arch']}"


def serving(specs, arch, fallback):
    """Which image of a build (``specs``: its manifest's records) would serve a GPU of ``arch``:
    ``{"arch": "sm_100", "image": "cubin" | "ptx" | None, "target": "sm_100a" | "compute_80" |
    None}``; where none does, ``"fallback"`` says what runs instead.

    Per library: the best spec that fits the GPU's shared memory (:func:`spec_rank`); a call takes
    the best of its own kind, and a build compiles the same kinds for every target.
    """
    gpu = parse_gpu(arch)
    best = max(specs, key=lambda s: spec_rank(s, gpu), default=None)
    if best is None or not spec_rank(best, gpu):
        return {"arch": f"sm_{gpu}", "image": None, "target": None, "fallback": fallback}
    return {"arch": f"sm_{gpu}", "image": IMAGE_NAMES[image_of(target_of(best))[1]], "target": target_of(best)}


class BuiltImages:
    """What a loaded build holds, from its manifest's ``specs`` (a mixin: the class sets ``specs``)."""

    specs: tuple

    def _archs(self, image):
        return tuple(sorted({s["arch"] for s in self.specs if s["image"] == image}))

    @property
    def archs(self):
        """Architectures with cubins, e.g. ``(80, 90)``."""
        return self._archs("cubin")

    @property
    def ptx(self):
        """Architectures of the forward-compatible PTX, e.g. ``(80,)`` (empty without)."""
        return self._archs("ptx")
