"""Compile specialisations with Triton for an explicit GPU target -- no GPU needed.

Each result holds the cubin and what a launcher must know: the kernel's symbol, warps, shared
memory, and its launch parameters in order.  Those follow Triton's CUDA launcher
(``triton/backends/nvidia/driver.py``): the non-constexpr parameters, each host tensor descriptor
expanded into a ``CUtensorMap`` passed by value, its shape (``i32`` each) and strides (``i64``
each), then two scratch pointers (global, profile).  The list is checked against the ``.param``
declarations of the kernel's PTX, so a change in Triton's calling convention fails the build
instead of a launch.
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from ..ops.matmul.aot import compile_args, kernel_function
from ..ops.matmul.configs import AotSpec

__all__ = ["Param", "TensorMap", "CompiledKernel", "compile_spec", "compile_specs", "AotError"]

#: Triton's tensor-map element types (device-side numbering) -> CUtensorMapDataType.
_TMA_DTYPE_TO_HOST = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}
_PARAM_BYTES = {"ptr": 8, "i32": 4, "i64": 8, "tensormap": 128}


class AotError(RuntimeError):
    """A specialisation cannot be compiled ahead of time (the message says which and why)."""


@dataclass(frozen=True)
class Param:
    """One launch parameter: ``kind`` is ``ptr``, ``i32``, ``i64`` or ``tensormap``; ``source``
    names the value: a kernel argument (``"N"``), a descriptor's map (``"x_desc"``), one of its
    fields (``"x_desc.shape[0]"``, ``"x_desc.strides[1]"``), or ``"scratch"``."""

    kind: str
    source: str


@dataclass(frozen=True)
class TensorMap:
    """How to encode the ``CUtensorMap`` of one descriptor parameter."""

    param: str
    data_type: int     # CUtensorMapDataType
    elem_size: int
    box: tuple         # block, outer dimension first
    swizzle: int       # CUtensorMapSwizzle


@dataclass(frozen=True)
class CompiledKernel:
    spec: AotSpec
    cubin: bytes
    function: str
    num_warps: int
    shared: int
    params: tuple
    tensormaps: tuple


def _target(arch):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


def _params(signature, tensordesc_meta, spec):
    params, maps = [], []
    meta = list(tensordesc_meta or [])
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc"):
            if not meta:
                raise AotError(f"{spec.name}: Triton did not lower {name} to a TMA descriptor "
                               f"on sm_{spec.arch}; descriptor kernels need sm_90 or newer")
            m = meta.pop(0)
            if m.get("fp4_padded"):
                raise AotError(f"{spec.name}: fp4-padded descriptors are not supported")
            maps.append(TensorMap(name, _TMA_DTYPE_TO_HOST[m["elem_type"]], m["elem_size"],
                                  tuple(m["block_size"]), m["swizzle"]))
            params += [Param("tensormap", name),
                       Param("i32", f"{name}.shape[0]"), Param("i32", f"{name}.shape[1]"),
                       Param("i64", f"{name}.strides[0]"), Param("i64", f"{name}.strides[1]")]
        elif ty.startswith("*"):
            params.append(Param("ptr", name))
        elif ty in ("i32", "i64"):
            params.append(Param(ty, name))
        else:
            raise AotError(f"{spec.name}: parameter {name} has type {ty}, which the AOT "
                           "launchers do not pass")
    params += [Param("ptr", "scratch"), Param("ptr", "scratch")]
    return tuple(params), tuple(maps)


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


def compile_spec(spec: AotSpec) -> CompiledKernel:
    """Compile ``spec`` for ``sm_{spec.arch}`` and describe its launch."""
    import triton
    from triton.compiler import ASTSource

    args = compile_args(spec)
    fn = kernel_function(spec.kernel)
    if not hasattr(fn, "cache_key"):  # an InterpretedFunction
        raise AotError("TRITON_INTERPRET is set, so the kernels were loaded for Triton's CPU "
                       "interpreter; ahead-of-time compilation needs it unset")
    index = {name: i for i, name in enumerate(fn.arg_names)}
    attrs = {(index[name],): [["tt.divisibility", 16]] for name in args.divisible}
    cfg = spec.config
    # without line info the cubins are a third of the size; the environment variable (not only
    # the knob) so that Triton's cache keys see it; scope() restores both
    with triton.knobs.compilation.scope():
        os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
        try:
            compiled = triton.compile(ASTSource(fn, args.signature, args.constexprs, attrs),
                                      target=_target(spec.arch),
                                      options={"num_warps": cfg.num_warps,
                                               "num_stages": cfg.num_stages})
        except Exception as exc:  # Triton raises many kinds; name the specialisation
            raise AotError(f"{spec.name}: triton.compile failed: {exc}") from exc
    md = compiled.metadata
    if md.global_scratch_size or md.profile_scratch_size:
        raise AotError(f"{spec.name}: the kernel needs scratch memory, which the AOT launchers "
                       "do not allocate")
    if md.num_ctas != 1 or md.launch_cooperative_grid or md.launch_pdl:
        raise AotError(f"{spec.name}: clusters, cooperative or PDL launches are not supported")
    params, maps = _params(args.signature, getattr(md, "tensordesc_meta", None), spec)
    if [_PARAM_BYTES[p.kind] for p in params] != _ptx_param_bytes(compiled.asm["ptx"], md.name):
        raise AotError(f"{spec.name}: the launch parameters do not match the kernel's PTX; "
                       "Triton's calling convention changed")
    return CompiledKernel(spec, compiled.asm["cubin"], md.name, md.num_warps, md.shared, params, maps)


def compile_specs(specs, jobs=None):
    """Compile every spec, ``jobs`` processes at a time (default: the CPUs); results in order."""
    specs = list(specs)
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1 or len(specs) <= 1:
        return [compile_spec(s) for s in specs]
    # spawn: Triton keeps threads and caches that a forked child must not inherit
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(compile_spec, specs, chunksize=max(1, len(specs) // (4 * jobs))))
