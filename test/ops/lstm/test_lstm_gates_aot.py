"""The LSTM-gate kernels compiled ahead of time (the TensorFlow GPU path), without a GPU: the spec
list, its compile arguments, a few specs compiled for sm_90, and the C selection
(``src/ops/lstm.c``) over a small built library."""
import pytest

from blocksparse.ops.common.aot import SUM_ROWS_BPS, SumRowsSpec
from blocksparse.ops.lstm import aot
from blocksparse.ops.lstm.configs import lstm_gates_config

ALL = aot.specializations((80, 90))
GATES = [s for s in ALL if not isinstance(s, SumRowsSpec)]
BUILT = ("lstm_fwd_bf16_k16_sm90", "lstm_fwd_bf16_k128_sm90", "lstm_bwd_fp32_bias_k64_sm90",
         "lstm_fwd_bf16_bias_bbf16_k128_sm90", "sum_rows_a_p64_sm90")


def test_names_are_unique_c_identifiers():
    names = [s.name for s in ALL]
    assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)


def test_every_call_kind_has_every_tile():
    for arch in (80, 90):
        for product in ("fwd", "bwd"):
            for dtype in aot.DTYPES:
                # a float32 bias, and for 16-bit activations a bias of their dtype
                for has_bias, param in ((False, "fp32"), *((True, p) for p in {"fp32", dtype})):
                    tiles = [s.config.BK for s in GATES if (s.arch, s.product, s.dtype, s.has_bias, s.param)
                             == (arch, product, dtype, has_bias, param)]
                    assert sorted(tiles) == list(aot.TILES)
        # dbias summed into each dtype
        assert sorted((s.has_b, s.out, s.bp) for s in ALL if isinstance(s, SumRowsSpec) and s.arch == arch) == \
            sorted((False, out, bp) for out in aot.DTYPES for bp in SUM_ROWS_BPS)


def test_tiles_are_those_the_pytorch_launcher_uses():
    for s in GATES:
        assert lstm_gates_config(s.config.BK, backward=s.product == "bwd") == s.config, s.name


@pytest.mark.parametrize("spec", GATES[::5], ids=lambda s: s.name)
def test_compile_args_name_every_kernel_parameter(spec):
    args = aot.compile_args(spec)
    assert list(args.signature) == list(aot.kernel(spec).arg_names)
    assert args.signature["BIAS"] == f"*{spec.param}" and args.constexprs["HAS_BIAS"] == spec.has_bias
    # K a multiple of 16: every row stride and merged-gate offset keeps the alignment
    assert {"K", "stride_c", "stride_i", "stride_o"} <= args.divisible


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    from kernel_build import build_subset, can_build

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    from blocksparse.ops.norms.capi import NormsRuntime

    return NormsRuntime(build_subset(tmp_path_factory.mktemp("lstm"), "lstm", BUILT))


def test_the_library_holds_the_compiled_specs(runtime):
    assert sorted(s["name"] for s in runtime.specs) == sorted(BUILT)


SELECT = {
    "k16": (dict(features=16), False, "lstm_fwd_bf16_k16_sm90"),
    "k1024-takes-128": (dict(features=1024), False, "lstm_fwd_bf16_k128_sm90"),
    "bwd-fp32-bias-k48": (dict(features=48, dtype="fp32", bias=64), True, "lstm_bwd_fp32_bias_k64_sm90"),
    "k-not-16": (dict(features=40), False, None),
    "no-bias-kernel": (dict(features=16, bias=64), False, None),
    "no-fp16-kernel": (dict(features=16, dtype="fp16"), False, None),
    "bf16-bias": (dict(features=1024, bias=64, params=1), False, "lstm_fwd_bf16_bias_bbf16_k128_sm90"),
    "float32-bias-not-built": (dict(features=1024, bias=64), False, None),
    "params-without-a-bias": (dict(features=1024, params=1), False, "lstm_fwd_bf16_k128_sm90"),
}


@pytest.mark.parametrize("case", SELECT, ids=list(SELECT))
def test_c_selection(runtime, case):
    from blocksparse.ops.norms.capi import DTYPES, LstmGatesCall

    changes, backward, want = SELECT[case]
    call = LstmGatesCall(dtype=DTYPES[changes.get("dtype", "bf16")], merged=1, n_tokens=64,
                         features=changes["features"], forget_bias=1.0, bias=changes.get("bias", 0),
                         params=changes.get("params", 0))
    index = runtime.select(call, backward, 90)
    assert (runtime.specs[index]["name"] if index >= 0 else None) == want
