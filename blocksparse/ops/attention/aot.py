"""What ``triton.compile`` gets for the fused attention kernels, without a GPU: signature and
constexprs of one specialisation, mirroring the JIT call sites in
:mod:`blocksparse.torch._attention.launch` (same kernels, tiles and tensor-descriptor blocks).

Not listed in :data:`blocksparse.ops.AOT_FAMILIES` yet (no TensorFlow op serves attention); the
tests compile a few specialisations for sm_90 and sm_80 so that a kernel that the interpreter runs
but the GPU compiler rejects fails on the CPU.
"""
from __future__ import annotations

__all__ = ["KERNELS", "compile_args", "compile_kernel"]

#: kernel name -> (tensor parameters with the tile whose rows their descriptor block holds)
KERNELS = {
    "attn_fwd_kernel": {"Q": "BM", "K": "BN", "V": "BN", "O": "BM"},
    "attn_bwd_kernel": {"Q1": "BM1", "K1": "BN1", "V1": "BN1", "DO1": "BM1", "DK": "BN1", "DV": "BN1",
                        "Q2": "BM2", "K2": "BN2", "V2": "BN2", "O": "BM2", "DO2": "BM2", "DQ": "BM2"},
    "attn_bwd_delta_kernel": {"O": "BM2", "DO": "BM2"},
}
_POINTERS = {"LSE": "*fp32", "DELTA": "*fp32", "SEQLENS": "*i32", "MASKS": "*u8",
             **{f"{lists}{table}": "*i32" for lists in ("", "ROW_", "COL_") for table in ("HEADERS", "ENTRIES", "ORDER")}}
_FLOATS = {"qk_scale": "fp32", "sm_scale": "fp32"}


def _function(name):
    from . import bwd, fwd

    return getattr(fwd if name == "attn_fwd_kernel" else bwd, name)


def compile_args(kernel, *, dtype, head_dim, block_size, cfg, causal=False, seqlens=False, masks=False,
                 dkdv=True, dq=True):
    """``(signature, constexprs)`` of ``kernel`` for one specialisation.

    ``dtype`` is Triton's name (``"bf16"``, ``"fp16"``); ``cfg`` a
    :class:`~blocksparse.ops.attention.configs.FwdConfig` (forward) or ``BwdConfig`` (the others),
    already fitted to the block size; ``dkdv`` / ``dq``: the kinds of program an ``attn_bwd_kernel``
    launch runs; every other integer parameter is an ``i32``.
    """
    fn = _function(kernel)
    tiles = {name: getattr(cfg, tile) for name, tile in KERNELS[kernel].items()}
    types = {name: f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}]>" if cfg.tma else f"*{dtype}"
             for name, rows in tiles.items()}
    types |= _POINTERS | _FLOATS
    if kernel == "attn_bwd_kernel" and cfg.atomic_dq:
        types["DQ"] = "*fp32"          # the dk/dv programs add dq through a pointer
    flags = dict(BS=block_size, D=head_dim, CAUSAL=causal, HAS_SEQLENS=seqlens, HAS_MASKS=masks, TMA=cfg.tma)
    if kernel == "attn_fwd_kernel":
        consts = dict(flags, BM=cfg.BM, BN=cfg.BN, WARP_SPECIALIZE=cfg.warp_specialize, PREFETCH=cfg.prefetch,
                      HEADS_FIRST=cfg.heads_first)
    elif kernel == "attn_bwd_kernel":
        consts = dict(flags, BM1=cfg.BM1, BN1=cfg.BN1, BM2=cfg.BM2, BN2=cfg.BN2, DKDV=dkdv, DQ_PASS=dq,
                      ATOMIC_DQ=cfg.atomic_dq, PREFETCH=cfg.prefetch, HEADS_FIRST=cfg.heads_first)
    else:
        consts = dict(BM=cfg.BM2, D=head_dim, TMA=cfg.tma)
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    return signature, consts


def compile_kernel(kernel, arch, **spec):
    """``triton.compile`` of ``kernel`` for ``sm_{arch}`` (see :func:`compile_args` for ``spec``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _function(kernel)
    if not hasattr(fn, "cache_key"):  # an InterpretedFunction
        raise RuntimeError("TRITON_INTERPRET is set: the kernels were loaded for Triton's CPU interpreter; "
                           "compiling for a GPU needs it unset")
    signature, consts = compile_args(kernel, **spec)
    cfg = spec["cfg"]
    return triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
