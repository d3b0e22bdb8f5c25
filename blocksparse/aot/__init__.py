"""Ahead-of-time compilation of the Triton kernels of every registered op family.

::

    family.registered()                  the families of blocksparse.ops.AOT_FAMILIES, each
                                         listing its specs (blocksparse/ops/<family>/aot.py)
      -> compile.compile_specs           triton.compile for an explicit target (no GPU needed)
      -> codegen.write_sources           cubins + generated launchers + manifest (bsk_specs.c)
      -> native                          with the runtime (src/runtime/) and the families' C
                                         (src/ops/): objects, or the kernel library _kernels.so

The kernel library serves the PyTorch frontend (through ctypes, :mod:`.abi`) and the TensorFlow
op library (linked against it).  ``python -m blocksparse.aot --out DIR [--archs 80,90] [--library]``
runs the steps (the wheel's build is ``scripts/build_ops.py``; the GPU check
``scripts/verify_aot.py``).  Nothing here knows an op family: see :mod:`.family`.
"""
from __future__ import annotations

import re
from pathlib import Path

from .. import _env
from .._version import minor_text
from .abi import ABI_VERSION
from .codegen import manifest_entry, write_sources
from .compile import AotError, compile_specs
from .family import registered

__all__ = ["DEFAULT_ARCHS", "ABI_VERSION", "parse_archs", "parse_filters", "resolve_archs", "collect",
           "build_sources", "AotError"]


#: Architectures compiled when nothing else says which.
DEFAULT_ARCHS = (80, 90)
MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"


def parse_filters(dtypes=None, block_sizes=None, families=None):
    """Command-line subsets (``"bf16,fp32"``, ``"32,64"``, ``"matmul"``) as :func:`collect`
    filters: values a spec's ``dtype`` / ``block_size`` field must take (a family whose specs have
    no such field is not filtered by it), and the families to build."""
    filters = {}
    if dtypes:
        filters["dtype"] = tuple(dtypes.split(","))
    if block_sizes:
        filters["block_size"] = tuple(int(b) for b in block_sizes.split(","))
    if families:
        filters["families"] = tuple(families.split(","))
    return filters


def parse_archs(text):
    """``"sm_80,sm_90"`` / ``"80 90"`` / a list of those -> ``(80, 90)`` (sorted, unique)."""
    items = re.split(r"[,\s]+", text.strip()) if isinstance(text, str) else [str(t) for t in text]
    archs = set()
    for item in filter(None, items):
        match = re.fullmatch(r"(?:sm_)?(\d{2,3})a?", item.strip())
        if not match:
            raise ValueError(f"archs must be GPU architectures like sm_80 or 90; got {item!r}")
        if int(match.group(1)) < 80:
            raise ValueError(f"the kernels need sm_80 or newer; got {item!r}")
        archs.add(int(match.group(1)))
    if not archs:
        raise ValueError(f"archs must name at least one architecture; got {text!r}")
    return tuple(sorted(archs))


def _matrix_archs(tf_version, matrix):
    """``archs`` of the build of ``tf_version`` in ``matrix.yaml`` (its defaults otherwise)."""
    try:
        import yaml
    except ImportError as exc:
        raise AotError(f"{matrix} lists the GPU architectures but PyYAML is not installed: pip "
                       "install pyyaml, or name them with BLOCKSPARSE_CUDA_ARCHS") from exc

    data = yaml.safe_load(Path(matrix).read_text()) or {}
    archs = (data.get("defaults") or {}).get("archs")
    minor = minor_text(tf_version) if tf_version else None
    for build in data.get("builds") or ():
        name = str(build.get("tensorflow"))
        if minor and (name == minor or (name == "nightly" and "dev" in str(tf_version))):
            archs = build.get("archs", archs)
    return parse_archs(archs) if archs else None


def resolve_archs(archs=None, tf_version=None, matrix=MATRIX):
    """The architectures to compile: ``archs`` if given, else ``BLOCKSPARSE_CUDA_ARCHS``, else the
    build of ``tf_version`` in ``matrix.yaml`` (when present), else :data:`DEFAULT_ARCHS`."""
    if archs:
        return parse_archs(archs)
    if _env.cuda_archs():
        return parse_archs(_env.cuda_archs())
    if Path(matrix).is_file():
        return _matrix_archs(tf_version, matrix) or DEFAULT_ARCHS
    return DEFAULT_ARCHS


def collect(archs, families=None, **fields):
    """``(family, spec)`` of every registered spec for ``archs`` whose fields match ``fields``
    (``name=values``: the spec's field ``name`` is one of ``values``, or the spec has no such field).

    ``families``: names to take (default: all of :data:`blocksparse.ops.AOT_FAMILIES`), or
    :class:`.family.Family` objects (tests register their own).
    """
    chosen = [f for f in (families or ()) if not isinstance(f, str)]
    names = [f for f in (families or ()) if isinstance(f, str)]
    if names or not chosen:
        chosen += registered(names or None)
    out = []
    for family in chosen:
        for spec in family.specializations(archs):
            values = family.fields(spec)
            if all(values[k] in allowed for k, allowed in fields.items() if k in values):
                out.append((family, spec))
    return out


def build_sources(archs, out_dir, *, jobs=None, families=None, **fields):
    """Compile the registered specs for ``archs`` (``families`` and ``fields``: see :func:`collect`)
    and write the C sources under ``out_dir``.

    Returns ``(path of bsk_specs.c, manifest)``; the manifest (also embedded in the C file) lists
    the ABI, the archs, the Triton and CUDA-header versions and every spec.
    """
    import triton

    from .native import cuda_version

    work = collect(tuple(archs), families, **fields)
    if not work:
        raise AotError(f"no registered kernel matches archs {list(archs)}, families {families} and {fields}")
    kernels = compile_specs(work, jobs=jobs)
    manifest = {"abi": ABI_VERSION, "archs": [f"sm_{a}" for a in archs], "triton": triton.__version__,
                "cuda": cuda_version(), "families": sorted({k.family for k in kernels}),
                "specializations": [manifest_entry(k) for k in kernels]}
    return write_sources(kernels, out_dir, manifest), manifest
