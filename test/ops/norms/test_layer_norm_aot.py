"""The layer-norm kernels compiled ahead of time (the TensorFlow GPU path), without a GPU: the spec
list, its compile arguments, a few specs compiled for sm_90 / sm_80, and the C selection
(``src/ops/norms.c``) over a small built library."""
import pytest

from blocksparse.ops.common.aot import SUM_ROWS_BPS, SumRowsSpec
from blocksparse.ops.norms import aot
from blocksparse.ops.common.reduce import sum_rows_tile
from blocksparse.ops.norms.configs import MAX_ROW, SPLIT_BWD, SPLIT_FWD, SPLIT_FWD_MIN_ELEMENTS, layer_norm_config

ALL = aot.specializations((80, 90))
NORMS = [s for s in ALL if not isinstance(s, SumRowsSpec)]
#: The specs the small library holds: (N, C) tiles 256 / 1024 and the chunked one, (C, N) tiles.
BUILT = ("ln_fwd_bf16_a1_c256_sm90", "ln_fwd_bf16_a1_c1024_sm90", "ln_fwd_bf16_a1_k16384_sm90",
         "ln_bwd_bf16_a1_relu_c1024_sm90", "ln_fwd_bf16_a0_c64_sm90", "ln_fwd_bf16_a0u_c512_sm90",
         "ln_fwd_bf16_a0u_k512_sm90", "ln_fwd_bf16_a1_c1024_sm80", "ln_fwd_bf16_a1_gbf16_c1024_sm90",
         "ln_bwd_bf16_a1_gbf16_c1024_sm90", "ln_fwd_bf16_a1u_c64_sm90", "sum_rows_ab_p64_sm90",
         "sum_rows_ab_p512_sm90", "sum_rows_abu_p512_sm90", "sum_rows_ab_bf16_p512_sm90",
         "ln_bwd_bf16_a0_c256_sm90", "ln_bwd_part_bf16_a0_s16_sm90", "ln_bwd_dx_bf16_a0_s16_sm90",
         "ln_fwd_bf16_a0_k512_sm90", "ln_fwd_stats_bf16_a0_s16_sm90", "ln_fwd_merge_bf16_a0_s16_sm90",
         "ln_fwd_apply_bf16_a0_s16_sm90", "ln_fwd_apply_bf16_a0_relu_s16_sm90")


def test_names_are_unique_c_identifiers():
    names = [s.name for s in ALL]
    assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)


@pytest.mark.parametrize("arch", [80, 90])
def test_every_call_kind_has_a_tile_for_every_segment_length(arch):
    """Each (direction, dtype, axis, alignment, relu) has a one-chunk tile per power of two up to
    the longest and a chunked one -- for the aligned ``(C, N)`` backward the split backward's two
    kernels instead --, so every segment length is served; one reduction per arch."""
    for product in ("fwd", "bwd"):
        for dtype, size in aot.DTYPES.items():
            for param in {"fp32", dtype}:  # 16-bit activations: float32 parameters, or their own dtype
                for axis, aligned in ((1, True), (1, False), (0, True), (0, False)):
                    for relu in (False, True):
                        mine = [s for s in NORMS if (s.arch, s.product, s.dtype, s.param, s.axis, s.aligned, s.relu)
                                == (arch, product, dtype, param, axis, aligned, relu)]
                        split = [s.product for s in NORMS if s.product in aot.SPLIT_PRODUCTS and (s.arch, s.dtype,
                                 s.param, s.axis, s.aligned, s.relu) == (arch, dtype, param, axis, aligned, relu)]
                        assert split == (list(aot.SPLIT_PRODUCTS) if axis == 0 and aligned else [])
                        # the split forward beside the chunked tile: its statistics once per dtype
                        key = (arch, dtype, param, axis, aligned, relu)
                        split = {s.product for s in NORMS if s.product in aot.SPLIT_FWD_PRODUCTS
                                 and (s.arch, s.dtype, s.param, s.axis, s.aligned, s.relu) == key}
                        generic = {"fwd_stats", "fwd_merge"} if not relu and param == "fp32" else set()
                        assert split == ({"fwd_apply"} | generic if axis == 0 and aligned else set())
                        if product == "bwd" and axis == 0 and aligned:
                            assert all(s.one_chunk for s in mine)
                        else:
                            assert [s for s in mine if not s.one_chunk], (product, dtype, param, axis, relu)
                        tiles = sorted(s.config.BC for s in mine if s.one_chunk)
                        assert tiles and all(b == 2 * a for a, b in zip(tiles, tiles[1:]))
    # reductions per output dtype of dg and db (float32, or the 16-bit parameters'), for rows of a
    # multiple of 16 columns (vector loads) and for any, one per tile of partial rows a step
    assert sorted((s.out, s.aligned, s.bp) for s in ALL if isinstance(s, SumRowsSpec) and s.arch == arch) == \
        sorted((out, aligned, bp) for out in aot.DTYPES for aligned in (False, True) for bp in SUM_ROWS_BPS)


def test_tiles_are_those_the_pytorch_launcher_uses():
    """A segment of a tile's width gets the same tile from the table the JIT launches use."""
    for s in NORMS:
        if s.split:
            want = SPLIT_FWD[aot.DTYPES[s.dtype]] if s.product in aot.SPLIT_FWD_PRODUCTS else SPLIT_BWD
            assert s.config == want, s.name
            assert aot.fields(s)["min_elements"] == (SPLIT_FWD_MIN_ELEMENTS[aot.DTYPES[s.dtype]]
                                                     if s.product in aot.SPLIT_FWD_PRODUCTS else 0)
            continue
        row = s.config.BC if s.one_chunk else 2 * s.config.BC
        if s.axis == 1 and not s.one_chunk:
            row = 2 * MAX_ROW
        assert layer_norm_config(s.axis, row, aot.DTYPES[s.dtype], backward=s.product == "bwd",
                                 relu=s.relu, aligned=s.aligned) == s.config, s.name


SAMPLED = NORMS[:: max(1, len(NORMS) // 40)] + [s for s in NORMS if s.product in aot.SPLIT_FWD_PRODUCTS][:3]


@pytest.mark.parametrize("spec", SAMPLED, ids=lambda s: s.name)
def test_compile_args_name_every_kernel_parameter(spec):
    args = aot.compile_args(spec)
    assert list(args.signature) == list(aot.kernel(spec).arg_names)
    if spec.product == "fwd_merge":  # statistics only: no activations
        assert {"N", "FS", "PART", "MEAN", "RSTD"} <= args.divisible
        return
    if spec.product != "fwd_stats":
        assert args.constexprs["HAS_G"] and args.constexprs["HAS_B"] and args.constexprs["RELU"] == spec.relu
    unit = "stride_xf" if spec.axis == 1 else "stride_xn"
    assert args.constexprs[unit] == 1                       # dense activations
    assert ("stride_xn" in args.divisible) == (spec.axis == 1)
    assert ("stride_xf" in args.divisible) == (spec.axis == 0 and spec.aligned)
    # the bound of the contiguous axis' masks: what lets Triton vectorise the loads
    assert ("CS" in args.divisible) == (spec.axis == 1 and spec.aligned)
    assert ("N" in args.divisible) == (spec.axis == 0 and spec.aligned)


def test_fields_select_without_the_config():
    s = next(s for s in NORMS if s.axis == 0 and s.relu and s.product == "bwd")
    f = aot.fields(s)
    assert (f["product"], f["axis"], f["relu"], f["bc"], f["bn"]) == ("bwd", 0, True, s.config.BC, s.config.BN)
    assert "dtype" not in aot.fields(SumRowsSpec(90, True))  # a dtype filter of a build keeps it


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    from kernel_build import build_subset, can_build

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    from blocksparse.ops.norms.capi import NormsRuntime

    return NormsRuntime(build_subset(tmp_path_factory.mktemp("norms"), "norms", BUILT))


def test_the_library_holds_the_compiled_specs(runtime):
    assert sorted(s["name"] for s in runtime.specs) == sorted(BUILT)
    assert {s["family"] for s in runtime.specs} == {"norms"}


def _call(axis=1, features=1024, segments=1, n=4096, relu=False, dtype="bf16", params=0):
    from blocksparse.ops.norms.capi import DTYPES, LayerNormCall

    return LayerNormCall(dtype=DTYPES[dtype], axis=axis, relu=relu, segments=segments, n_tokens=n,
                         features=features, epsilon=1e-6, params=params)


SELECT = {
    "segment-fits-1024": (dict(features=1024), 90, "ln_fwd_bf16_a1_c1024_sm90"),
    "bf16-parameters": (dict(features=1024, params=1), 90, "ln_fwd_bf16_a1_gbf16_c1024_sm90"),
    "bf16-parameters-no-chunked-tile": (dict(features=2048 * 16, params=1), 90, None),
    "narrow-segment-takes-256": (dict(features=512, segments=4), 90, "ln_fwd_bf16_a1_c256_sm90"),
    "wide-segment-chunked": (dict(features=2048 * 16), 90, "ln_fwd_bf16_a1_k16384_sm90"),
    "sm80-kernel-on-sm86": (dict(features=1024), 86, "ln_fwd_bf16_a1_c1024_sm80"),
    "cn-aligned-tokens": (dict(axis=0, features=64, n=4096), 90, "ln_fwd_bf16_a0_c64_sm90"),
    "cn-odd-tokens": (dict(axis=0, features=64, n=4097), 90, "ln_fwd_bf16_a0u_c512_sm90"),
    "cn-odd-tokens-chunked": (dict(axis=0, features=1024, n=4097), 90, "ln_fwd_bf16_a0u_k512_sm90"),
    "cn-chunked": (dict(axis=0, features=1024, n=4096), 90, "ln_fwd_bf16_a0_k512_sm90"),
    # from 2^26 tokens x segment features: the split forward (its first kernel), whatever the relu
    "cn-large-split": (dict(axis=0, features=4096, n=16384), 90, "ln_fwd_stats_bf16_a0_s16_sm90"),
    "cn-large-split-relu": (dict(axis=0, features=4096, n=16384, relu=True), 90, "ln_fwd_stats_bf16_a0_s16_sm90"),
    "cn-large-segments-split": (dict(axis=0, features=8192, segments=2, n=16384), 90, "ln_fwd_stats_bf16_a0_s16_sm90"),
    "cn-below-the-threshold": (dict(axis=0, features=4096, n=16368), 90, "ln_fwd_bf16_a0_k512_sm90"),
    "cn-large-odd-tokens": (dict(axis=0, features=4096, n=16385), 90, "ln_fwd_bf16_a0u_k512_sm90"),  # not vectors
    "cn-large-bf16-parameters": (dict(axis=0, features=4096, n=16384, params=1), 90, None),  # no such apply built
    "nc-rows-not-16": (dict(features=1000), 90, None),
    "nc-segments-not-16": (dict(features=96, segments=4), 90, "ln_fwd_bf16_a1u_c64_sm90"),
    "nc-segments-of-16": (dict(features=512, segments=32), 90, "ln_fwd_bf16_a1_c256_sm90"),
    "no-relu-kernel": (dict(relu=True), 90, None),
    "no-fp16-kernel": (dict(dtype="fp16"), 90, None),
    "segments-do-not-divide": (dict(features=1024, segments=3), 90, None),
    "sm100-has-none": (dict(features=1024), 100, None),
}


@pytest.mark.parametrize("case", SELECT, ids=list(SELECT))
def test_c_selection(runtime, case):
    changes, arch, want = SELECT[case]
    index = runtime.select(_call(**changes), False, arch)
    assert (runtime.specs[index]["name"] if index >= 0 else None) == want


def test_sum_rows_writes_the_parameters_dtype():
    from blocksparse.ops.common.aot import sum_rows_compile_args

    args = sum_rows_compile_args(SumRowsSpec(90, True, out="bf16"))
    assert args.signature["OUT_A"] == args.signature["OUT_B"] == "*bf16" and args.signature["PART_A"] == "*fp32"
    assert SumRowsSpec(90, True, out="bf16").name == "sum_rows_ab_bf16_p64_sm90"
    assert "M" in args.divisible and "M" not in sum_rows_compile_args(SumRowsSpec(90, True, aligned=False)).divisible
    assert SumRowsSpec(90, True, aligned=False, bp=512).name == "sum_rows_abu_p512_sm90"
    # the JIT's tile for the same rows: a [512, 16] tile, a [64, 128] one
    wide = sum_rows_compile_args(SumRowsSpec(90, True, bp=512)).constexprs
    assert (wide["BP"], wide["BM"]) == (512, 16) == sum_rows_tile(300)
    assert (args.constexprs["BP"], args.constexprs["BM"]) == (64, 128) == sum_rows_tile(64)


#: (rows, columns, out dtype) -> the reduction the C takes: the JIT's tile for the rows (all in one
#: step where they fit: 264 rows -> 512 a step), else the widest below it; rows of a multiple of 16
#: columns on the aligned specs.
SUM_ROWS = {
    "many-rows": ((264, 1024, "fp32"), "sum_rows_ab_p512_sm90"),
    "many-rows-bf16": ((264, 4096, "bf16"), "sum_rows_ab_bf16_p512_sm90"),
    "few-rows": ((40, 1024, "fp32"), "sum_rows_ab_p64_sm90"),
    "no-tile-for-the-rows": ((100, 1024, "fp32"), "sum_rows_ab_p64_sm90"),
    "odd-columns": ((264, 1000, "fp32"), "sum_rows_abu_p512_sm90"),
    "no-fp16": ((264, 1024, "fp16"), None),
}


@pytest.mark.parametrize("case", SUM_ROWS, ids=list(SUM_ROWS))
def test_c_selection_of_the_reduction(runtime, case):
    (rows, columns, out), want = SUM_ROWS[case]
    index = runtime.select_sum_rows("norms", 90, out, True, rows, columns)
    assert (runtime.specs[index]["name"] if index >= 0 else None) == want
    assert runtime.select_sum_rows("lstm", 90, out, True, rows, columns) == -1  # another family's


def test_c_selection_of_the_backward(runtime):
    index = runtime.select(_call(relu=True), True, 90)
    assert runtime.specs[index]["name"] == "ln_bwd_bf16_a1_relu_c1024_sm90"
    assert runtime.select(_call(relu=False), True, 90) == -1
    # (C, N): a segment one tile holds, else the split backward (its first kernel); unaligned tokens
    # would take the chunked tile, which the small library lacks
    name = lambda index: runtime.specs[index]["name"] if index >= 0 else None  # noqa: E731
    assert name(runtime.select(_call(axis=0, features=256), True, 90)) == "ln_bwd_bf16_a0_c256_sm90"
    assert name(runtime.select(_call(axis=0, features=1024), True, 90)) == "ln_bwd_part_bf16_a0_s16_sm90"
    assert name(runtime.select(_call(axis=0, features=2048, segments=2), True, 90)) == "ln_bwd_part_bf16_a0_s16_sm90"
    assert name(runtime.select(_call(axis=0, features=1024, n=4097), True, 90)) is None
