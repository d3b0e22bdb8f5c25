"""The transformer kernels compiled ahead of time (the TensorFlow GPU path), without a GPU: the spec
list against the PyTorch launcher (head slices, warps, precision), its compile arguments, the
bfloat16 specs of two block sizes compiled for sm_90, and the C selection (``src/ops/transformer.c``)
of every call kind over that library; calls the kernels cannot take are refused before any launch."""
import pytest

from blocksparse.ops.transformer import aot

torch = pytest.importorskip("torch")

from blocksparse.torch._transformer import launch, ops  # noqa: E402

ALL = aot.specializations((80, 90))
#: What the small library holds: every bfloat16 spec of block sizes 64 and 128 for sm_90.
BUILT = tuple(s.name for s in aot.specializations((90,)) if s.dtype == "bf16" and s.block_size in (64, 128))
HEAD_DIMS = range(16, 272, 16)


def test_names_are_unique_c_identifiers():
    names = [s.name for s in ALL]
    assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)
    assert len(aot.specializations((90,))) == 195


def test_head_slices_warps_and_precision_follow_their_rules():
    """The head slice is the smallest power of two from 16 holding the head dimension, capped at 128
    (64 for 128-blocks); the PyTorch launchers describe their launches with these same functions."""
    for bs in aot.BLOCK_SIZES:
        cap = 64 if bs == 128 else 128
        for d in range(1, 300):
            bd = aot.head_slice(d, bs)
            assert bd & (bd - 1) == 0 and 16 <= bd <= cap, (d, bs)
            assert bd >= min(d, cap) and (bd == 16 or bd // 2 < min(d, cap)), (d, bs)
        assert aot.warps(bs) == (4 if bs <= 32 else 8)
    assert (launch._head_slice, launch._warps) == (aot.head_slice, aot.warps)
    assert aot.PRECISION == ops.PRECISION


def test_every_call_kind_has_its_kernel():
    """Per arch, dtype and block size: nt and both xn for every head slice the launcher picks, the
    four softmax variants and the gradient."""
    for arch in (80, 90):
        for dtype in aot.DTYPES:
            for bs in aot.BLOCK_SIZES:
                mine = {(s.product, s.bd, s.trans, s.has_mask, s.autoregress) for s in ALL
                        if (s.arch, s.dtype, s.block_size) == (arch, dtype, bs)}
                slices = {aot.head_slice(d, bs) for d in HEAD_DIMS}
                want = {("nt", bd, False, False, False) for bd in slices}
                want |= {("xn", bd, t, False, False) for bd in slices for t in (False, True)}
                want |= {("softmax", 0, False, m, ar) for m in (False, True) for ar in (False, True)}
                assert mine == want | {("softmax_grad", 0, False, False, False)}


@pytest.mark.parametrize("spec", ALL[::23], ids=lambda s: s.name)
def test_compile_args_name_every_kernel_parameter(spec):
    args = aot.compile_args(spec)
    assert list(args.signature) == list(aot.kernel(spec).arg_names)
    assert args.num_warps == launch._warps(spec.block_size) and args.constexprs["BS"] == spec.block_size
    if spec.product in ("nt", "xn"):
        assert args.constexprs["BD"] == spec.bd and args.constexprs["PRECISION"] == "ieee"
        # a head dimension that is a multiple of 16 makes every feature offset and row stride one
        assert "head_dim" in args.divisible and {p for p in args.divisible if p.startswith("stride_")}
    if spec.product == "softmax":
        assert (args.constexprs["HAS_MASK"], args.constexprs["AUTOREGRESS"]) == (spec.has_mask, spec.autoregress)
        assert args.constexprs["WORDS"] == -(-spec.block_size // 32) and args.signature["scale"] == "fp32"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    from kernel_build import build_subset, can_build

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    from blocksparse.ops.transformer.capi import TransformerRuntime

    return TransformerRuntime(build_subset(tmp_path_factory.mktemp("transformer"), "transformer", BUILT))


def test_the_library_holds_the_compiled_specs(runtime):
    assert sorted(s["name"] for s in runtime.specs) == sorted(BUILT)


def _call(product, **changes):
    from blocksparse.ops.transformer.capi import DTYPES, PRODUCTS, TransformerCall

    fields = dict(product=PRODUCTS[product], dtype=DTYPES["bf16"], block_size=64, batch=2, heads=4, lut_heads=1,
                  blocks=5, q_blocks=3, k_blocks=3, features=4 * 64, scale=0.5, a=16, b=32, out=48, coords=64,
                  row_offsets=80, col_offsets=96, col_blocks=112, mask_index=128, mask_bits=144)
    return TransformerCall(**{**fields, **changes})


def _want(product, bs, head_dim=0, masked=False, autoregress=False):
    kernel = "xn" if product in ("nn", "tn") else product
    spec = aot.BstSpec(90, kernel, "bf16", bs, aot.head_slice(head_dim, bs) if head_dim else 0, product == "tn",
                       masked, autoregress)
    return spec.name


@pytest.mark.parametrize("bs", [64, 128])
def test_c_selects_the_pytorch_launchers_kernel_for_every_call(runtime, bs):
    def selected(call):
        index = runtime.select(call, 90)
        return runtime.specs[index]["name"] if index >= 0 else None

    for product in ("nt", "nn", "tn"):
        for d in HEAD_DIMS:
            assert selected(_call(product, block_size=bs, features=3 * d, heads=3)) == _want(product, bs, d)
    for masked in (0, 1):
        for autoregress in (0, 1):
            call = _call("softmax", block_size=bs, masked=masked, autoregress=autoregress)
            assert selected(call) == _want("softmax", bs, masked=masked, autoregress=autoregress)
    assert selected(_call("softmax_grad", block_size=bs)) == _want("softmax_grad", bs)


SELECT_NONE = {
    "head-dim-24": dict(features=4 * 24),
    "features-not-heads": dict(features=4 * 64 + 2),
    "no-fp32-kernel": dict(dtype=2),
    "no-block-32-kernel": dict(block_size=32),
    "sm_80": dict(arch=80),
}


@pytest.mark.parametrize("case", SELECT_NONE)
def test_c_selects_nothing_for_what_was_not_compiled(runtime, case):
    changes = dict(SELECT_NONE[case])
    arch = changes.pop("arch", 90)
    assert runtime.select(_call("nt", **changes), arch) == -1


REFUSED = {
    "rows": (dict(batch=20000, heads=4), "at most 65535 batch \\* heads; got 20000 \\* 4: split the batch"),
    "lut-heads": (dict(lut_heads=2), "lut_heads must be 1 or heads"),
    "blocks": (dict(blocks=10), "blocks must be at most q_blocks \\* k_blocks"),
    "features": (dict(features=4 * 64 + 2), "features must be a positive multiple of heads"),
    "no-table": (dict(coords=0), "a table the product reads is missing"),
    "strides": (dict(q_blocks=2 ** 15, features=4 * 256), "ctx \\* features must be below 2\\^31"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_run_refuses_bad_calls_before_any_launch(runtime, case):
    from blocksparse.aot.abi import KernelError

    changes, message = REFUSED[case]
    with pytest.raises(KernelError, match=message) as info:
        runtime.run(_call("nt", **changes))
    assert info.value.status == 1   # BSK_ERR_INVALID: no GPU was asked
