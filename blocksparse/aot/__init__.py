"""Ahead-of-time compilation of the Triton kernels of every registered op family.

::

    family.registered()                  the families of blocksparse.ops.AOT_FAMILIES, each
                                         listing its specs (blocksparse/ops/<family>/aot.py)
      -> compile.compile_specs           triton.compile for an explicit target (no GPU needed)
      -> codegen.write_sources           cubins + generated launchers + manifest (bsk_specs.c)
      -> native                          with the runtime (src/runtime/) and the families' C
                                         (src/ops/): objects, or the kernel library _kernels.so

The kernel library serves the PyTorch frontend (through ctypes, :mod:`.abi`) and the TensorFlow
op library (linked against it).  ``python -m blocksparse.aot --out DIR [--archs sm_80,sm_90,compute_80]
[--library]``
runs the steps (the wheel's build is ``scripts/build_ops.py``; the GPU check
``scripts/verify_aot.py``).  ``sm_XY`` targets get cubins; ``compute_XY`` targets the PTX of every
spec a family lists for that arch (the pointer kernels of sm_80), which the driver JIT-compiles on
any later GPU (see :mod:`.targets`).  Nothing here knows an op family: see :mod:`.family`.
"""
from __future__ import annotations

from pathlib import Path

from .. import _env
from .._version import minor_text
from .abi import ABI_VERSION
from .codegen import manifest_entry, write_sources
from .compile import AotError, compile_specs
from .family import registered
from .targets import PTX, Targets, parse_targets, shared_limit

__all__ = ["DEFAULT_ARCHS", "ABI_VERSION", "Targets", "parse_archs", "parse_filters", "resolve_archs", "collect",
           "build_sources", "AotError"]


#: Architectures compiled when nothing else says which (cubins; no PTX).
DEFAULT_ARCHS = Targets((80, 90), ())
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
    """``"sm_80,sm_90,compute_80"`` / ``"80 90"`` / a list of those -> :class:`.targets.Targets`
    (cubin archs and PTX archs, each sorted and unique): :func:`.targets.parse_targets`."""
    return parse_targets(text)


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
    """The targets to compile (:class:`.targets.Targets`): ``archs`` if given, else
    ``BLOCKSPARSE_CUDA_ARCHS``, else the build of ``tf_version`` in ``matrix.yaml`` (when present),
    else :data:`DEFAULT_ARCHS`."""
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
    """Compile the registered specs for ``archs`` (:class:`.targets.Targets`, or the cubin archs
    alone) and write the C sources under ``out_dir`` (``families`` and ``fields``: see
    :func:`collect`).  A PTX target compiles every spec a family lists for that arch as PTX.

    Returns ``(path of bsk_specs.c, manifest)``; the manifest (also embedded in the C file) lists
    the ABI, the cubin archs, the PTX targets, the Triton and CUDA-header versions and every spec;
    ``dropped`` names the cubins left out because they need more shared memory than their GPU
    offers (:func:`.targets.shared_limit`).  PTX kernels are refitted to what a GPU this build does not
    know may offer (:func:`_fit_ptx`); ``ptx_oversized`` names those still over it (they serve only the
    known GPUs with more shared memory).
    """
    import triton

    from .native import cuda_version

    targets = archs if isinstance(archs, Targets) else Targets(tuple(archs), ())
    work = [(f, s, False) for f, s in collect(targets.cubins, families, **fields)] if targets.cubins else []
    if targets.ptx:
        work += [(f, s, True) for f, s in collect(targets.ptx, families, **fields)]
    if not work:
        raise AotError(f"no registered kernel matches archs {targets}, families {families} and {fields}")
    compiled = _fit_ptx(compile_specs(work, jobs=jobs), {f.name: f for f, _, _ in work}, jobs)
    # a cubin needing more shared memory than its own GPU offers could never launch
    fits = [k.image == PTX or k.shared <= shared_limit(k.spec.arch) for k in compiled]
    kernels = [k for k, fit in zip(compiled, fits) if fit]
    if not kernels:
        raise AotError(f"no kernel for archs {targets} fits its GPU's shared memory")
    manifest = {"abi": ABI_VERSION, "archs": [f"sm_{a}" for a in targets.cubins],
                "ptx": [f"compute_{a}" for a in targets.ptx], "triton": triton.__version__,
                "cuda": cuda_version(), "families": sorted({k.family for k in kernels}),
                "specializations": [manifest_entry(k) for k in kernels],
                "dropped": [f"{k.family}/{k.spec.name}: {k.shared} bytes of shared memory"
                            for k, fit in zip(compiled, fits) if not fit],
                "ptx_oversized": [f"{k.family}/{k.spec.name}: {k.shared} bytes of shared memory"
                                  for k in kernels if k.image == PTX and k.shared > shared_limit(None)]}
    return write_sources(kernels, out_dir, manifest), manifest


def _fit_ptx(compiled, families, jobs):
    """``compiled`` with each PTX kernel over the shared memory of an unknown GPU
    (``shared_limit(None)``: PTX is what later GPUs run) recompiled with its family's ``leaner``
    tiles until it fits or the family offers none leaner."""
    compiled = list(compiled)
    while True:
        retry = [(i, families[k.family], families[k.family].leaner(k.spec)) for i, k in enumerate(compiled)
                 if k.image == PTX and k.shared > shared_limit(None)]
        retry = [(i, family, spec) for i, family, spec in retry if spec is not None]
        if not retry:
            return compiled
        for (i, _, _), kernel in zip(retry, compile_specs([(f, s, True) for _, f, s in retry], jobs=jobs)):
            compiled[i] = kernel
