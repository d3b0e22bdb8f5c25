"""Ahead-of-time compilation of the Triton kernels, for the TensorFlow op library.

::

    configs.aot_specializations(archs)   the list, in one place
      -> compile.compile_specs           triton.compile for an explicit target (no GPU needed)
      -> codegen.write_sources           cubins + generated launchers + manifest (bsk_specs.c)
      -> native                          with the runtime (src/runtime/): objects or a library

``python -m blocksparse.aot --out DIR [--archs 80,90] [--library]`` runs the steps (the
TensorFlow build is ``scripts/build_ops.py``; the GPU check ``scripts/verify_aot.py``).
"""
from __future__ import annotations

import re
from pathlib import Path

from .. import _env
from .._version import minor_text
from ..ops.matmul.configs import aot_specializations
from .codegen import manifest_entry, write_sources
from .compile import AotError, compile_specs

__all__ = ["DEFAULT_ARCHS", "parse_archs", "parse_filters", "resolve_archs", "build_sources",
           "AotError"]

#: Architectures compiled when nothing else says which.
DEFAULT_ARCHS = (80, 90)
MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"


def parse_filters(dtypes=None, block_sizes=None):
    """Command-line subsets (``"bf16,fp32"``, ``"32,64"``) as :func:`build_sources` filters."""
    filters = {}
    if dtypes:
        filters["dtypes"] = tuple(dtypes.split(","))
    if block_sizes:
        filters["block_sizes"] = tuple(int(b) for b in block_sizes.split(","))
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


def build_sources(archs, out_dir, *, jobs=None, **filters):
    """Compile :func:`aot_specializations` for ``archs`` (``filters``: its ``dtypes`` /
    ``block_sizes``) and write the C sources under ``out_dir``.

    Returns ``(path of bsk_specs.c, manifest)``; the manifest (also embedded in the C file) lists
    the archs, the Triton and CUDA-header versions and every specialisation.
    """
    import triton

    from .native import cuda_version

    specs = aot_specializations(tuple(archs), **filters)
    kernels = compile_specs(specs, jobs=jobs)
    manifest = {"abi": 1, "archs": [f"sm_{a}" for a in archs], "triton": triton.__version__,
                "cuda": cuda_version(), "specializations": [manifest_entry(k) for k in kernels]}
    return write_sources(kernels, out_dir, manifest), manifest
