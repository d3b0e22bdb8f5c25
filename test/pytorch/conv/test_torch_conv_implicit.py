"""The implicit-GEMM path of the PyTorch convolution: the Triton kernel (Triton's interpreter on the
CPU, ``BLOCKSPARSE_BACKEND=triton``) against the float64 numpy reference -- values and gradients,
strides, dilations, padding modes, odd sizes, 1-D to 3-D, arbitrary channels, half types,
channels-last and empty inputs, ``torch.compile`` -- plus the ``path`` option and its errors."""
import numpy as np
import pytest
import torch

from blocksparse.testing import rel_error, tolerance
from blocksparse.testing.conv import CASES, case_of, conv_products, layout_bck, make_op, random_inputs
from blocksparse.torch import BlocksparseConv, BlocksparseConvLayer, BlocksparseDeconv
from blocksparse.torch._conv import compute
from blocksparse.torch._conv import implicit as implicit_glue

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture
def kernels(monkeypatch):
    """The kernels serve CPU tensors (through the interpreter)."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")


def check_all(op, ref, F, x, dy, eb, channels_last=False, bound=1e-5):
    xt, Ft = torch.tensor(x, requires_grad=True), torch.tensor(F, requires_grad=True)
    et = None if eb is None else torch.tensor(eb, requires_grad=True)
    y = op(Ft, xt.to(memory_format=torch.channels_last) if channels_last else xt, edge_bias=et)
    assert tuple(y.shape) == tuple(op.o_shape(x.shape[0]))
    y.backward(torch.tensor(dy))
    want = conv_products(ref, F, x, dy, eb)
    got = (y, xt.grad, Ft.grad, None if et is None else et.grad)
    for name, got, ref_value in zip(("y", "dx", "dF", "d_edge_bias"), got, want):
        if ref_value is None or ref_value.size == 0:
            continue
        err = rel_error(got, ref_value)
        assert err < bound, f"{name}: relative error {err:.2e} > {bound:.0e}"


@pytest.mark.interpreter
@pytest.mark.parametrize("layout, case", [("uniform", case) for case in CASES]
                         + [("random", case) for case in CASES if not case.startswith("3d")])
def test_values_and_gradients(rng, kernels, case, layout):
    op, ref = make_op(BlocksparseConv, rng, case, layout=layout, path="implicit")
    check_all(op, ref, *random_inputs(rng, op))


@pytest.mark.interpreter
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_wide_aligned_blocks(rng, kernels, channels_last):
    """Block-aligned 16- and 32-channel blocks (full tensor-core tiles, merged runs), odd image."""
    bck = [(range(0, 16), range(0, 32)), (range(32, 48), range(0, 32)), (range(16, 32), range(32, 48))]
    op = BlocksparseConv(bck, TRS=(3, 3), DHW=(5, 7), strides=(1, 2), padding="SAME", path="implicit")
    ref = case_of(op, bck, "SAME", False)
    F, x, dy, _ = random_inputs(rng, op, N=3)
    check_all(op, ref, F, x, dy, None, channels_last=channels_last)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_half_types(rng, kernels, dtype):
    """The kernel on half tensors (the public CPU call computes those in float32): float32
    accumulation, output in the input dtype."""
    dtype = DTYPES[dtype]
    op, ref = make_op(BlocksparseConv, rng, "2d-explicit-asymmetric", layout="uniform", edge_bias=False)
    F, x, dy, _ = random_inputs(rng, op)
    xt, Ft = torch.tensor(x).to(dtype), torch.tensor(F).to(dtype)
    dyt = torch.tensor(dy).to(dtype)
    tables = op._tables.on(xt.device)
    y = implicit_glue.conv_implicit_fwd(xt, Ft.reshape(-1), op.spec, tables, "ieee")
    dx = implicit_glue.conv_implicit_dx(dyt, Ft.reshape(-1), op.spec, tables, "ieee")
    assert y.dtype == dx.dtype == dtype
    want_y, want_dx, _, _ = conv_products(ref, Ft.double().numpy(), xt.double().numpy(), dyt.double().numpy())
    assert rel_error(y, want_y) < tolerance(dtype) and rel_error(dx, want_dx) < tolerance(dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize("case", ["2d-same-stride-dilate", "2d-explicit-asymmetric"])
def test_walking_the_step_table_ahead_changes_no_bit(rng, kernels, monkeypatch, case):
    """The ``PREFETCH`` tuning choice (each step's table row read by the step before) against the
    plain walk, forward and input gradient, bit for bit, and against float64."""
    import triton

    from blocksparse.ops.conv import implicit_gemm

    op, ref = make_op(BlocksparseConv, rng, case, layout="random", edge_bias=False)
    F, x, dy, _ = random_inputs(rng, op)
    xt, Ft, dyt = (torch.tensor(a).to(torch.bfloat16) for a in (x, F, dy))
    tables = op._tables.on(xt.device)
    kernel = implicit_gemm.conv_implicit_kernel
    got = {}
    for prefetch in (False, True):  # the autotuner takes a single config as it is
        monkeypatch.setattr(kernel, "configs", [triton.Config({"BM": 32, "PREFETCH": prefetch}, num_warps=4,
                                                              num_stages=1)])
        monkeypatch.setattr(kernel, "cache", {})
        got[prefetch] = (implicit_glue.conv_implicit_fwd(xt, Ft.reshape(-1), op.spec, tables, "ieee"),
                         implicit_glue.conv_implicit_dx(dyt, Ft.reshape(-1), op.spec, tables, "ieee"))
    want = conv_products(ref, Ft.double().numpy(), xt.double().numpy(), dyt.double().numpy())[:2]
    for a, b, w in zip(got[True], got[False], want):
        assert torch.equal(a, b) and rel_error(a, w) < tolerance(torch.bfloat16)


@pytest.mark.interpreter
def test_empty_batch_and_unwritten_outputs(rng, kernels):
    op = BlocksparseConv([([0, 2], [1, 3])], TRS=(3,), DHW=(6,), path="implicit")  # outputs 0, 2 unwritten
    F = torch.tensor(rng.standard_normal(op.f_shape()), dtype=torch.float32)
    assert op(F, torch.zeros(0, 3, 6)).shape == (0, 4, 6)
    x = torch.tensor(rng.standard_normal(op.i_shape(2)), dtype=torch.float32)
    y = op(F, x)
    assert not y[:, [0, 2]].any() and y[:, [1, 3]].abs().sum() > 0
    ref = case_of(op, [([0, 2], [1, 3])], "SAME", False)
    assert rel_error(y, conv_products(ref, F.numpy(), x.numpy(), np.zeros(op.o_shape(2)))[0]) < 1e-5
    x.requires_grad_()
    op(F, x).sum().backward()  # an expanded (stride 0) output gradient; input channel 1 is read by no block
    want_dx = conv_products(ref, F.numpy(), x.detach().numpy(), np.ones(op.o_shape(2)))[1]
    assert not x.grad[:, 1].any() and rel_error(x.grad, want_dx) < 1e-5


@pytest.mark.interpreter
@pytest.mark.parametrize("case, backend", [("2d-same-stride-dilate", "aot_eager"), ("2d-same-even-filter", "inductor")])
def test_torch_compile_fullgraph(rng, kernels, case, backend):
    """Traced, the backward too (strided: the dense input gradient; unit steps: the transposed
    kernel's, with the filter gradient's dense filter a zero fill, not an unread empty tensor, which
    inductor rejects once the tests' NaN poisoning writes it)."""
    op, ref = make_op(BlocksparseConv, rng, case, layout="uniform", path="implicit")
    F, x, dy, eb = random_inputs(rng, op)
    fn = torch.compile(lambda F, x, eb: op(F, x, edge_bias=eb), fullgraph=True, backend=backend)
    Ft, xt, et = (torch.tensor(a, requires_grad=True) for a in (F, x, eb))
    y = fn(Ft, xt, et)
    y.backward(torch.tensor(dy))
    for got, want in zip((y, xt.grad, Ft.grad, et.grad), conv_products(ref, F, x, dy, eb)):
        assert rel_error(got, want) < 1e-5


@pytest.mark.interpreter
def test_copies_and_pickles_keep_working(rng, kernels):
    """A copied or unpickled op rebuilds its tables (the kernel's handle is per object and process)."""
    import copy
    import gc
    import pickle

    torch.manual_seed(int(rng.integers(2 ** 31)))
    layer = BlocksparseConvLayer([([0, 1], [0, 1]), ([2, 3], [1, 2])], TRS=(3,), DHW=(6,), path="implicit")
    x = torch.randn(2, 4, 6)
    want = layer(x).detach()
    copied, unpickled = copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))
    del layer
    gc.collect()
    assert torch.equal(copied(x), want) and torch.equal(unpickled(x), want)
    assert "path='implicit'" in repr(copied)
    with pytest.raises(AttributeError):
        copied.conv.path = "dense"


def test_without_kernels_the_dense_path_serves(rng, monkeypatch):
    """CPU tensors without the interpreter backend, and float64, take the dense path (no error)."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
    calls = []
    monkeypatch.setattr(implicit_glue, "conv_implicit_fwd", lambda *a: calls.append(a))
    layer = BlocksparseConvLayer(layout_bck(rng, "uniform"), TRS=(3, 3), DHW=(5, 5), path="implicit",
                                 dtype=torch.float64)
    x = torch.randn(2, layer.conv.C, 5, 5, dtype=torch.float64)
    ref = case_of(layer.conv, layout_bck(rng, "uniform"), "SAME", False)
    want = conv_products(ref, layer.weight.detach().numpy(), x.numpy(), np.zeros(layer.conv.o_shape(2)))[0]
    assert rel_error(layer(x), want) < 1e-12 and not calls


def test_path_choice_follows_the_table(monkeypatch):
    """``choose`` takes the implicit path only where the measured table says (it says never yet)."""
    from blocksparse.ops.conv import implicit as implicit_plan

    op = BlocksparseConv([(range(c * 64, c * 64 + 64), range(k * 64, k * 64 + 64)) for c in range(4)
                          for k in range(4) if c == k], (3, 3), (8, 8))  # density 0.25, 64-channel blocks
    cuda_like = type("T", (), {"is_cuda": True})()
    monkeypatch.setattr(implicit_glue, "kernels_serve", lambda x: True)
    assert compute.choose(op.spec, cuda_like, training=True) == "dense"
    table = {**implicit_plan.IMPLICIT_MAX_DENSITY, (64, "fwd+bwd"): 0.25}
    monkeypatch.setattr(implicit_plan, "IMPLICIT_MAX_DENSITY", table)
    assert compute.choose(op.spec, cuda_like, training=True) == "implicit"
    assert compute.choose(op.spec, cuda_like, training=False) != "implicit"


def test_bad_path(rng):
    bck = layout_bck(rng, "uniform")
    with pytest.raises(ValueError, match=r"path must be one of 'auto', 'dense', 'grouped', 'matmul', 'implicit'; "
                                         r"got 'cudnn'"):
        BlocksparseConv(bck, (3, 3), (5, 5), path="cudnn")
    with pytest.raises(ValueError, match="path must be one of .*; got 3"):
        BlocksparseConv(bck, (3, 3), (5, 5), path=3)
    with pytest.raises(ValueError, match="path='implicit' serves convolutions only"):
        BlocksparseDeconv(bck, (3, 3), (5, 5), path="implicit")
    with pytest.raises(ValueError, match="path='matmul' needs a 1x1 convolution"):
        BlocksparseConv(bck, (3, 3), (5, 5), path="matmul")
    with pytest.raises(TypeError):
        BlocksparseConv(bck, (3, 3), (5, 5), "SAME", path="implicit")  # MPQ must not be a path


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", ["2d-same-stride-dilate", "2d-explicit-asymmetric", "3d-same", "1d-same-s2"])
def test_cuda(rng, case, dtype):
    dtype = {"fp32": torch.float32, **DTYPES}[dtype]
    op, ref = make_op(BlocksparseConv, rng, case, layout="random", path="implicit")
    F, x, dy, eb = random_inputs(rng, op)
    t = lambda a: torch.tensor(a, device="cuda").to(dtype).requires_grad_()  # noqa: E731
    Ft, xt, et = t(F), t(x), t(eb)
    y = op(Ft, xt, edge_bias=et)
    y.backward(torch.tensor(dy, device="cuda").to(dtype))
    as64 = lambda v: v.detach().double().cpu().numpy()  # noqa: E731
    want = conv_products(ref, as64(Ft), as64(xt), torch.tensor(dy).to(dtype).double().numpy(), as64(et))
    bound = tolerance(dtype, tf32=dtype == torch.float32 and torch.backends.cudnn.allow_tf32)
    for got, ref_value in zip((y, xt.grad, Ft.grad, et.grad), want):
        assert got.dtype == dtype and rel_error(got, ref_value) < bound


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("bs, stride", [(32, 1), (64, 2), (128, 1)], ids=["bs32", "bs64-s2", "bs128"])
def test_cuda_aligned_blocks(rng, bs, stride, dtype):
    """Block-aligned layouts (the vectorised, pipelined kernel: full tiles, ALIGN 16), channels-last,
    against float64 -- through the public call and under torch.compile."""
    dtype = {"fp32": torch.float32, **DTYPES}[dtype]
    CB = 256 // bs
    mask = rng.random((CB, CB)) < 0.5
    mask[rng.permutation(CB), np.arange(CB)] = True
    bck = [(range(c * bs, (c + 1) * bs), range(k * bs, (k + 1) * bs)) for c, k in np.argwhere(mask)]
    op = BlocksparseConv(bck, TRS=(3, 3), DHW=(14, 13), strides=stride, path="implicit")
    assert op.spec.implicit.align == 16
    ref = case_of(op, bck, "SAME", False)
    F, x, dy, _ = random_inputs(rng, op, N=3)
    bound = tolerance(dtype, tf32=dtype == torch.float32 and torch.backends.cudnn.allow_tf32)
    want = conv_products(ref, torch.tensor(F).to(dtype).double().numpy(), torch.tensor(x).to(dtype).double().numpy(),
                         torch.tensor(dy).to(dtype).double().numpy())
    for fn in (op, torch.compile(op.__call__, fullgraph=True)):
        Ft = torch.tensor(F, device="cuda").to(dtype).requires_grad_()
        xt = torch.tensor(x, device="cuda").to(dtype).to(memory_format=torch.channels_last).requires_grad_()
        y = fn(Ft, xt)
        y.backward(torch.tensor(dy, device="cuda").to(dtype))
        for got, ref_value in zip((y, xt.grad, Ft.grad), want):
            assert got.dtype == dtype and rel_error(got, ref_value) < bound


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_cuda_launches_from_the_kernel_library(rng, aot, monkeypatch, dtype):
    """With the kernel library, block-aligned 2-D layers of 16-bit dtypes launch its compiled specs
    in both directions (one call each, no Triton launcher), with the values of float64 and of the
    JIT; float32 and 3-D layers, which the library does not compile, keep the JIT."""
    dtype = {"fp32": torch.float32, **DTYPES}[dtype]
    mask = rng.random((4, 4)) < 0.5
    mask[rng.permutation(4), np.arange(4)] = True
    bck = [(range(c * 64, (c + 1) * 64), range(k * 64, (k + 1) * 64)) for c, k in np.argwhere(mask)]
    make = lambda: BlocksparseConv(bck, TRS=(3, 3), DHW=(9, 10), path="implicit")  # noqa: E731
    F, x, dy, _ = random_inputs(rng, make(), N=4)
    cuda = lambda a: torch.tensor(a, device="cuda").to(dtype)  # noqa: E731
    results = {}
    for kernels in ("library", "jit"):
        if kernels == "jit":
            monkeypatch.setenv("BLOCKSPARSE_KERNELS", "jit")
        op = make()
        Ft, xt = cuda(F).requires_grad_(), cuda(x).to(memory_format=torch.channels_last).requires_grad_()
        with torch.no_grad():
            first = op(Ft, xt)  # prepares the launches
        y = op(Ft, xt)
        y.backward(cuda(dy))
        assert torch.equal(first, y)
        results[kernels] = (y, xt.grad, Ft.grad)
        device_tables = op._tables.on(xt.device)
        want = "aot" if kernels == "library" and dtype != torch.float32 else "jit"
        assert implicit_glue.launch_path(device_tables, False) == implicit_glue.launch_path(device_tables, True) == want
        if kernels == "library":
            op3 = BlocksparseConv(bck, TRS=(3, 3, 3), DHW=(4, 5, 6), path="implicit")
            x3 = torch.randn(op3.i_shape(2), device="cuda", dtype=dtype)
            op3(torch.randn(op3.f_shape(), device="cuda", dtype=dtype), x3)
            assert implicit_glue.launch_path(op3._tables.on(x3.device), False) == "jit"
    ref = case_of(make(), bck, "SAME", False)
    as64 = lambda t: torch.tensor(t).to(dtype).double().numpy()  # noqa: E731
    want = conv_products(ref, as64(F), as64(x), as64(dy))
    bound = tolerance(dtype, tf32=dtype == torch.float32 and torch.backends.cudnn.allow_tf32)
    for got, jit, ref_value in zip(*results.values(), want):
        assert rel_error(got, ref_value) < bound and rel_error(got, jit) < bound / 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layer", ["s2", "s1-unwritten"])
def test_cuda_native_node(rng, aot, monkeypatch, layer, dtype):
    """With the kernel library and the native op, eager calls of block-aligned 2-D layers in 16-bit
    dtypes run as one C++ autograd node (``csrc/conv.cpp``; ``native_path`` says so; the strided layer's
    input gradient from the dense convolution, the other's from the transposed launch): the output and
    the gradients of the input and the filter against float64 and against the Python path
    (``BLOCKSPARSE_TORCH_NATIVE=off``), for two batch sizes, under ``no_grad`` too, also where a
    block column is empty (outputs and input gradients zero-filled); an input not on a 16-byte
    boundary and float32 keep the Python path."""
    from blocksparse.torch import _native

    if not _native.available():
        pytest.skip(f"the native op cannot be built here: {_native._state.get('why')}")
    dtype = DTYPES[dtype]
    mask = rng.random((4, 4)) < 0.5
    mask[rng.permutation(4), np.arange(4)] = True
    if layer == "s1-unwritten":  # output block 1 and input block 2 empty: written by no block
        mask[:, 1] = mask[2, :] = False
        mask[0, 0] = mask[3, 3] = True
    bck = [(range(c * 64, (c + 1) * 64), range(k * 64, (k + 1) * 64)) for c, k in np.argwhere(mask)]
    op = BlocksparseConv(bck, TRS=(3, 3), DHW=(9, 10), strides=2 if layer == "s2" else 1, path="implicit")
    assert op.spec.implicit.covers == op.spec.implicit_grad.covers == (layer == "s2")
    ref = case_of(op, bck, "SAME", False)
    bound = tolerance(dtype)
    cuda = lambda a: torch.tensor(a, device="cuda").to(dtype)  # noqa: E731
    as64 = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    for n in (4, 3):
        F, x, dy, _ = random_inputs(rng, op, N=n)
        results = {}
        for setting in ("auto", "off"):
            monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", setting)
            Ft, xt = cuda(F).requires_grad_(), cuda(x).to(memory_format=torch.channels_last).requires_grad_()
            y = op(Ft, xt)
            node = type(y.grad_fn).__name__
            assert node == ("CppFunction" if setting == "auto" else "ImplicitConvFunctionBackward"), setting
            with torch.no_grad():
                assert torch.equal(op(Ft, xt), y)
            y.backward(cuda(dy))
            results[setting] = (y, xt.grad, Ft.grad)
        want = conv_products(ref, as64(Ft), as64(xt), as64(cuda(dy)))
        for name, native, python, ref_value in zip(("y", "dx", "dF"), *results.values(), want):
            assert native.dtype == dtype and native.shape == python.shape, name
            assert rel_error(native, ref_value) < bound and rel_error(native, python) < bound / 4, name
    # a strided layer's input gradient is the dense convolution's: no transposed launch
    assert glue_paths(op._tables.on(xt.device)) == ("native", "aot", None if layer == "s2" else "aot")
    monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", "auto")
    storage = torch.empty(x.size + 1, device="cuda", dtype=dtype)
    unaligned = storage[1:].view(x.shape).copy_(cuda(x)).requires_grad_()
    Ft = cuda(F).requires_grad_()
    y = op(Ft, unaligned)
    assert type(y.grad_fn).__name__ == "ImplicitConvFunctionBackward"
    assert rel_error(y, conv_products(ref, as64(Ft), as64(unaligned), as64(cuda(dy)))[0]) < bound
    op32 = BlocksparseConv(bck, TRS=(3, 3), DHW=(9, 10), path="implicit")
    x32 = torch.randn(op32.i_shape(2), device="cuda", requires_grad=True)
    y = op32(torch.randn(op32.f_shape(), device="cuda"), x32)
    assert type(y.grad_fn).__name__ == "ImplicitConvFunctionBackward"
    assert implicit_glue.native_path(op32._tables.on(x32.device)) == "python"


def glue_paths(device_tables):
    """``native_path`` and ``launch_path`` of both directions."""
    return (implicit_glue.native_path(device_tables), implicit_glue.launch_path(device_tables, False),
            implicit_glue.launch_path(device_tables, True))


def _pointwise_op(path):
    bck = [(range(0, 16), range(0, 16)), (range(16, 32), range(16, 32)), (range(0, 16), range(32, 48))]
    return BlocksparseConv(bck, TRS=(1,), DHW=(6,), path=path), bck


@pytest.mark.interpreter
@pytest.mark.parametrize("path", ["implicit", "matmul"])
def test_forward_mode_tangents_are_carried(rng, kernels, path):
    """A forward-mode tangent through the kernels' paths: the dense path's plain ops carry it (the
    kernels' autograd nodes know only reverse mode and would drop it silently)."""
    import torch.autograd.forward_ad as fwad
    op, bck = _pointwise_op(path)
    ref = case_of(op, bck, "SAME", False)
    F, x, dy, _ = random_inputs(rng, op, N=2)
    t = rng.standard_normal(x.shape).astype(np.float32)
    for needs_grad in (False, True):
        with fwad.dual_level():
            y = op(torch.tensor(F), fwad.make_dual(torch.tensor(x).requires_grad_(needs_grad), torch.tensor(t)))
            tangent = fwad.unpack_dual(y).tangent
        assert tangent is not None, needs_grad
        assert rel_error(tangent, conv_products(ref, F, t, dy)[0]) < 1e-5  # the op is linear in x
    fn = lambda xx: op(torch.tensor(F), xx)  # noqa: E731
    _, jvp_out = torch.func.jvp(fn, (torch.tensor(x),), (torch.tensor(t),))
    assert rel_error(jvp_out, conv_products(ref, F, t, dy)[0]) < 1e-5


@pytest.mark.interpreter
def test_second_derivatives(rng, kernels):
    """A gradient of a gradient through the implicit path (``create_graph=True``): the dense
    convolution's differentiable gradients, checked against a float64 dense convolution."""
    op, ref = make_op(BlocksparseConv, rng, "2d-same-even-filter", layout="uniform", path="implicit", edge_bias=False)
    F, x, dy, _ = random_inputs(rng, op)
    results = []
    for dtype in (torch.float32, torch.float64):  # float64: the kernels cannot run, the dense path serves
        Ft, xt = (torch.tensor(a, dtype=dtype, requires_grad=True) for a in (F, x))
        y = op(Ft, xt)
        (dx,) = torch.autograd.grad(y, xt, torch.tensor(dy, dtype=dtype), create_graph=True)
        (ddF,) = torch.autograd.grad(dx.square().sum(), Ft)
        results.append((dx, ddF))
    assert rel_error(results[0][0], conv_products(ref, F, x, dy)[1]) < 1e-5
    assert rel_error(results[0][1], results[1][1].detach().numpy()) < 1e-5


@pytest.mark.interpreter
def test_equal_convolutions_keep_their_own_tables(rng, kernels):
    """The implicit path's handles are named by content: an equal op built under FakeTensorMode (its
    tables fake) must not serve a real one's calls and gradients."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    bck = [([0, 1], [0, 1]), ([2, 3], [2])]
    with FakeTensorMode():
        fake = BlocksparseConv(bck, (3, 3), (6, 6), path="implicit")
    real = BlocksparseConv(bck, (3, 3), (6, 6), path="implicit")
    assert fake._tables._cpu.implicit_handle != real._tables._cpu.implicit_handle
    assert implicit_glue._tables(real._tables._cpu.implicit_handle) is real._tables
    ref = case_of(real, bck, "SAME", False)
    F, x, dy, _ = random_inputs(rng, real, N=2)
    check_all(real, ref, F, x, dy, None)
