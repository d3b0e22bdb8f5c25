"""The norms family's ahead-of-time registration (see :mod:`blocksparse.aot.family`): the layer-norm
forward and backward kernels for the TensorFlow op library, and the reduction of the backward's
partial ``dg`` / ``db`` rows.

A spec fixes dtype, the parameters' dtype, feature axis, relu and the tile (:func:`.configs.layer_norm_config` of the
segment length the tile was made for).  One tile serves every segment it covers: the kernels mask
features beyond the segment, so ``src/ops/norms.c`` takes the smallest one-chunk tile holding the
whole segment (``bc >= CS``), else the chunked tile.  What holds for every TensorFlow call is
compiled in: ``g`` and ``b`` are given, float32 (the TensorFlow frontend casts them) or -- for
16-bit activations -- of the activations' dtype (PyTorch's native op passes them so), activations
are dense (feature stride 1 for ``axis=1``, token stride 1 for ``axis=0``), buffers are 16-byte aligned, and
``(N, C)`` rows hold a multiple of 16 features (the frontend sends others to the reference path).

Triton vectorises a masked load only where it knows the mask's bound and the offsets to be
multiples of the vector: an ``aligned`` spec is compiled with the bound of the contiguous axis
divisible by 16 -- the segment length ``CS`` for ``(N, C)``, the token count ``N`` (and the row
stride) for ``(C, N)`` -- and the runtime takes it where the call has that; without it the loads
are scalar and the kernels ran at a third to two thirds of the speed.  Unaligned specs serve the
rest: ``(C, N)`` with the widest one-chunk tile of :data:`.configs.UNALIGNED_TOKEN_TILES` (smaller:
their loads are scalar) and the chunked one; ``(N, C)`` segments of up to
``UNALIGNED_MAX_ROW`` features one chunk each, longer ones chunked.

The aligned ``(C, N)`` backward of segments longer than its one-chunk tiles is the split backward
(:mod:`.split_bwd`): its two kernels are the products ``bwd_part`` and ``bwd_dx``, compiled in
place of the chunked ``bwd`` tile (:func:`.configs.split_backward_config`).  The split forward
(:mod:`.split_fwd`: ``fwd_stats``, ``fwd_merge``, ``fwd_apply``) is compiled beside the chunked
``fwd`` tile, for the large calls that take it (``min_elements``: :func:`.configs.split_forward_config`);
its statistics kernels do not depend on the relu or the parameters, and are compiled once (no
relu, float32 parameters).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..common.aot import SumRowsSpec, signature, sum_rows_compile_args, sum_rows_fields
from ...aot.family import CompileArgs
from .configs import (MAX_ROW, MERGE_WARPS, SPLIT_FWD, SPLIT_FWD_MIN_ELEMENTS, NormConfig, SplitConfig,
                      layer_norm_config, split_backward_config)

__all__ = ["NormSpec", "specializations", "kernel", "compile_args", "fields", "DTYPES", "MIN_ROW", "UNALIGNED_MAX_ROW",
           "SPLIT_PRODUCTS", "SPLIT_FWD_PRODUCTS"]

#: Triton dtype name -> element size.
DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4}
#: The narrowest tile compiled per axis (shorter segments take it, masked).
MIN_ROW = {1: 64, 0: 16}
#: The longest one-chunk tile of the unaligned ``(N, C)`` specs (segments of other than a multiple of
#: 16 features are short in practice; longer ones take the chunked tile).
UNALIGNED_MAX_ROW = 1024
#: The split backward's two kernels, in launch order.
SPLIT_PRODUCTS = ("bwd_part", "bwd_dx")
#: The split forward's three kernels, in launch order (the first two: statistics, whatever the relu
#: and the parameters).
SPLIT_FWD_PRODUCTS = ("fwd_stats", "fwd_merge", "fwd_apply")


@dataclass(frozen=True)
class NormSpec:
    """One layer-norm kernel: ``product`` ``"fwd"``, ``"bwd"`` or one of :data:`SPLIT_PRODUCTS` and
    :data:`SPLIT_FWD_PRODUCTS` (their ``config`` a :class:`SplitConfig`)."""

    arch: int
    product: str
    dtype: str
    axis: int
    relu: bool
    config: NormConfig | SplitConfig
    one_chunk: bool
    aligned: bool = True   # the contiguous axis' bound is a multiple of 16: CS (axis 1), N (axis 0)
    param: str = "fp32"    # the dtype of g and b: float32, or the activations' (16-bit) dtype

    @property
    def split(self):
        return self.product in SPLIT_PRODUCTS + SPLIT_FWD_PRODUCTS

    @property
    def name(self):
        tile = f"s{self.config.R}" if self.split else f"{'c' if self.one_chunk else 'k'}{self.config.BC}"
        param = "" if self.param == "fp32" else f"_g{self.param}"
        return (f"ln_{self.product}_{self.dtype}_a{self.axis}{'' if self.aligned else 'u'}"
                f"{'_relu' if self.relu else ''}{param}_{tile}_sm{self.arch}")


def _rows(axis, element_size, aligned, backward, relu):
    """Segment lengths whose tiles are compiled: powers of two up to the longest one-chunk tile
    (unaligned: ``(C, N)`` that one only, ``(N, C)`` up to :data:`UNALIGNED_MAX_ROW`), then one longer
    (the chunked tile)."""
    longest = layer_norm_config(axis, MAX_ROW * 2, element_size, backward, relu, aligned).BC
    row, top = MIN_ROW[axis], longest
    if not aligned:
        row, top = (longest, longest) if axis == 0 else (row, min(longest, UNALIGNED_MAX_ROW))
    rows = []
    while row <= top:
        rows.append(row)
        row *= 2
    return rows + [2 * longest]


def specializations(archs):
    """Every spec for ``archs``: per arch, dtype, parameter dtype (float32; 16-bit activations also
    their own, as PyTorch's layers keep ``g`` and ``b``), axis (and alignment), relu and direction,
    one tile per power-of-two segment length; and the reduction of ``dg`` and ``db``."""
    specs = []
    for arch in archs:
        for dtype, size in DTYPES.items():
            for param in sorted({"fp32", dtype}):
                for axis, aligned in ((1, True), (1, False), (0, True), (0, False)):
                    for relu in (False, True):
                        for product in ("fwd", "bwd"):
                            for row in _rows(axis, size, aligned, product == "bwd", relu):
                                split = product == "bwd" and split_backward_config(axis, row, size, relu, aligned)
                                if split:  # in place of the chunked tile
                                    specs += [NormSpec(arch, part, dtype, axis, relu, split, False, aligned, param)
                                              for part in SPLIT_PRODUCTS]
                                    continue
                                cfg = layer_norm_config(axis, row, size, product == "bwd", relu, aligned)
                                specs.append(NormSpec(arch, product, dtype, axis, relu, cfg, cfg.one_chunk(row),
                                                      aligned, param))
                                if product == "fwd" and axis == 0 and aligned and not cfg.one_chunk(row):
                                    specs += _split_forward(arch, dtype, relu, param)
        # dg and db in float32, or in the 16-bit parameters' dtype
        specs += SumRowsSpec.every(arch, has_b=True, outs=tuple(DTYPES), alignments=(True, False))
    return specs


def _split_forward(arch, dtype, relu, param):
    """The split forward's specs beside the chunked ``(C, N)`` tile: the statistics once per dtype."""
    cfg = SPLIT_FWD.get(DTYPES[dtype])
    if cfg is None:
        return []
    generic = not relu and param == "fp32"
    return [NormSpec(arch, part, dtype, 0, relu, cfg, False, True, param) for part in SPLIT_FWD_PRODUCTS
            if generic or part == "fwd_apply"]


def kernel(spec):
    from ..common.reduce import sum_rows_kernel
    from .layer_norm import layer_norm_bwd_kernel, layer_norm_fwd_kernel
    from .split_bwd import layer_norm_bwd_dx_kernel, layer_norm_bwd_part_kernel
    from .split_fwd import layer_norm_fwd_apply_kernel, layer_norm_fwd_merge_kernel, layer_norm_fwd_stats_kernel

    if isinstance(spec, SumRowsSpec):
        return sum_rows_kernel
    return {"fwd": layer_norm_fwd_kernel, "bwd": layer_norm_bwd_kernel, "bwd_part": layer_norm_bwd_part_kernel,
            "bwd_dx": layer_norm_bwd_dx_kernel, "fwd_stats": layer_norm_fwd_stats_kernel,
            "fwd_merge": layer_norm_fwd_merge_kernel, "fwd_apply": layer_norm_fwd_apply_kernel}[spec.product]


def fields(spec):
    """What selects ``spec`` at run time (scalars are C keys): product, dtype, the parameters' dtype
    ``param``, axis, aligned, relu, one_chunk, the tile (``bn``, ``bc``: the split kernels' step ``R``),
    ``programs_per_sm``, the split kernels' slices (``fs``, ``min_fs``; 0 for the others), the tokens x
    segment features from which the split forward runs (``min_elements``; 0 for the others), and the
    whole ``config``."""
    if isinstance(spec, SumRowsSpec):
        return sum_rows_fields(spec)
    cfg = spec.config
    return {"product": spec.product, "dtype": spec.dtype, "param": spec.param, "axis": spec.axis,
            "aligned": spec.aligned, "relu": spec.relu, "one_chunk": spec.one_chunk, "bn": cfg.BN,
            "bc": cfg.R if spec.split else cfg.BC, "programs_per_sm": cfg.programs_per_sm,
            "fs": cfg.FS if spec.split else 0, "min_fs": cfg.MIN_FS if spec.split else 0,
            "min_elements": SPLIT_FWD_MIN_ELEMENTS[DTYPES[spec.dtype]] if spec.product in SPLIT_FWD_PRODUCTS else 0,
            "config": asdict(cfg)}


def _stride_names(axis, tensors):
    """(unit, wide) stride parameters of ``tensors``: unit strides are 1, wide ones a multiple of 16."""
    unit = [f"stride_{t}{'f' if axis == 1 else 'n'}" for t in tensors]
    wide = [f"stride_{t}{'n' if axis == 1 else 'f'}" for t in tensors]
    return unit, wide


def compile_args(spec) -> CompileArgs:
    """The :class:`CompileArgs` of ``spec``, in the parameter order of its kernel."""
    if isinstance(spec, SumRowsSpec):
        return sum_rows_compile_args(spec)
    t, p = spec.dtype, spec.param
    if spec.product == "fwd":
        types = {"X": f"*{t}", "G": f"*{p}", "B": f"*{p}", "Y": f"*{t}", "MEAN": "*fp32", "RSTD": "*fp32",
                 "N": "i32", "CS": "i32", "epsilon": "fp32"}
        pointers, tensors = ("X", "G", "B", "Y", "MEAN", "RSTD"), ("x", "y")
    elif spec.product == "bwd":
        types = {"X": f"*{t}", "G": f"*{p}", "B": f"*{p}", "DY": f"*{t}", "DX": f"*{t}", "MEAN": "*fp32",
                 "RSTD": "*fp32", "DG_PART": "*fp32", "DB_PART": "*fp32", "N": "i32", "CS": "i32"}
        pointers, tensors = ("X", "G", "B", "DY", "DX", "MEAN", "RSTD", "DG_PART", "DB_PART"), ("x", "dy", "dx")
    elif spec.product == "fwd_stats":
        types = {"X": f"*{t}", "PART": "*fp32", "N": "i32", "CS": "i32", "FS": "i32"}
        pointers, tensors = ("X", "PART"), ("x",)
    elif spec.product == "fwd_merge":
        types = {"PART": "*fp32", "MEAN": "*fp32", "RSTD": "*fp32", "N": "i32", "CS": "i32", "FS": "i32",
                 "epsilon": "fp32"}
        pointers, tensors = ("PART", "MEAN", "RSTD"), ()
    elif spec.product == "fwd_apply":
        types = {"X": f"*{t}", "G": f"*{p}", "B": f"*{p}", "Y": f"*{t}", "MEAN": "*fp32", "RSTD": "*fp32",
                 "N": "i32", "CS": "i32", "FS": "i32"}
        pointers, tensors = ("X", "G", "B", "Y", "MEAN", "RSTD"), ("x", "y")
    else:
        dx = spec.product == "bwd_dx"
        pointers = ("X", "G", "B", "DY") + (("DX",) if dx else ()) + ("MEAN", "RSTD", "C1_PART", "C2_PART") + \
            (() if dx else ("DG_PART", "DB_PART"))
        types = {name: "*fp32" for name in pointers} | {"X": f"*{t}", "G": f"*{p}", "B": f"*{p}", "DY": f"*{t}"}
        types |= ({"DX": f"*{t}"} if dx else {}) | {"N": "i32", "CS": "i32", "FS": "i32"}
        tensors = ("x", "dy", "dx") if dx else ("x", "dy")
    unit, wide = _stride_names(spec.axis, tensors)
    types |= {name: "i32" for name in wide}
    cfg = spec.config
    tile = {"BN": cfg.BN, "R": cfg.R} if spec.split else {"BN": cfg.BN, "BC": cfg.BC, "ONE_CHUNK": spec.one_chunk}
    if spec.product in ("fwd_stats", "fwd_merge"):  # statistics only: no parameters, no relu
        consts = {"BN": cfg.BN} | ({"R": cfg.R} if spec.product == "fwd_stats" else {})
    else:
        consts = tile | {"HAS_G": True, "HAS_B": True, "RELU": spec.relu}
    consts |= {name: 1 for name in unit}
    # (N, C) rows always hold a multiple of 16 features (the row stride); aligned specs also the
    # bound of the contiguous axis: vector loads under the masks
    divisible = set(pointers) | (set(wide) if spec.aligned or spec.axis == 1 else set())
    if spec.aligned:
        divisible.add("CS" if spec.axis == 1 else "N")
    if spec.split:
        divisible.add("FS")  # a power of two of at least MIN_FS features
    fn = kernel(spec)
    warps = MERGE_WARPS if spec.product == "fwd_merge" else cfg.num_warps
    return CompileArgs(signature(fn, types, consts), consts, frozenset(divisible), warps, num_stages=1)
