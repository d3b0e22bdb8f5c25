"""PyTorch BlocksparseConv / BlocksparseDeconv: values and gradients (input, filter, edge bias)
against the float64 numpy reference, on both paths (dense masked, grouped), in three dtypes."""
import numpy as np
import pytest
import torch

from blocksparse.testing import rel_error, tolerance
from blocksparse.testing.conv import (CASES, case_of, conv_products, l2_normalize_products, layout_bck,
                                      make_op, random_inputs)
from blocksparse.torch import BlocksparseConv, BlocksparseConvLayer, BlocksparseDeconv
from blocksparse.torch._conv import compute

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
KINDS = {"conv": BlocksparseConv, "deconv": BlocksparseDeconv}


@pytest.fixture(params=["dense", "grouped"])
def path(request, monkeypatch):
    """Runs the test on each path: the grouped one is forced (on CPU it is never chosen)."""
    if request.param == "grouped":
        monkeypatch.setattr(compute, "choose", lambda spec, x, training=False: "grouped")
    return request.param


def build(rng, kind, case, **kwargs):
    return make_op(KINDS[kind], rng, case, **kwargs)


def run(op, F, x, dy, eb, dtype=torch.float32, channels_last=False, device="cpu"):
    """``(outputs, inputs)``: y and the gradients of x, F, edge bias; the inputs as the op saw them."""
    t = lambda a: None if a is None else torch.tensor(a, device=device).to(dtype).requires_grad_()  # noqa: E731
    xt, Ft, et = t(x), t(F), t(eb)
    xin = xt.to(memory_format=torch.channels_last) if channels_last else xt
    y = op(Ft, xin, edge_bias=et)
    assert y.dtype == dtype and tuple(y.shape) == tuple(op.o_shape(x.shape[0]))
    y.backward(torch.tensor(dy, device=device).to(dtype))
    grads = (xt.grad, Ft.grad, None if et is None else et.grad)
    return (y, *grads), (xt, Ft, et)


def check(op, case, F, x, dy, eb, dtype=torch.float32, **kwargs):
    outs, (xt, Ft, et) = run(op, F, x, dy, eb, dtype, **kwargs)
    as64 = lambda v: None if v is None else v.detach().double().cpu().numpy()  # noqa: E731
    dy_seen = torch.tensor(dy).to(dtype).double().numpy()
    refs = conv_products(case, as64(Ft), as64(xt), dy_seen, as64(et))
    tol = tolerance(dtype)
    for name, got, want in zip(("y", "dx", "dF", "d_edge_bias"), outs, refs):
        if want is None or want.size == 0:  # no edge bias, or none to learn (VALID): no gradient
            assert got is None or got.numel() == 0
            continue
        assert got.dtype == dtype, name
        err = rel_error(got, want)
        assert err < tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients(rng, path, kind, case):
    op, ref = build(rng, kind, case)
    check(op, ref, *random_inputs(rng, op))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_dtypes(rng, path, kind, dtype):
    op, ref = build(rng, kind, "2d-same-stride-dilate", layout="uniform")
    check(op, ref, *random_inputs(rng, op, N=3), dtype=DTYPES[dtype])


@pytest.mark.parametrize("kind", KINDS)
def test_channels_last_input(rng, path, kind):
    op, ref = build(rng, kind, "2d-same-even-filter", layout="uniform")
    check(op, ref, *random_inputs(rng, op), channels_last=True)


def test_deconv_mpq_picks_the_output_size(rng, path):
    for mpq in ((11, 5), (12, 5)):   # DHW (6, 5), strides (2, 1): 11 or 12 rows, 5 columns
        op, ref = build(rng, "deconv", "2d-same-stride-dilate", MPQ=mpq)
        assert tuple(op.MPQ) == mpq and op.o_shape(4) == [4, op.K, *mpq]
        check(op, ref, *random_inputs(rng, op))
    with pytest.raises(ValueError, match=r"MPQ\[0\] must be in \[11, 12\].*got 13"):
        build(rng, "deconv", "2d-same-stride-dilate", MPQ=(13, 5))
    with pytest.raises(ValueError, match=r"MPQ\[1\] must be in \[5, 5\].*got 6"):
        build(rng, "deconv", "2d-same-stride-dilate", MPQ=(12, 6))


@pytest.mark.parametrize("form", ["stacked", "flat", "blocks"])
def test_filter_forms(rng, form):
    """f_shape(), the flat [size] form and a list of f_shape(b) filters give the same result."""
    op, ref = build(rng, "conv", "1d-same-s2", layout="uniform")
    F, x, dy, eb = random_inputs(rng, op)
    Ft = torch.tensor(F, requires_grad=True)
    given = {"stacked": Ft, "flat": Ft.reshape(-1), "blocks": list(Ft.unbind(0))}[form]
    y = op(given, torch.tensor(x), edge_bias=torch.tensor(eb))
    y.backward(torch.tensor(dy))
    want_y, _, want_dF, _ = conv_products(ref, F, x, dy, eb)
    assert rel_error(y, want_y) < 1e-5 and rel_error(Ft.grad, want_dF) < 1e-5


def test_edge_bias_is_optional_and_zero_sized_without_padding(rng):
    op, ref = build(rng, "conv", "2d-same-even-filter")
    F, x, _, _ = random_inputs(rng, op)
    y = op(torch.tensor(F), torch.tensor(x))          # no edge bias passed: none added
    assert rel_error(y, conv_products(ref, F, x, np.zeros(op.o_shape(2)))[0]) < 1e-5
    valid, _ = build(rng, "conv", "2d-valid-stride-dilate")
    assert valid.edge_bias_shape() == (valid.K, 0)
    out = valid(torch.tensor(random_inputs(rng, valid)[0]), torch.tensor(random_inputs(rng, valid)[1]),
                edge_bias=torch.zeros(valid.K, 0))
    assert out.shape == tuple(valid.o_shape(2))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_gain", [False, True], ids=["no-gain", "gain"])
def test_l2_normalize(rng, kind, with_gain):
    op, ref = build(rng, kind, "2d-same-stride-dilate")
    F = rng.standard_normal(op.f_shape())
    dout = rng.standard_normal(op.f_shape())
    gain = rng.standard_normal(op.K) if with_gain else None
    Ft = torch.tensor(F, requires_grad=True)
    gt = None if gain is None else torch.tensor(gain, requires_grad=True)
    out = op.l2_normalize(Ft, gain=gt, epsilon=1e-6, dtype=torch.float64)
    out.backward(torch.tensor(dout))
    want, want_dF, want_dg = l2_normalize_products(ref, F, dout, gain, 1e-6)
    assert out.dtype == torch.float64 and out.shape == Ft.shape
    assert rel_error(out, want) < 1e-12 and rel_error(Ft.grad, want_dF) < 1e-12
    if with_gain:
        assert rel_error(gt.grad, want_dg) < 1e-12


def test_l2_normalize_forms_dtype_and_zero_filters(rng):
    op, ref = build(rng, "conv", "1d-same-s2", layout="uniform")
    F = rng.standard_normal(op.f_shape()).astype(np.float32)
    F[1] = 0.0                                           # an all-zero block stays zero (epsilon)
    want = l2_normalize_products(ref, F, np.zeros_like(F))[0]
    stacked = op.l2_normalize(torch.tensor(F), dtype=np.float16)
    blocks = op.l2_normalize(list(torch.tensor(F).unbind(0)))
    assert stacked.dtype == torch.float16 and rel_error(stacked, want) < tolerance("fp16")
    assert isinstance(blocks, list) and rel_error(torch.stack(blocks), want) < 1e-6
    with pytest.raises(ValueError, match=r"gain must have shape \(K,\)"):
        op.l2_normalize(torch.tensor(F), gain=torch.ones(op.K + 1))
    with pytest.raises(ValueError, match="epsilon must be a number > 0"):
        op.l2_normalize(torch.tensor(F), epsilon=0)


def test_autocast(rng):
    op, ref = build(rng, "conv", "2d-same-stride-dilate")
    F, x, dy, eb = random_inputs(rng, op)
    xt, Ft = torch.tensor(x, requires_grad=True), torch.tensor(F, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = op(Ft, xt, edge_bias=torch.tensor(eb))
    assert y.dtype == torch.bfloat16
    y.float().backward(torch.tensor(dy))
    assert Ft.grad.dtype == torch.float32 and xt.grad.dtype == torch.float32
    as_bf16 = lambda a: torch.tensor(a).bfloat16().double().numpy()  # noqa: E731
    want_y, _, want_dF, _ = conv_products(ref, as_bf16(F), as_bf16(x), dy, as_bf16(eb))
    assert rel_error(y, want_y) < tolerance("bf16") and rel_error(Ft.grad, want_dF) < tolerance("bf16")


MIXED = {"F": ("F",), "edge_bias": ("edge_bias",), "both": ("F", "edge_bias")}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("f32", MIXED)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_float32_parameters_with_16bit_input(rng, path, kind, dtype, f32, device):
    """As TensorFlow's layer (and the original): a float32 filter (cast to the input's dtype for the
    product) and a float32 edge bias (added in float32) with float16 / bfloat16 input, outside autocast.
    Output and input gradient in the input's dtype, each parameter's gradient in its own; against float64."""
    dtype, f32 = DTYPES[dtype], MIXED[f32]
    op, ref = build(rng, kind, "2d-explicit-asymmetric", layout="uniform")
    F, x, dy, eb = random_inputs(rng, op, N=3)
    pdt = {p: torch.float32 if p in f32 else dtype for p in ("F", "edge_bias")}
    xt = torch.tensor(x).to(device, dtype).requires_grad_()
    Ft = torch.tensor(F).to(device, pdt["F"]).requires_grad_()
    et = torch.tensor(eb).to(device, pdt["edge_bias"]).requires_grad_()
    y = op(Ft, xt, edge_bias=et)
    dyt = torch.tensor(dy).to(device, dtype)
    y.backward(dyt)
    assert [t.dtype for t in (y, xt.grad, Ft.grad, et.grad)] == [dtype, dtype, pdt["F"], pdt["edge_bias"]]
    as64 = lambda v: v.detach().double().cpu().numpy()  # noqa: E731
    refs = conv_products(ref, as64(Ft.to(dtype)), as64(xt), as64(dyt), as64(et))  # the filter as the product saw it
    for name, got, want in zip(("y", "dx", "dF", "d_edge_bias"), (y, xt.grad, Ft.grad, et.grad), refs):
        err = rel_error(got, want)
        assert err < tolerance(dtype), f"{name}: relative error {err:.2e} > {tolerance(dtype):.0e}"
    if "F" in f32:  # the same bits as the filter cast by the caller
        assert torch.equal(y, op(Ft.to(dtype), xt, edge_bias=et))


def test_float32_parameters_with_16bit_input_compiled(rng):
    """The mixed-precision call traces without graph breaks and matches the eager one."""
    op, _ = build(rng, "deconv", "2d-explicit-asymmetric", layout="uniform")
    F, x, dy, eb = random_inputs(rng, op)
    fn = torch.compile(lambda F, x, eb: op(F, x, edge_bias=eb), fullgraph=True, backend="aot_eager")
    outs = []
    for call in (fn, lambda F, x, eb: op(F, x, edge_bias=eb)):
        Ft, et = (torch.tensor(a, requires_grad=True) for a in (F, eb))
        xt = torch.tensor(x).bfloat16().requires_grad_()
        y = call(Ft, xt, et)
        y.backward(torch.tensor(dy).bfloat16())
        outs.append((y, xt.grad, Ft.grad, et.grad))
    assert [t.dtype for t in outs[0]] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    for got, want in zip(*outs):
        assert rel_error(got, want) < 1e-6


@pytest.mark.parametrize("F_dtype, eb_dtype, x_dtype, bad", [
    ("float16", "float32", "float32", "F"),
    ("float16", "bfloat16", "bfloat16", "F"),
    ("bfloat16", "float16", "float16", "F"),
    ("float32", "float16", "float64", "F"),
    ("float32", "bfloat16", "float32", "edge_bias"),
    ("float32", "float16", "bfloat16", "edge_bias"),
    ("float64", "float64", "float16", "F"),
    ("float16", "float64", "float16", "edge_bias"),
])
def test_other_dtype_mismatches_raise(rng, F_dtype, eb_dtype, x_dtype, bad):
    """Only float32 parameters go with 16-bit input: any other mismatch is a TypeError naming the argument."""
    op, _ = build(rng, "conv", "2d-explicit-asymmetric", layout="uniform")
    F, x, _, eb = random_inputs(rng, op)
    got = {"F": F_dtype, "edge_bias": eb_dtype}[bad]
    with pytest.raises(TypeError, match=rf"^{bad} and I must have the same dtype \(or {bad} float32 with float16 / "
                                        rf"bfloat16 I\); got torch.{got} and torch.{x_dtype}$"):
        op(torch.tensor(F).to(getattr(torch, F_dtype)), torch.tensor(x).to(getattr(torch, x_dtype)),
           edge_bias=torch.tensor(eb).to(getattr(torch, eb_dtype)))


@pytest.mark.parametrize("kind, forced", [("conv", "grouped"), ("deconv", "dense")])
def test_torch_compile_fullgraph(rng, monkeypatch, kind, forced):
    """Both paths trace without graph breaks (one of each kind: compiling is slow on a CPU)."""
    monkeypatch.setattr(compute, "choose", lambda spec, x, training=False: forced)
    op, ref = build(rng, kind, "2d-same-stride-dilate")
    F, x, dy, eb = random_inputs(rng, op)
    fn = torch.compile(lambda F, x, eb: op(F, x, edge_bias=eb), fullgraph=True, backend="aot_eager")
    Ft, xt, et = (torch.tensor(a, requires_grad=True) for a in (F, x, eb))
    y = fn(Ft, xt, et)
    y.backward(torch.tensor(dy))
    want = conv_products(ref, F, x, dy, eb)
    for got, ref_value in zip((y, xt.grad, Ft.grad, et.grad), want):
        assert rel_error(got, ref_value) < 1e-5


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
def test_grouped_layer_compiled_with_a_dynamic_batch(rng, transposed):
    """A layer's filter is a Parameter: the grouped path traces under ``dynamic=True`` too (asking
    a symbolic stride whether it is 1 failed in Dynamo), for two batch sizes and channels-last input."""
    torch.manual_seed(int(rng.integers(2 ** 31)))
    bck = [([0, 1, 2], [0, 1]), ([3, 4, 5], [2, 3]), ([1, 2, 3], [4, 5])]  # a block whose channels are gathered
    layer, dense = (BlocksparseConvLayer(bck, (3, 3), (5, 4), path=p, transposed=transposed)
                    for p in ("grouped", "dense"))
    dense.load_state_dict(layer.state_dict())
    fn = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    for n, fmt in ((2, torch.contiguous_format), (3, torch.channels_last)):
        x = torch.randn(n, layer.conv.C, *layer.conv.DHW).to(memory_format=fmt)
        torch.testing.assert_close(fn(x), dense(x), rtol=1e-5, atol=1e-5)


def test_compiled_first_call_on_another_device(rng):
    """The first call on a device the tables were not copied to yet may be a compiled one: the
    copies are made while torch.compile traces (the meta device stands in for a GPU here)."""
    op, _ = build(rng, "conv", "2d-same-stride-dilate")
    F, x, _, _ = random_inputs(rng, op)
    F, x = (torch.tensor(a, device="meta") for a in (F, x))
    y = torch.compile(lambda F, x: op(F, x), fullgraph=True, backend="aot_eager")(F, x)
    assert y.device.type == "meta" and tuple(y.shape) == tuple(op.o_shape(x.shape[0]))


def test_one_compiled_function_over_several_ops(rng):
    """The same code compiled again for other ops (dynamo recompiles it, with "automatic dynamic"
    integers) stays right: an op's structure is read by its key, never made symbolic."""
    fn = torch.compile(lambda op, F, x: op(F, x), fullgraph=True)
    for kind, case in (("conv", "2d-same-stride-dilate"), ("conv", "2d-same-even-filter"), ("deconv", "2d-same-stride-dilate"),
                       ("conv", "2d-same-stride-dilate")):
        op, ref = build(rng, kind, case, edge_bias=False, layout=("random", "uniform")[int(rng.integers(2))])
        F, x, dy, _ = random_inputs(rng, op)
        Ft, xt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (F, x))
        y = fn(op, Ft, xt)
        y.backward(torch.tensor(dy, dtype=torch.float64))
        for got, want in zip((y, xt.grad, Ft.grad), conv_products(ref, F, x, dy)):
            assert rel_error(got, want) < 1e-10


def test_a_collected_op_leaves_no_entry():
    import gc

    from blocksparse.torch._live import LIVE

    op = BlocksparseConv([([0, 1], [0])], TRS=(3,), DHW=(8,))
    key = op._live_key
    assert LIVE[key]["spec"] is op.spec
    del op
    gc.collect()
    assert key not in LIVE


def test_layer_built_under_a_meta_default_device(rng):
    """``with torch.device("meta")`` (large-model initialisation), then ``to_empty()`` and a trained
    state dict: the layer computes what the trained one does (its tables are built on the CPU)."""
    bck = layout_bck(rng, "random")
    trained = BlocksparseConvLayer(bck, edge_bias=True, **CASES["2d-same-stride-dilate"])
    with torch.no_grad():
        trained.edge_bias.copy_(torch.randn(trained.edge_bias.shape))
    with torch.device("meta"):
        layer = BlocksparseConvLayer(bck, edge_bias=True, **CASES["2d-same-stride-dilate"])
    layer.to_empty(device="cpu")
    layer.load_state_dict(trained.state_dict())
    x = torch.randn(2, layer.conv.C, *layer.conv.DHW)
    torch.testing.assert_close(layer(x), trained(x))


def test_layer_module(rng):
    torch.manual_seed(int(rng.integers(2 ** 31)))
    layer = BlocksparseConvLayer(layout_bck(rng, "random"), edge_bias=True, **CASES["2d-same-stride-dilate"])
    assert tuple(layer.weight.shape) == tuple(layer.conv.f_shape())
    assert tuple(layer.edge_bias.shape) == layer.conv.edge_bias_shape() and not layer.edge_bias.any()
    # uniform init in +-1/sqrt(fan_in), fan_in = connected inputs times taps of the output channel
    spec = layer.conv.spec
    for b, (cs, ks) in enumerate(zip(spec.blocks.cs, spec.blocks.ks)):
        fan_in = [sum(c.size for c, k in zip(spec.blocks.cs, spec.blocks.ks) if kk in k) * spec.blocks.trs
                  for kk in ks]
        block = layer.weight.detach().reshape(-1)[spec.blocks.offsets[b]:spec.blocks.offsets[b + 1]].view(len(ks), -1)
        assert (block.abs().amax(1) <= torch.tensor(fan_in, dtype=torch.float32).rsqrt()).all()
    x = torch.randn(2, layer.conv.C, *layer.conv.DHW)
    layer(x).square().sum().backward()
    assert layer.weight.grad is not None and layer.edge_bias.grad is not None
    deconv = BlocksparseConvLayer([([0, 1], [0]), ([1, 2], [1])], TRS=(4,), DHW=(8,), strides=2, padding=1,
                                  transposed=True, dtype=torch.float64)
    assert deconv(torch.randn(3, 3, 8, dtype=torch.float64)).shape == (3, 2, 16)
    assert "transposed=True" in repr(deconv)


def grid_bck(rng, CB, KB, bs, density):
    """Aligned bs x bs channel blocks of a random block mask (every column covered), in shuffled order."""
    mask = rng.random((CB, KB)) < density
    mask[rng.integers(0, CB, KB), np.arange(KB)] = True
    blocks = [(list(range(c * bs, (c + 1) * bs)), list(range(k * bs, (k + 1) * bs))) for c, k in np.argwhere(mask)]
    return [blocks[i] for i in rng.permutation(len(blocks))]


POINTWISE = {
    "2d": dict(kind="conv", TRS=(1, 1), DHW=(3, 4), strides=1),
    "2d-stride2": dict(kind="conv", TRS=(1, 1), DHW=(5, 4), strides=2),
    "1d-valid": dict(kind="conv", TRS=(1,), DHW=(6,), strides=1, padding="VALID"),
    "3d-stride": dict(kind="conv", TRS=(1, 1, 1), DHW=(2, 3, 3), strides=(1, 2, 1)),
    "deconv-2d": dict(kind="deconv", TRS=(1, 1), DHW=(3, 3), strides=1),
}


@pytest.mark.parametrize("case", POINTWISE)
def test_matmul_path(rng, case):
    """1x1 convolutions on a block grid through the block-sparse matmul (its reference path here)."""
    args = dict(POINTWISE[case])
    kind = args.pop("kind")
    bck = grid_bck(rng, 3, 2, 16, 0.5)
    op = KINDS[kind](bck, **args)
    assert op.spec.pointwise is not None
    ref = case_of(op, bck, args.get("padding", "SAME"), kind == "deconv")
    F, x, dy, _ = random_inputs(rng, op)
    xt, Ft = torch.tensor(x, requires_grad=True), torch.tensor(F, requires_grad=True)
    y = compute.convolve(xt, Ft.reshape(-1), None, op.spec, op._tables, path="matmul")
    y.backward(torch.tensor(dy))
    for got, want in zip((y, xt.grad, Ft.grad), conv_products(ref, F, x, dy)):
        assert rel_error(got, want) < 1e-5


@pytest.mark.interpreter
def test_matmul_path_kernels(rng, monkeypatch):
    """The same through the matmul's Triton kernels (Triton's interpreter on the CPU), channels-last."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bck = grid_bck(rng, 2, 1, 16, 0.5)
    op = BlocksparseConv(bck, TRS=(1, 1), DHW=(4, 4), strides=2)
    ref = case_of(op, bck, "SAME", False)
    F, x, dy, _ = random_inputs(rng, op, N=1)
    xt = torch.tensor(x).to(memory_format=torch.channels_last).requires_grad_()
    Ft = torch.tensor(F, requires_grad=True)
    y = compute.convolve(xt, Ft.reshape(-1), None, op.spec, op._tables, path="matmul")
    y.backward(torch.tensor(dy))
    for got, want in zip((y, xt.grad, Ft.grad), conv_products(ref, F, x, dy)):
        assert rel_error(got, want) < 1e-5


def test_path_choice(rng, monkeypatch):
    """The measured rule (bench/results/conv-h200.md): forward-only calls of 128-channel blocks at
    density <= 0.25 take the grouped path; narrower blocks, denser layouts, 1x1 layers and every
    call that will be differentiated take the dense masked convolution."""
    def checkerboard(width, keep):
        n = 512 // width
        return BlocksparseConv([(range(c * width, (c + 1) * width), range(k * width, (k + 1) * width))
                                for c in range(n) for k in range(n) if (c + k) % keep == 0], (3, 3), (8, 8))

    wide, narrow, half = checkerboard(128, 4), checkerboard(32, 4), checkerboard(128, 2)
    dense = BlocksparseConv([(range(64), range(64))], (3, 3), (8, 8))
    # one random block per column: density 1/4, always sparse enough for the matmul path
    pointwise = BlocksparseConv(grid_bck(rng, 4, 4, 128, 0.0), (1, 1), (8, 8))
    cuda_like = type("T", (), {"is_cuda": True})()
    assert compute.choose(wide.spec, cuda_like) == "grouped"
    assert compute.choose(wide.spec, cuda_like, training=True) == "dense"
    assert compute.choose(narrow.spec, cuda_like) == "dense"
    assert compute.choose(half.spec, cuda_like) == "dense"
    assert compute.choose(pointwise.spec, cuda_like) == "dense"
    assert compute.choose(dense.spec, cuda_like) == "dense"
    assert compute.choose(wide.spec, torch.zeros(1)) == "dense"
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    assert compute.choose(wide.spec, cuda_like) == "dense"


# ---------------------------------------------------------------------------- bad input
def test_bad_inputs(rng):
    op, _ = build(rng, "conv", "2d-same-stride-dilate", layout="uniform")
    F, x, _, eb = (torch.tensor(a) for a in random_inputs(rng, op))
    with pytest.raises(ValueError, match=r"I must have shape i_shape\(N\) = \[N, C\] \+ DHW = \['N', 7, 6, 5\]"):
        op(F, x[:, :3])
    with pytest.raises(ValueError, match="I must have shape"):
        op(F, x[0])
    with pytest.raises(TypeError, match="I must be floating point"):
        op(F, x.long())
    with pytest.raises(TypeError, match="I must be a torch.Tensor"):
        op(F, x.numpy())
    with pytest.raises(ValueError, match=r"F must have shape \(4, 2, 3, 3, 3\) or \(216,\)"):
        op(F[:3], x)
    with pytest.raises(ValueError, match="one filter per block"):
        op(list(F.unbind(0))[:3], x)
    with pytest.raises(ValueError, match=r"F\[1\] must have shape f_shape\(1\)"):
        op([F[0], F[1, :1], F[2], F[3]], x)
    with pytest.raises(TypeError, match=r"F and I must have the same dtype \(or F float32 with float16 / bfloat16 I\)"):
        op(F.double(), x)
    with pytest.raises(TypeError, match="edge_bias must be floating point"):
        op(F, x.half(), edge_bias=eb.int())
    with pytest.raises(ValueError, match=r"edge_bias must have shape \(7, 5\) = edge_bias_shape\(\); got \(7, 2\)"):
        op(F, x, edge_bias=eb[:, :2])
    plain, _ = build(rng, "conv", "2d-same-stride-dilate", layout="uniform", edge_bias=False)
    with pytest.raises(ValueError, match=r"shape \(7, 0\) = edge_bias_shape\(\) \(built with edge_bias=False"):
        plain(F, x, edge_bias=eb)
    assert torch.equal(plain(F, x, edge_bias=torch.zeros(plain.edge_bias_shape())), plain(F, x))
    with pytest.raises(TypeError, match="edge_bias must be a bool"):
        BlocksparseConv(layout_bck(rng, "uniform"), (3,), (8,), edge_bias=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["2d-same-stride-dilate", "2d-explicit-asymmetric", "3d-same"])
def test_cuda(rng, monkeypatch, path, kind, case, dtype):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 tolerance: no TF32
    op, ref = build(rng, kind, case)
    check(op, ref, *random_inputs(rng, op, N=4), dtype=DTYPES[dtype], device="cuda",
          channels_last=case.startswith("2d"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POINTWISE)
def test_cuda_matmul_path(rng, monkeypatch, case, dtype):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(compute, "choose", lambda spec, x, training=False: "matmul")
    args = dict(POINTWISE[case])
    kind = args.pop("kind")
    bck = grid_bck(rng, 3, 2, 32, 0.5)
    op = KINDS[kind](bck, **args)
    check(op, case_of(op, bck, args.get("padding", "SAME"), kind == "deconv"), *random_inputs(rng, op, N=4),
          dtype=DTYPES[dtype], device="cuda", channels_last=len(args["TRS"]) == 2)


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_edge_bias_at_batch_one(rng, kind):
    """Inductor, one image, an input without gradient: the edge bias is gathered by a form Inductor
    compiles right (it miscompiled ``index_select``'s gradient there: wrong values, heap corruption)."""
    op, ref = build(rng, kind, "2d-same-stride-dilate")
    F, x, dy, eb = random_inputs(rng, op, N=1)
    fn = torch.compile(lambda F, x, eb: op(F, x, edge_bias=eb), fullgraph=True)
    Ft, et = (torch.tensor(a, requires_grad=True) for a in (F, eb))
    y = fn(Ft, torch.tensor(x), et)
    y.backward(torch.tensor(dy))
    y_ref, _, dF_ref, deb_ref = conv_products(ref, F, x, dy, eb)
    for got, want in zip((y, Ft.grad, et.grad), (y_ref, dF_ref, deb_ref)):
        assert rel_error(got, want) < 1e-5


@pytest.mark.parametrize("padding", ["VALID", 0])
def test_edge_bias_without_edge_patterns_gets_an_empty_gradient(rng, padding):
    """A convolution without padding has no edge pattern: its ``(K, 0)`` edge bias adds nothing and
    still gets a gradient (an empty one, as TensorFlow gives), so every parameter of the layer does."""
    from blocksparse.torch import BlocksparseConvLayer

    layer = BlocksparseConvLayer([(range(0, 4), range(0, 4))], TRS=(3, 3), DHW=(5, 5), padding=padding,
                                 edge_bias=True)
    assert tuple(layer.edge_bias.shape) == (4, 0)
    x = torch.from_numpy(rng.standard_normal((2, 4, 5, 5))).float()
    y = layer(x)
    y.sum().backward()
    assert layer.edge_bias.grad is not None and tuple(layer.edge_bias.grad.shape) == (4, 0)
    w = layer.weight.detach()[0]
    want = torch.nn.functional.conv2d(x.double(), w.double())
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
