"""The transformer family's ahead-of-time registration (see :mod:`blocksparse.aot.family`): the
``nt`` / ``nn`` / ``tn`` products and the masked softmax and its gradient, for the TensorFlow op
library.

A spec fixes dtype and block size, and: for the products the head-dimension slice ``BD`` (every one
:func:`head_slice` picks, as the PyTorch launcher does) and, for ``xn``, ``TRANS_W`` (``tn``); for the
softmax whether it reads in-block masks and whether it applies the autoregressive rule.  Products
take ``PRECISION = "ieee"`` as the PyTorch frontend does (float32 products are exact, no TF32).
What holds for every TensorFlow call is compiled in: buffers are 16-byte aligned, activations dense
``(N, ctx, heads * head_dim)``, and the head dimension a multiple of 16 (so every feature offset and
row stride is one; the frontend sends other head dimensions to the reference path).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...aot.family import CompileArgs
from ..common.aot import signature
from ..matmul.configs import KERNEL_BLOCK_SIZES

__all__ = ["BstSpec", "DTYPES", "BLOCK_SIZES", "PRECISION", "MAX_BD", "PRODUCTS", "head_slice", "warps",
           "specializations", "kernel", "compile_args", "fields"]

DTYPES = ("fp16", "bf16", "fp32")
#: The block sizes the kernels take, those the PyTorch frontend runs them on (``tl.dot`` needs 16 or more).
BLOCK_SIZES = KERNEL_BLOCK_SIZES
#: As :data:`blocksparse.torch._transformer.ops.PRECISION`.
PRECISION = "ieee"
#: The widest head-dimension slice (64 for 128-blocks).
MAX_BD = 128
PRODUCTS = ("nt", "xn", "softmax", "softmax_grad")


def head_slice(head_dim, bs):
    """``BD``: the head dimension rounded up to a power of two, 16 to 128 (64 for 128-blocks, whose
    ``[128, BD]`` float32 accumulator would not fit the registers otherwise)."""
    bd = 16
    while bd < head_dim and bd < (MAX_BD if bs < 128 else MAX_BD // 2):
        bd *= 2
    return bd


def warps(bs):
    """Warps of every transformer kernel of block size ``bs``."""
    return 4 if bs <= 32 else 8


@dataclass(frozen=True)
class BstSpec:
    """One kernel: ``product`` one of :data:`PRODUCTS`; ``bd`` and ``trans`` for the products,
    ``has_mask`` and ``autoregress`` for the softmax."""

    arch: int
    product: str
    dtype: str
    block_size: int
    bd: int = 0
    trans: bool = False
    has_mask: bool = False
    autoregress: bool = False

    @property
    def name(self):
        variant = {"nt": f"_d{self.bd}", "xn": f"{'_t' if self.trans else ''}_d{self.bd}",
                   "softmax": f"{'_mask' if self.has_mask else ''}{'_ar' if self.autoregress else ''}",
                   "softmax_grad": ""}[self.product]
        return f"bst_{self.product}_{self.dtype}_b{self.block_size}{variant}_sm{self.arch}"


def _slices(bs):
    bd, out = 16, []
    while bd <= head_slice(1 << 20, bs):
        out.append(bd)
        bd *= 2
    return out


def specializations(archs):
    """Every spec for ``archs``: per arch, dtype and block size, ``nt`` and ``xn`` (both directions)
    for each head slice, the softmax with and without masks and the autoregressive rule, and its
    gradient."""
    specs = []
    for arch in archs:
        for dtype in DTYPES:
            for bs in BLOCK_SIZES:
                for bd in _slices(bs):
                    specs.append(BstSpec(arch, "nt", dtype, bs, bd))
                    specs += [BstSpec(arch, "xn", dtype, bs, bd, trans) for trans in (False, True)]
                specs += [BstSpec(arch, "softmax", dtype, bs, has_mask=m, autoregress=ar)
                          for m in (False, True) for ar in (False, True)]
                specs.append(BstSpec(arch, "softmax_grad", dtype, bs))
    return specs


def kernel(spec):
    from .products import bst_nt_kernel, bst_xn_kernel
    from .softmax import bst_softmax_grad_kernel, bst_softmax_kernel

    return {"nt": bst_nt_kernel, "xn": bst_xn_kernel, "softmax": bst_softmax_kernel,
            "softmax_grad": bst_softmax_grad_kernel}[spec.product]


def fields(spec):
    """What selects ``spec`` at run time (all C keys): product, dtype, block_size, bd, trans,
    has_mask, autoregress."""
    return {"product": spec.product, "dtype": spec.dtype, "block_size": spec.block_size, "bd": spec.bd,
            "trans": spec.trans, "has_mask": spec.has_mask, "autoregress": spec.autoregress}


_I32 = "i32"
#: Per product: data pointers, table pointers, int32 scalars (float32 ``scale`` apart), and the
#: scalars compiled as multiples of 16 (head dimension and strides).
_ARGS = {
    "nt": (("A", "B", "C"), ("COORDS",), ("blocks", "heads", "lut_heads", "head_dim", "stride_an", "stride_at",
                                          "stride_bn", "stride_bt")),
    "xn": (("W", "X", "Y"), ("OFFSETS", "BLOCK_IDS", "COORDS"),
           ("blocks", "heads", "lut_heads", "out_blocks", "head_dim", "stride_xn", "stride_xt", "stride_yn",
            "stride_yt")),
    "softmax": (("X", "Y"), ("ROW_OFFSETS", "COORDS", "MASK_INDEX", "MASK_BITS"),
                ("ar_key", "blocks", "heads", "lut_heads", "q_blocks")),
    "softmax_grad": (("DY", "Y", "DX"), ("ROW_OFFSETS",), ("blocks", "heads", "lut_heads", "q_blocks")),
}


def compile_args(spec) -> CompileArgs:
    """The :class:`CompileArgs` of ``spec``, in the parameter order of its kernel."""
    data, tables, ints = _ARGS[spec.product]
    types = {p: f"*{spec.dtype}" for p in data} | {p: "*i32" for p in tables} | {p: _I32 for p in ints}
    aligned = {p for p in ints if p == "head_dim" or p.startswith("stride_")}
    bs = spec.block_size
    if spec.product in ("nt", "xn"):
        consts = {"BS": bs, "BD": spec.bd, "PRECISION": PRECISION} | ({"TRANS_W": spec.trans} if spec.product == "xn"
                                                                     else {})
    else:
        types["scale"] = "fp32"
        consts = {"BS": bs}
        if spec.product == "softmax":
            consts |= {"WORDS": -(-bs // 32), "HAS_MASK": spec.has_mask, "AUTOREGRESS": spec.autoregress}
    return CompileArgs(signature(kernel(spec), types, consts), consts, frozenset({*data, *tables, *aligned}),
                       num_warps=warps(bs), num_stages=3)
