"""Compile registered specs with Triton for an explicit GPU target -- no GPU needed.

Each result holds the cubin and what a launcher must know: the kernel's symbol, warps, shared
memory, and its arguments in order (:class:`Param`: the kernel's non-constexpr parameters).  A spec
compiled as PTX (``ptx=True``: a pointer kernel for ``compute_80``, forward compatible) carries
the kernel's PTX text instead of a cubin, for the driver to JIT-compile on any later GPU.  The
launch parameters follow Triton's CUDA launcher (``triton/backends/nvidia/driver.py``): each
argument in order, a host tensor descriptor expanded into a ``CUtensorMap`` passed by value, its
shape (``i32`` each) and strides (``i64`` each), then two scratch pointers (global, profile).  The
list is checked against the ``.param`` declarations of the kernel's PTX, so a change in Triton's
calling convention fails the build instead of a launch.  Nothing here knows an op family.
"""
from __future__ import annotations

import importlib
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from .family import Family
from .targets import PTX, image_of

__all__ = ["Param", "TensorMap", "CompiledKernel", "compile_spec", "compile_specs", "launch_param_bytes",
           "AotError", "KINDS"]

#: Triton parameter types the generated launchers pass -> the runtime's argument kinds.
KINDS = {"i32": "i32", "i64": "i64", "fp32": "f32"}
#: Triton's tensor-map element types (device-side numbering) -> CUtensorMapDataType.
_TMA_DTYPE_TO_HOST = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}
_KIND_BYTES = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4}
#: Tensor descriptors of at most this many dimensions (the tensor memory accelerator's limit).
MAX_RANK = 5


class AotError(RuntimeError):
    """A spec cannot be compiled ahead of time (the message says which and why)."""


@dataclass(frozen=True)
class Param:
    """One kernel argument as the runtime receives it: ``kind`` is ``ptr``, ``i32``, ``i64``,
    ``f32`` or ``tensor`` (a host tensor descriptor of ``rank`` dimensions); ``divisible``: compiled
    assuming a multiple of 16 (a pointer: 16-byte aligned)."""

    name: str
    kind: str
    divisible: bool = False
    rank: int = 0
    type: str = ""     # Triton's type of the parameter ("*bf16", "i32", "tensordesc<...>")


@dataclass(frozen=True)
class TensorMap:
    """How to encode the ``CUtensorMap`` of one descriptor argument (the box is fixed at compile
    time; the tensor's base, shape and strides come with each launch)."""

    param: str
    data_type: int     # CUtensorMapDataType
    elem_size: int
    box: tuple         # block, outermost dimension first
    swizzle: int       # CUtensorMapSwizzle


@dataclass(frozen=True)
class CompiledKernel:
    """One compiled spec.  ``cubin``: the image the driver loads (a cubin, or NUL-terminated PTX
    text); ``target``: what it was compiled for (``"sm_80"``, ``"sm_90a"``, ``"compute_80"``);
    ``ptx_isa``: the PTX ISA version (a driver must know it to JIT the PTX)."""

    family: str
    spec: object
    fields: dict
    kernel: str        # the @triton.jit function's name
    cubin: bytes
    function: str      # its symbol in the cubin
    num_warps: int
    num_stages: int
    shared: int
    params: tuple      # Param, in the kernel's order
    tensormaps: tuple  # TensorMap, in the order of the tensor params
    constexprs: dict
    target: str = ""
    ptx_isa: str = ""

    @property
    def image(self):
        """The runtime's image kind (:data:`.targets.CUBIN`, ``CUBIN_EXACT`` or ``PTX``)."""
        return image_of(self.target or f"sm_{self.spec.arch}")[1]

    @property
    def symbol(self):
        """A C identifier unique within a build: family and spec name (and ``_ptx`` for PTX)."""
        return f"{self.family}_{self.spec.name}" + ("_ptx" if self.image == PTX else "")


def _target(arch):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


def _params(signature, divisible, tensordesc_meta, name, arch):
    params, maps = [], []
    meta = list(tensordesc_meta or [])
    for arg, ty in signature.items():
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc"):
            if not meta:
                raise AotError(f"{name}: Triton did not lower {arg} to a TMA descriptor on sm_{arch}; "
                               "descriptor kernels need sm_90 or newer")
            m = meta.pop(0)
            if m.get("fp4_padded"):
                raise AotError(f"{name}: fp4-padded descriptors are not supported")
            rank = len(m["block_size"])
            if not 1 <= rank <= MAX_RANK:
                raise AotError(f"{name}: descriptor {arg} has {rank} dimensions; at most {MAX_RANK}")
            maps.append(TensorMap(arg, _TMA_DTYPE_TO_HOST[m["elem_type"]], m["elem_size"],
                                  tuple(m["block_size"]), m["swizzle"]))
            params.append(Param(arg, "tensor", False, rank, ty))
        elif ty.startswith("*"):
            params.append(Param(arg, "ptr", arg in divisible, 0, ty))
        elif ty in KINDS:
            params.append(Param(arg, KINDS[ty], arg in divisible, 0, ty))
        else:
            raise AotError(f"{name}: parameter {arg} has type {ty}, which the AOT launchers do not "
                           f"pass (pointers, {', '.join(KINDS)} and tensor descriptors)")
    return tuple(params), tuple(maps)


def launch_param_bytes(params):
    """Sizes of the launch parameters Triton's convention derives from ``params`` (see module doc)."""
    sizes = []
    for p in params:
        sizes += [128] + [4] * p.rank + [8] * p.rank if p.kind == "tensor" else [_KIND_BYTES[p.kind]]
    return sizes + [8, 8]


def _ptx_param_bytes(ptx, function):
    entry = re.search(r"\.entry\s+" + re.escape(function) + r"\s*\((.*?)\)", ptx, re.S)
    if not entry:
        raise AotError(f"kernel {function} not found in its PTX")
    sizes = []
    for decl in entry.group(1).split(","):  # ".param .u64 .ptr ... name" / ".param .b8 name[128]"
        bits = re.search(r"\.[ubsf](\d+)\b", decl)
        count = re.search(r"\[(\d+)\]", decl)
        sizes.append(int(bits.group(1)) // 8 * (int(count.group(1)) if count else 1))
    return sizes


def _ptx_target(ptx, name):
    """``(.target, .version)`` of Triton's PTX."""
    target = re.search(r"^\s*\.target\s+(sm_\d+a?)", ptx, re.M)
    version = re.search(r"^\s*\.version\s+(\d+\.\d+)", ptx, re.M)
    if not target or not version:
        raise AotError(f"{name}: Triton's PTX names no .target or .version")
    return target.group(1), version.group(1)


def compile_spec(family: Family, spec, ptx=False) -> CompiledKernel:
    """Compile ``spec`` of ``family`` for ``sm_{spec.arch}`` and describe its launch; ``ptx``: keep
    the forward-compatible PTX (``compute_{spec.arch}``) instead of the cubin."""
    import triton
    from triton.compiler import ASTSource

    name = f"{family.name}/{spec.name}"
    args = family.compile_args(spec)
    fn = family.kernel(spec)
    if not hasattr(fn, "cache_key"):  # an InterpretedFunction
        raise AotError("TRITON_INTERPRET is set, so the kernels were loaded for Triton's CPU "
                       "interpreter; ahead-of-time compilation needs it unset")
    if list(args.signature) != list(fn.arg_names):
        raise AotError(f"{name}: the signature names {list(args.signature)}; the kernel "
                       f"{fn.__name__} takes {list(fn.arg_names)}")
    index = {arg: i for i, arg in enumerate(fn.arg_names)}
    attrs = {(index[arg],): [["tt.divisibility", 16]] for arg in args.divisible}
    # without line info the cubins are a third of the size; the environment variable (not only
    # the knob) so that Triton's cache keys see it; scope() restores both
    with triton.knobs.compilation.scope():
        os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
        try:
            compiled = triton.compile(ASTSource(fn, args.signature, args.constexprs, attrs),
                                      target=_target(spec.arch),
                                      options={"num_warps": args.num_warps, "num_stages": args.num_stages})
        except Exception as exc:  # Triton raises many kinds; name the spec
            raise AotError(f"{name}: triton.compile failed: {exc}") from exc
    md = compiled.metadata
    if md.global_scratch_size or md.profile_scratch_size:
        raise AotError(f"{name}: the kernel needs scratch memory, which the AOT launchers do not allocate")
    if md.num_ctas != 1 or md.launch_cooperative_grid or md.launch_pdl:
        raise AotError(f"{name}: clusters, cooperative or PDL launches are not supported")
    params, maps = _params(args.signature, args.divisible, getattr(md, "tensordesc_meta", None), name,
                           spec.arch)
    if launch_param_bytes(params) != _ptx_param_bytes(compiled.asm["ptx"], md.name):
        raise AotError(f"{name}: the launch parameters do not match the kernel's PTX; Triton's "
                       "calling convention changed")
    target, isa = _ptx_target(compiled.asm["ptx"], name)
    image = compiled.asm["cubin"]
    if ptx:
        if target.endswith("a") or maps:
            raise AotError(f"{name}: only pointer kernels compiled for sm_80 to sm_89 have forward-compatible "
                           f"PTX; this one targets {target}{' with tensor descriptors' if maps else ''}")
        target, image = f"compute_{spec.arch}", compiled.asm["ptx"].encode() + b"\0"
    return CompiledKernel(family.name, spec, family.fields(spec), fn.__name__, image, md.name,
                          md.num_warps, args.num_stages, md.shared, params, maps, dict(args.constexprs),
                          target, isa)


def _compile_in_worker(job):
    family_name, module_name, spec, ptx = job
    return compile_spec(Family(family_name, importlib.import_module(module_name)), spec, ptx)


def compile_specs(jobs_list, jobs=None):
    """Compile every ``(family, spec)`` (as a cubin) or ``(family, spec, ptx)``, ``jobs`` processes
    at a time (default: the CPUs); results in order."""
    work = [(*job, False)[:3] for job in jobs_list]
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1 or len(work) <= 1:
        return [compile_spec(*job) for job in work]
    # spawn: Triton keeps threads and caches that a forked child must not inherit; a worker
    # imports the family's module by name
    tasks = [(f.name, f.module.__name__, s, ptx) for f, s, ptx in work]
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_compile_in_worker, tasks, chunksize=max(1, len(tasks) // (4 * jobs))))
