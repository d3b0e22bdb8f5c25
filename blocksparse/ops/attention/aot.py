"""The fused attention kernels' ahead-of-time registration (see :mod:`blocksparse.aot.family`), and
what ``triton.compile`` gets for one specialisation without a GPU, mirroring the launches of
:mod:`blocksparse.torch._attention.launch` (same kernels, tiles and tensor-descriptor blocks).

The kernel library holds what most models run, on Hopper and newer (tensor-descriptor tiles): 16-bit
inputs, head dims :data:`AOT_HEAD_DIMS`, block sizes :data:`AOT_BLOCK_SIZES`, causal or not, each
with the tile tables' configs (the backward's at both grid orders where the kept fraction picks one,
:data:`.configs.SPARSE_HEADS_FIRST`).  Ragged batches, element masks and other sizes launch through
Triton's JIT.  PyTorch launches the compiled specs through :mod:`blocksparse.torch._launch`: one C
call a launch instead of Triton's Python launcher.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ...aot.family import CompileArgs
from .configs import SPARSE_HEADS_FIRST, bwd_config, fwd_config

__all__ = ["AOT_BLOCK_SIZES", "AOT_HEAD_DIMS", "AttentionSpec", "DTYPES", "KERNELS", "backward_launches",
           "compile_args", "compile_kernel", "fields", "kernel", "specializations", "triton_args"]

DTYPES = ("bf16", "fp16")
#: Head dims and layout block sizes compiled into the kernel library.
AOT_HEAD_DIMS = (64, 128)
AOT_BLOCK_SIZES = (64, 128)
#: The oldest GPU the compiled specs serve: their tiles move through tensor descriptors.
MIN_ARCH = 90

#: kernel name -> (tensor parameters with the tile whose rows their descriptor block holds)
KERNELS = {
    "attn_fwd_kernel": {"Q": "BM", "K": "BN", "V": "BN", "O": "BM"},
    "attn_bwd_kernel": {"Q1": "BM1", "K1": "BN1", "V1": "BN1", "DO1": "BM1", "DK": "BN1", "DV": "BN1",
                        "Q2": "BM2", "K2": "BN2", "V2": "BN2", "O": "BM2", "DO2": "BM2", "DQ": "BM2"},
    "attn_bwd_delta_kernel": {"O": "BM2", "DO": "BM2"},
}
_POINTERS = {"LSE": "*fp32", "DELTA": "*fp32", "SEQLENS": "*i32", "MASKS": "*u8", "ROW_PAIRS": "*i32",
             **{f"{lists}{table}": "*i32" for lists in ("", "ROW_", "COL_") for table in ("HEADERS", "ENTRIES", "ORDER")}}
_FLOATS = {"qk_scale": "fp32", "sm_scale": "fp32"}


def _function(name):
    from . import bwd, fwd

    return getattr(fwd if name == "attn_fwd_kernel" else bwd, name)


def triton_args(kernel, *, dtype, head_dim, block_size, cfg, causal=False, seqlens=False, masks=False,
                dkdv=True, dq=True, unit=False):
    """``(signature, constexprs)`` of ``kernel`` for one specialisation.

    ``dtype`` is Triton's name (``"bf16"``, ``"fp16"``); ``cfg`` a
    :class:`~blocksparse.ops.attention.configs.FwdConfig` (forward) or ``BwdConfig`` (the others),
    already fitted to the block size; ``dkdv`` / ``dq``: the kinds of program an ``attn_bwd_kernel``
    launch runs; ``unit``: one query head a key/value head and one layout head for all heads
    (``GROUP = HL = 1``, compiled in); every other integer parameter is an ``i32``.
    """
    fn = _function(kernel)
    tiles = {name: getattr(cfg, tile) for name, tile in KERNELS[kernel].items()}
    types = {name: f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}]>" if cfg.tma else f"*{dtype}"
             for name, rows in tiles.items()}
    types |= _POINTERS | _FLOATS | {"DS": f"*{dtype}"}
    if kernel == "attn_bwd_kernel" and cfg.atomic_dq:
        # the dk/dv programs add dq into float32: [BM1, D] tiles through a descriptor, else by pointer
        types["DQ"] = f"tensordesc<fp32[1, 1, {cfg.BM1}, {head_dim}]>" if cfg.tma else "*fp32"
    flags = dict(BS=block_size, D=head_dim, CAUSAL=causal, HAS_SEQLENS=seqlens, HAS_MASKS=masks, TMA=cfg.tma)
    if kernel == "attn_fwd_kernel":
        consts = dict(flags, BM=cfg.BM, BN=cfg.BN, WARP_SPECIALIZE=cfg.warp_specialize, PREFETCH=cfg.prefetch,
                      HEADS_FIRST=cfg.heads_first)
    elif kernel == "attn_bwd_kernel":
        consts = dict(flags, BM1=cfg.BM1, BN1=cfg.BN1, BM2=cfg.BM2, BN2=cfg.BN2, DKDV=dkdv, DQ_PASS=dq,
                      ATOMIC_DQ=cfg.atomic_dq, PREFETCH=cfg.prefetch, HEADS_FIRST=cfg.heads_first,
                      STORE_DS=cfg.store_ds)
    else:
        consts = dict(BM=cfg.BM2, D=head_dim, TMA=cfg.tma)
    if unit and kernel != "attn_bwd_delta_kernel":
        consts |= dict(GROUP=1, HL=1)
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    return signature, consts


def compile_kernel(kernel, arch, **spec):
    """``triton.compile`` of ``kernel`` for ``sm_{arch}`` (see :func:`triton_args` for ``spec``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _function(kernel)
    if not hasattr(fn, "cache_key"):  # an InterpretedFunction
        raise RuntimeError("TRITON_INTERPRET is set: the kernels were loaded for Triton's CPU interpreter; "
                           "compiling for a GPU needs it unset")
    signature, consts = triton_args(kernel, **spec)
    cfg = spec["cfg"]
    return triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": _stages(kernel, cfg)})


def _stages(kernel, cfg):
    """Pipeline stages of a launch: the config's, Triton's default (3) for the delta pass."""
    return 3 if kernel == "attn_bwd_delta_kernel" else cfg.num_stages


@dataclass(frozen=True)
class AttentionSpec:
    """One compiled launch: ``kernel`` (a name of :data:`KERNELS`) with ``config`` (fitted to
    ``block_size``); ``dkdv`` / ``dq``: the kinds of program an ``attn_bwd_kernel`` launch runs.
    ``unit``: for launches with ``GROUP = HL = 1`` (no grouped-query heads, one layout shared by all
    heads), compiled in as Triton's JIT specialises them.  The delta pass depends on neither
    ``block_size`` nor ``causal`` beyond its tile (``config.BM2``)."""

    arch: int
    kernel: str
    dtype: str
    head_dim: int
    block_size: int
    config: object
    causal: bool = False
    dkdv: bool = True
    dq: bool = True
    unit: bool = False

    @property
    def product(self):
        return {"attn_fwd_kernel": "fwd", "attn_bwd_kernel": "bwd", "attn_bwd_delta_kernel": "delta"}[self.kernel]

    @property
    def name(self):
        cfg = self.config
        if self.product == "delta":
            return f"attn_delta_{self.dtype}_d{self.head_dim}_m{cfg.BM2}_w{cfg.num_warps}_sm{self.arch}"
        kinds = "" if self.product == "fwd" else "_" + "_".join(k for k, on in (("dkdv", self.dkdv), ("dq", self.dq))
                                                                 if on)
        flags = "".join(f for f, on in (("_causal", self.causal), ("_hf", cfg.heads_first),
                                        ("_ds", getattr(cfg, "store_ds", False))) if on)
        return (f"attn_{self.product}_{self.dtype}_d{self.head_dim}_b{self.block_size}{flags}{kinds}"
                f"{'_u' if self.unit else ''}_sm{self.arch}")


def backward_launches(cfg):
    """``(dkdv, dq)`` of each ``attn_bwd_kernel`` launch of a backward with ``cfg``, in order, and
    whether a delta pass runs first (see :mod:`.bwd`)."""
    if cfg.store_ds:
        return [(True, False), (False, True)], True
    if cfg.atomic_dq or cfg.fused:
        return [(True, not cfg.atomic_dq)], True
    return [(False, True), (True, False)], False


def _backward_configs(head_dim, block_size):
    """The backward configs a layout may take: the table's, at both grid orders where the layout's
    kept fraction picks one (:func:`.configs.bwd_config`)."""
    cfg = bwd_config(head_dim, block_size)
    if head_dim in SPARSE_HEADS_FIRST:
        return [cfg, replace(cfg, heads_first=not cfg.heads_first)]
    return [cfg]


def specializations(archs):
    """Every spec for ``archs`` (none below :data:`MIN_ARCH`)."""
    specs = {}
    for arch in (a for a in archs if a >= MIN_ARCH):
        for dtype in DTYPES:
            for d in AOT_HEAD_DIMS:
                for bs in AOT_BLOCK_SIZES:
                    for causal in (False, True):
                        found = [AttentionSpec(arch, "attn_fwd_kernel", dtype, d, bs, fwd_config(d, bs), causal,
                                               unit=unit) for unit in (False, True)]
                        for cfg in _backward_configs(d, bs):
                            launches, delta = backward_launches(cfg)
                            found += [AttentionSpec(arch, "attn_bwd_kernel", dtype, d, bs, cfg, causal, dkdv, dq,
                                                    unit) for dkdv, dq in launches for unit in (False, True)]
                            if delta:
                                found.append(AttentionSpec(arch, "attn_bwd_delta_kernel", dtype, d, bs, cfg))
                        specs.update((s.name, s) for s in found)
    return list(specs.values())


def kernel(spec):
    return _function(spec.kernel)


def fields(spec):
    """What selects a spec at run time: product, dtype, head dim, and for the forward and backward
    launches block size, ``causal``, the kinds of program and the whole config; the delta pass its
    tile (``bm``) and warps."""
    cfg = spec.config
    if spec.product == "delta":
        return {"product": "delta", "dtype": spec.dtype, "head_dim": spec.head_dim, "bm": cfg.BM2,
                "num_warps": cfg.num_warps}
    return {"product": spec.product, "dtype": spec.dtype, "head_dim": spec.head_dim, "block_size": spec.block_size,
            "causal": spec.causal, "dkdv": spec.dkdv, "dq": spec.dq, "unit": spec.unit,
            "heads_first": cfg.heads_first, "config": asdict(cfg)}


def compile_args(spec) -> CompileArgs:
    """The :class:`CompileArgs` of ``spec``: what :func:`triton_args` gives, compiled as Triton's JIT
    specialises the launches' values: the sequence length (a multiple of the block size) a multiple
    of 16, every pointer 16-byte aligned (the launcher's own buffers and tables)."""
    signature, consts = triton_args(spec.kernel, dtype=spec.dtype, head_dim=spec.head_dim,
                                    block_size=spec.block_size, cfg=spec.config, causal=spec.causal,
                                    dkdv=spec.dkdv, dq=spec.dq, unit=spec.unit)
    divisible = {"S"} | {name for name, ty in signature.items() if ty.startswith("*")}
    return CompileArgs(signature, consts, frozenset(divisible), spec.config.num_warps,
                       _stages(spec.kernel, spec.config))
