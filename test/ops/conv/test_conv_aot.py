"""The implicit-GEMM convolution kernel compiled ahead of time (the PyTorch eager path), without a
GPU: the spec list, its compile arguments, the tile rule, and -- over a small library compiled for
sm_90 -- that the launches the PyTorch glue builds for real layers find a spec and match it argument
by argument (what :class:`~blocksparse.torch._launch.AotLaunch` checks before it would launch)."""
import numpy as np
import pytest

from blocksparse.ops.conv import aot

ALL = aot.specializations((80, 90))


def test_names_are_unique_c_identifiers():
    names = [s.name for s in ALL]
    assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)
    # (bf16, fp16) x two directions x channel tiles x pixel tiles x window classes, per arch
    assert len(ALL) == 2 * 2 * 2 * len(aot.BLOCK_N) * len(aot.BLOCK_K) * len(aot.TILES) * len(aot.WINDOWS)


@pytest.mark.parametrize("spec", ALL[::11], ids=lambda s: s.name)
def test_compile_args_name_every_kernel_parameter(spec):
    args = aot.compile_args(spec)
    assert list(args.signature) == list(aot.kernel(spec).arg_names)
    assert args.constexprs["ALIGN"] == 16 and args.constexprs["PREFETCH"] is True
    assert args.constexprs["BN"] == spec.block_n and args.constexprs["BK"] == spec.block_k
    assert (args.constexprs["BM"], args.num_warps, args.num_stages) == aot.TILES[spec.tile]
    assert {name: args.constexprs[name] for name in aot.DEPTH} == aot.DEPTH
    assert all(args.constexprs[name] == value for name, value in aot.WINDOWS[spec.window].items())
    assert all(args.signature[name] == "i32" for name in ("step_h", "taps_w", "pad_h") if spec.window == "any")
    assert {"X", "W", "Y", "K", "stride_h", "stride_w"} <= args.divisible and "pixels" not in args.divisible


def test_tile_and_window_rules():
    assert [aot.tile_for(bn, 100, 132) for bn in aot.BLOCK_N] == ["m128", "m128", "m64"]
    assert aot.tile_for(128, 527, 132) == "m64" and aot.tile_for(128, 528, 132) == "m128"
    unit = dict(step_h=1, step_w=1, dil_h=1, dil_w=1)
    assert aot.window_of({**unit, "taps_h": 1, "taps_w": 1, "pad_h": 0, "pad_w": 0}) == "1x1"
    assert aot.window_of({**unit, "taps_h": 1, "taps_w": 1, "pad_h": 1, "pad_w": 0}) == "unit"
    assert aot.window_of({**unit, "taps_h": 3, "taps_w": 3, "pad_h": 1, "pad_w": 1}) == "unit"
    assert aot.window_of({**unit, "step_w": 2, "taps_h": 1, "taps_w": 1, "pad_h": 0, "pad_w": 0}) == "any"


def _ops():
    """Block-aligned 2-D layers of 32-, 64- and 128-channel blocks, a 1-D one, and a 3-D one."""
    from blocksparse.torch import BlocksparseConv

    rng = np.random.default_rng(5)

    def bck(bs, channels):
        cb = channels // bs
        mask = rng.random((cb, cb)) < 0.5
        mask[rng.permutation(cb), np.arange(cb)] = True
        return [(range(c * bs, (c + 1) * bs), range(k * bs, (k + 1) * bs)) for c, k in np.argwhere(mask)]

    return {"2d-bs32": BlocksparseConv(bck(32, 128), (3, 3), (7, 9), strides=2),
            "2d-bs64": BlocksparseConv(bck(64, 128), (3, 3), (7, 9)),
            "2d-bs128-1x1": BlocksparseConv(bck(128, 256), (1, 1), (7, 9)),
            "1d-bs64": BlocksparseConv(bck(64, 128), (3,), (11,), dilates=2),
            "3d-bs64": BlocksparseConv(bck(64, 128), (3, 3, 3), (3, 4, 5))}


#: The specs the layers of ``_ops`` take (bf16 and fp32 / tf32), compiled for sm_90.
BUILT = ("conv_implicit_fwd_bf16_n32_k32_m128_any_sm90", "conv_implicit_dx_bf16_n32_k32_m128_any_sm90",
         "conv_implicit_fwd_bf16_n64_k64_m128_unit_sm90", "conv_implicit_dx_fp16_n64_k64_m128_unit_sm90",
         "conv_implicit_fwd_bf16_n128_k64_m64_1x1_sm90", "conv_implicit_fwd_bf16_n64_k64_m128_any_sm90")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from kernel_build import build_subset, can_build

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    from blocksparse.aot.abi import KernelLibrary

    return KernelLibrary(str(build_subset(tmp_path_factory.mktemp("conv"), "conv", BUILT)))


@pytest.mark.slow
@pytest.mark.parametrize("name, dtype, transposed, precision", [
    ("2d-bs32", "bfloat16", False, "ieee"), ("2d-bs32", "bfloat16", True, "ieee"),
    ("2d-bs64", "bfloat16", False, "ieee"), ("2d-bs64", "float16", True, "ieee"),
    ("2d-bs128-1x1", "bfloat16", False, "ieee"), ("1d-bs64", "bfloat16", False, "ieee")])
def test_the_glue_launches_match_their_compiled_specs(kernels, name, dtype, transposed, precision):
    import torch

    from blocksparse.torch._conv.implicit import compiled_launch
    from blocksparse.torch._launch import AotLaunch

    op = _ops()[name]
    spec, tables = op.spec, op._tables.on(torch.device("cpu"))
    plan = spec.implicit_grad if transposed else spec.implicit
    shape = op.o_shape(3) if transposed else op.i_shape(3)
    read = torch.empty(shape, dtype=getattr(torch, dtype)).to(memory_format=torch.channels_last
                                                               if len(shape) == 4 else torch.contiguous_format)
    a5 = read.movedim(1, -1).contiguous().view(shape[0], *(1,) * (5 - len(shape)), *shape[2:], shape[1])
    steps = tables.implicit_grad_steps if transposed else tables.implicit_steps
    tiles = tables.implicit_grad_tiles if transposed else tables.implicit_tiles
    written = spec.blocks.C if transposed else spec.blocks.K
    found = compiled_launch(kernels, 90, 132, plan, spec, a5, written, transposed, precision, steps, tiles)
    assert found is not None
    launch, index = found
    assert kernels.specs[index]["name"] in BUILT
    AotLaunch(launch, kernels, index, 0)  # every argument matches the compiled signature (raises otherwise)
    assert launch.grid[0] % plan.tiles.shape[0] == 0
    assert launch.constexprs["BM"] == (64 if plan.block_n == 128 else 128)  # few programs
    window = {"2d-bs32": "any", "1d-bs64": "any", "2d-bs128-1x1": "1x1"}.get(name, "unit")  # strided, dilated
    assert kernels.specs[index]["window"] == window


@pytest.mark.slow
def test_what_the_library_does_not_compile_takes_the_jit(kernels):
    import torch

    from blocksparse.torch._conv.implicit import compiled_launch
    from blocksparse.torch._launch import AotLaunch, Mismatch

    op = _ops()["3d-bs64"]  # the depth axis is not the neutral one: the signature does not match
    tables, shape = op._tables.on(torch.device("cpu")), op.i_shape(2)
    a5 = torch.empty(shape, dtype=torch.bfloat16).movedim(1, -1).contiguous()
    found = compiled_launch(kernels, 90, 132, op.spec.implicit, op.spec, a5, op.spec.blocks.K, False, "ieee",
                            tables.implicit_steps, tables.implicit_tiles)
    assert found is not None
    with pytest.raises(Mismatch, match="ID"):
        AotLaunch(found[0], kernels, found[1], 0)
    # float32 is not compiled: none found
    a5 = torch.empty(op.i_shape(2), dtype=torch.float32).movedim(1, -1).contiguous()
    assert compiled_launch(kernels, 90, 132, op.spec.implicit, op.spec, a5, op.spec.blocks.K, False, "ieee",
                           tables.implicit_steps, tables.implicit_tiles) is None
