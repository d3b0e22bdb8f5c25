"""blocksparse.torch.layer_norm: values and gradients against float64 on both paths, both layouts,
segments, relu, optional gain / bias; torch.compile, autocast, bad input."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch import layer_norm  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def _inputs(rng, dtype, axis, n, c, affine=(True, True)):
    """(x, g, b, dy) as leaf tensors of ``dtype`` (g / b None where ``affine`` says so)."""
    x, g, b, dy = (torch.from_numpy(a).to(DTYPES[dtype]) for a in ref.draw_layer_norm(rng, n, c, axis))
    g, b = (p.requires_grad_() if keep else None for p, keep in zip((g, b), affine))
    return x.requires_grad_(), g, b, dy


def _f64(t):
    return None if t is None else t.detach().double().numpy()


def _check(x, g, b, dy, tol, **kw):
    """layer_norm's value and gradients against the float64 formulas (on the same rounded inputs)."""
    ref_kw = dict(kw, axis=kw.get("axis", 1) % 2)
    y_ref = ref.layer_norm(_f64(x), _f64(g), _f64(b), **ref_kw)
    if kw.get("relu"):
        dy = torch.from_numpy(ref.relu_safe(_f64(dy), y_ref)).to(dy.dtype)
    y = layer_norm(x, g, b, **kw)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert rel_error(y, y_ref) < tol
    leaves = [t for t in (x, g, b) if t is not None]
    grads = dict(zip(("x", "g", "b"), ref.layer_norm_grad(_f64(dy), _f64(x), _f64(g), _f64(b), **ref_kw)))
    got = dict(zip([n for n, t in zip("xgb", (x, g, b)) if t is not None], torch.autograd.grad(y, leaves, dy)))
    for name, leaf in zip("xgb", (x, g, b)):
        if leaf is not None:
            assert got[name].dtype == leaf.dtype and got[name].shape == leaf.shape, name
            assert rel_error(got[name], grads[name]) < max(tol, tolerance(leaf.dtype)), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("c", [96, 200])
@pytest.mark.parametrize("segments", [1, 2, 4])
@pytest.mark.parametrize("relu", [False, True], ids=["linear", "relu"])
def test_reference_path(rng, monkeypatch, dtype, axis, c, segments, relu):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    x, g, b, dy = _inputs(rng, dtype, axis, 7, c)
    _check(x, g, b, dy, tolerance(dtype), axis=axis, epsilon=1e-5, relu=relu, segments=segments)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype, axis, n, c, segments, relu", [
    ("float32", 1, 7, 96, 4, True), ("bfloat16", 0, 9, 200, 2, False), ("float16", 1, 1, 200, 1, True),
    ("float32", 0, 5, 96, 1, True)],
    ids=["NC-fp32-s4-relu", "CN-bf16-s2", "NC-fp16-n1-relu", "CN-fp32-relu"])
def test_triton_path(rng, monkeypatch, dtype, axis, n, c, segments, relu):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    x, g, b, dy = _inputs(rng, dtype, axis, n, c)
    _check(x, g, b, dy, tolerance(dtype), axis=axis, epsilon=1e-6, relu=relu, segments=segments)


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("affine", [(True, False), (False, True), (False, False)], ids=["g", "b", "none"])
def test_without_gain_or_bias(rng, monkeypatch, backend, affine):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    x, g, b, dy = _inputs(rng, "float32", 1, 6, 40, affine)
    _check(x, g, b, dy, tolerance("float32"), relu=True, segments=2)


def test_parameters_of_any_shape_with_c_elements(rng):
    """Like the original, g and b need C elements, not shape (C,); their gradients keep their shape."""
    x, g, b, dy = _inputs(rng, "float32", 0, 5, 24)
    g2, b2 = g.detach().reshape(24, 1).requires_grad_(), b.detach().reshape(1, 24).requires_grad_()
    y = layer_norm(x, g2, b2, axis=0)
    dg, db = torch.autograd.grad(y, (g2, b2), dy)
    assert dg.shape == (24, 1) and db.shape == (1, 24)
    _, dg_ref, db_ref = ref.layer_norm_grad(_f64(dy), _f64(x), _f64(g), _f64(b), axis=0)
    assert rel_error(dg.reshape(-1), dg_ref) < 1e-5 and rel_error(db.reshape(-1), db_ref) < 1e-5


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("axis", [1, 0])
def test_strided_and_expanded_parameters(rng, monkeypatch, backend, axis):
    """g and b as strided views (every other element of a longer tensor) or expanded from one
    element: read as the values they show, their gradients in their own shapes."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    x, g, b, dy = _inputs(rng, "float32", axis, 12, 48)
    g_wide = torch.from_numpy(rng.standard_normal(96)).float().requires_grad_()
    _check(x, g_wide[::2], b, dy, 1e-5, axis=axis)
    one = torch.tensor([1.5], requires_grad=True)
    y = layer_norm(x, one.expand(48), b, axis=axis)
    want = ref.layer_norm(_f64(x), np.full(48, 1.5), _f64(b), axis=axis)
    assert rel_error(y, want) < 1e-5
    (d_one,) = torch.autograd.grad(y, one, dy)
    xhat = ref.layer_norm(_f64(x), np.ones(48), np.zeros(48), axis=axis)
    terms = _f64(dy) * xhat  # (a sum that may nearly cancel: its error against the terms' magnitudes)
    assert d_one.shape == (1,) and abs(float(d_one) - terms.sum()) < 1e-5 * np.abs(terms).sum()


@pytest.mark.parametrize("axis", [1, 0, -1, -2])
def test_strided_input(rng, axis):
    """A transposed view (the other memory order) gives the same answer; negative axes count from the end."""
    x, g, b, dy = _inputs(rng, "float32", axis % 2, 6, 32)
    xt = x.detach().t().contiguous().t().requires_grad_()
    _check(xt, g, b, dy, tolerance("float32"), axis=axis, segments=2)


@pytest.mark.parametrize("axis", [1, -2])
def test_features_on_a_middle_axis(rng, axis):
    """(B, C, T), as TensorFlow's takes it: as the features-last call on the moved axes, against float64."""
    x, g, b, dy = _inputs(rng, "float32", 1, 12, 32)
    x3 = x.detach().reshape(3, 4, 32).permute(0, 2, 1).contiguous().requires_grad_()  # (3, 32, 4)
    dy3 = dy.reshape(3, 4, 32).permute(0, 2, 1)
    y = layer_norm(x3, g, b, axis=axis, segments=2, relu=True)
    assert y.shape == (3, 32, 4) and y.is_contiguous()
    x64 = x3.detach().double().requires_grad_()
    g64, b64 = (t.detach().double().requires_grad_() for t in (g, b))
    parts = x64.reshape(3, 2, 16, 4)
    mean, var = parts.mean(2, keepdim=True), parts.var(2, unbiased=False, keepdim=True)
    want = (((parts - mean) / torch.sqrt(var + 1e-6)).reshape(3, 32, 4) * g64[:, None] + b64[:, None]).relu()
    tol = tolerance("float32")
    assert rel_error(y.detach().double().numpy(), want.detach().numpy()) < tol
    got = torch.autograd.grad(y, (x3, g, b), dy3)
    ref = torch.autograd.grad(want, (x64, g64, b64), dy3.double())
    for a, r in zip(got, ref):
        assert rel_error(a.double().numpy(), r.numpy()) < tol


@pytest.mark.parametrize("axis", [-1, 2, 0])
def test_more_token_axes(rng, axis):
    """(B, T, C) with features last, or (C, B, T) first: as the 2-D call on the tokens flattened."""
    x, g, b, dy = _inputs(rng, "float64", 1 if axis else 0, 12, 32)
    shape = (3, 4, 32) if axis else (32, 3, 4)
    x3 = x.detach().reshape(shape).requires_grad_()
    y = layer_norm(x3, g, b, axis=axis, segments=2)
    y2 = layer_norm(x, g, b, axis=1 if axis else 0, segments=2)
    assert y.shape == shape
    torch.testing.assert_close(y, y2.reshape(shape))
    got = torch.autograd.grad(y, (x3, g, b), dy.reshape(shape))
    want = torch.autograd.grad(y2, (x, g, b), dy)
    torch.testing.assert_close(got[0], want[0].reshape(shape))
    torch.testing.assert_close(got[1:], want[1:])


def test_empty_batch():
    x = torch.empty(0, 16, requires_grad=True)
    g = torch.ones(16, requires_grad=True)
    y = layer_norm(x, g, None)
    assert y.shape == (0, 16)
    (dg,) = torch.autograd.grad(y.sum(), (g,))
    assert torch.equal(dg, torch.zeros(16))


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("x_dtype, g_dtype, b_dtype", [("bfloat16", "float32", "float32"),
                                                       ("float32", "float16", "float64")],
                         ids=["bf16-x-fp32-params", "fp32-x-fp16-g-fp64-b"])
def test_parameter_dtypes(rng, monkeypatch, backend, x_dtype, g_dtype, b_dtype):
    """g and b may have any float dtype; their gradients come in it."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    x, g, b, dy = _inputs(rng, x_dtype, 1, 7, 64)
    g, b = g.detach().to(DTYPES[g_dtype]).requires_grad_(), b.detach().to(DTYPES[b_dtype]).requires_grad_()
    _check(x, g, b, dy, tolerance(x_dtype), segments=2)


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_torch_compile_fullgraph(rng, monkeypatch, backend):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    x, g, b, dy = _inputs(rng, "float32", 0, 9, 48)

    def fn(x, g, b):
        return layer_norm(x, g, b, axis=0, relu=True, segments=3) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    y = compiled(x, g, b)
    grads = torch.autograd.grad(y, (x, g, b), dy)
    y_eager = fn(x, g, b)
    torch.testing.assert_close(y, y_eager)
    for got, want in zip(grads, torch.autograd.grad(y_eager, (x, g, b), dy)):
        torch.testing.assert_close(got, want)


def test_torch_compile_of_transposed_inputs_and_gradients(rng):
    """Inputs and output gradients of any strides: the outputs are contiguous in eager calls too,
    as the ops' fake functions say (else the compiled graph's stride checks fail)."""
    x, g, b, dy = _inputs(rng, "float32", 1, 6, 16)
    xt = x.detach().t().contiguous().t().requires_grad_()
    w = dy.t().contiguous().t()

    def fn(x, g, b):
        return (layer_norm(x, g, b, axis=1, segments=2) * w).sum()

    torch._dynamo.reset()
    loss = torch.compile(fn, fullgraph=True)(xt, g, b)
    grads = torch.autograd.grad(loss, (xt, g, b))
    want = torch.autograd.grad(fn(xt, g, b), (xt, g, b))
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got, exp)
    assert layer_norm(xt, g, b, segments=2).is_contiguous()


def test_autocast_cpu(rng):
    """Under autocast the activations are cast to the autocast dtype; float32 parameters stay."""
    x, g, b, dy = _inputs(rng, "float32", 1, 8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer_norm(x, g, b, segments=2)
    assert y.dtype == torch.bfloat16
    x16 = x.detach().bfloat16().double().numpy()
    assert rel_error(y, ref.layer_norm(x16, _f64(g), _f64(b), segments=2)) < tolerance("bfloat16")
    dx, dg = torch.autograd.grad(y, (x, g), dy.bfloat16())
    assert dx.dtype == dg.dtype == torch.float32
    dx_ref, dg_ref, _ = ref.layer_norm_grad(dy.bfloat16().double().numpy(), x16, _f64(g), _f64(b), segments=2)
    assert rel_error(dx, dx_ref) < tolerance("bfloat16") and rel_error(dg, dg_ref) < tolerance("bfloat16")


@pytest.mark.parametrize("axis", [np.int64(-1), np.int32(2), np.int64(0)], ids=["np-last", "np-2", "np-first"])
def test_numpy_int_axis_at_rank_3(rng, axis):
    """A numpy integer axis (as numpy code computes it) works at any rank, as a Python int does."""
    x = torch.from_numpy(rng.standard_normal((5, 3, 8)).astype(np.float32))
    features = 5 if int(axis) == 0 else 8
    g, b = torch.randn(features), torch.randn(features)
    y = layer_norm(x, g, b, axis=axis)
    x2 = x.double().reshape(5, 24) if features == 5 else x.double().reshape(15, 8)
    want = ref.layer_norm(x2.numpy(), g.double().numpy(), b.double().numpy(), axis=0 if features == 5 else 1)
    assert rel_error(y.reshape(x2.shape), want) < tolerance("float32")


@pytest.mark.parametrize("axis", [0, -1])
def test_one_token_as_1d(rng, axis):
    """1-D activations (as TensorFlow's layer norm takes them): one token, either axis naming its features."""
    x, g, b, dy = _inputs(rng, "float32", 1, 1, 24)
    x1 = x.detach()[0].requires_grad_()
    y = layer_norm(x1, g, b, axis=axis, relu=True)
    y_ref = ref.layer_norm(_f64(x), _f64(g), _f64(b), relu=True)
    assert y.shape == (24,) and rel_error(y[None], y_ref) < tolerance("float32")
    dy = torch.from_numpy(ref.relu_safe(_f64(dy), y_ref)).float()
    dx, dg = torch.autograd.grad(y, (x1, g), dy[0])
    dx_ref, dg_ref, _ = ref.layer_norm_grad(_f64(dy), _f64(x), _f64(g), _f64(b), relu=True)
    assert rel_error(dx[None], dx_ref) < tolerance("float32") and rel_error(dg, dg_ref) < tolerance("float32")
    with pytest.raises(ValueError, match="axis must be in"):
        layer_norm(x1, g, b, axis=1)


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_constant_rows_whose_sum_rounds_give_the_bias(backend, monkeypatch):
    """3.3 x 100: the plain float32 mean is an ulp off; corrected, ``y = b`` exactly (as
    ``F.layer_norm``) even with epsilon 1e-12."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    x, g, b = torch.full((3, 100), 3.3), torch.full((100,), 2.0), torch.full((100,), 0.25)
    y = layer_norm(x, g, b, epsilon=1e-12)
    assert torch.equal(y, torch.full((3, 100), 0.25))
    assert torch.equal(y, torch.nn.functional.layer_norm(x, (100,), g, b, eps=1e-12))


def _bad_cases():
    x, g = torch.randn(4, 12), torch.randn(12)
    return {
        "g-shape": (dict(g=torch.randn(10)), ValueError, r"g must have 12 elements"),
        "b-shape": (dict(b=torch.randn(3, 5)), ValueError, r"b must have 12 elements"),
        "segments-divide": (dict(segments=5), ValueError, r"segments must divide the 12 features"),
        "segments-zero": (dict(segments=0), ValueError, r"segments must be a positive int"),
        "segments-float": (dict(segments=2.0), TypeError, r"segments must be a positive int"),
        "x-3d-axis-1": (dict(x=torch.randn(2, 4, 12)), ValueError, r"g must have 4 elements"),
        "x-3d-axis-3": (dict(x=torch.randn(2, 12, 4), axis=3), ValueError, r"axis must be in \[-3, 2\]"),
        "x-4d-segments": (dict(x=torch.randn(2, 5, 12, 4), axis=2, segments=5), ValueError,
                          r"segments must divide the 12 features of x \(axis 2\)"),
        "x-3d-axis-str": (dict(x=torch.randn(2, 4, 12), axis="-1"), TypeError, r"axis must be an int"),
        "x-3d-axis-bool": (dict(x=torch.randn(2, 4, 12), axis=True), TypeError, r"axis must be an int"),
        "x-0d": (dict(x=torch.tensor(1.5)), ValueError, r"x must have a feature axis"),
        "x-int": (dict(x=torch.ones(4, 12, dtype=torch.int32)), TypeError, r"x must be float16"),
        "x-numpy": (dict(x=np.ones((4, 12))), TypeError, r"x must be a torch.Tensor"),
        "g-dtype": (dict(g=torch.ones(12, dtype=torch.int32)), TypeError, r"g must be float16, bfloat16"),
        "b-dtype": (dict(x=x.bfloat16(), b=torch.ones(12, dtype=torch.bool)), TypeError, r"b must be float16"),
        "g-list": (dict(g=[1.0] * 12), TypeError, r"g must be a torch.Tensor or None"),
        "axis-2": (dict(axis=2), ValueError, r"axis must be in \[-2, 1\] for 2-D x"),
        "axis-str": (dict(axis="1"), TypeError, r"axis must be an int"),
        "epsilon-negative": (dict(epsilon=-1.0), ValueError, r"epsilon must be > 0"),
        "epsilon-zero": (dict(epsilon=0), ValueError, r"epsilon must be > 0"),
        "epsilon-nan": (dict(epsilon=float("nan")), ValueError, r"epsilon must be finite"),
        "relu-int": (dict(relu=1), TypeError, r"relu must be a bool"),
        "no-features": (dict(x=torch.randn(4, 0), g=None, b=None), ValueError, r"at least one feature"),
        "no-features-3d-last": (dict(x=torch.randn(2, 3, 0), g=None, b=None, axis=-1), ValueError,
                                r"at least one feature"),
        "no-features-3d-first": (dict(x=torch.randn(0, 3, 2), g=None, b=None, axis=0), ValueError,
                                 r"at least one feature"),
        "feature-axis-mismatch": (dict(axis=0), ValueError, r"g must have 4 elements"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_input(case):
    kwargs, error, match = _bad_cases()[case]
    args = dict(x=torch.randn(4, 12), g=torch.randn(12), b=torch.randn(12)) | kwargs
    with pytest.raises(error, match=match):
        layer_norm(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("axis, n, c, segments", [(1, 4096, 1024, 1), (1, 333, 8192, 1), (1, 64, 40000, 1),
                                                  (1, 1000, 3072, 4), (0, 1000, 1024, 1), (0, 4099, 8192, 2)],
                         ids=["NC-4096x1024", "NC-333x8192", "NC-chunked-64x40000", "NC-s4",
                              "CN-1000x1024", "CN-s2-4099x8192"])
def test_gpu(rng, dtype, axis, n, c, segments):
    """The kernels on a GPU at realistic sizes (one-chunk and chunked tiles) against float64."""
    x, g, b, dy = _inputs(rng, dtype, axis, n, c)
    x, g, b, dy = (t.detach().cuda().requires_grad_(t.requires_grad) for t in (x, g, b, dy))
    y = layer_norm(x, g, b, axis=axis, relu=True, segments=segments)
    kw = dict(axis=axis, epsilon=1e-6, relu=True, segments=segments, xp=torch)
    x64, g64, b64 = (t.detach().double() for t in (x, g, b))
    y_ref = ref.layer_norm(x64, g64, b64, **kw)
    dy = ref.relu_safe(dy.double(), y_ref).to(dy.dtype)
    assert rel_error(y, y_ref) < tolerance(dtype)
    grads = torch.autograd.grad(y, (x, g, b), dy)
    for got, want in zip(grads, ref.layer_norm_grad(dy.double(), x64, g64, b64, **kw)):
        assert rel_error(got, want) < tolerance(dtype)
    again = torch.autograd.grad(layer_norm(x, g, b, axis=axis, relu=True, segments=segments), (x, g, b), dy)
    assert all(torch.equal(a, b) for a, b in zip(grads, again))  # deterministic


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_eager_calls_skip_the_dispatcher(rng, monkeypatch, backend):
    """A call that needs a gradient is one autograd node of the eager twin (not the custom op's);
    one that does not, none."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    x, g, b, _ = _inputs(rng, "float32", 1, 6, 96)
    assert type(layer_norm(x, g, b).grad_fn).__name__ == "LayerNormFunctionBackward"
    with torch.no_grad():
        assert layer_norm(x, g, b).grad_fn is None
    assert layer_norm(x.detach(), None, None).grad_fn is None


def test_twice_differentiable(rng):
    x = torch.from_numpy(rng.standard_normal((4, 12))).requires_grad_()
    g, b = (torch.from_numpy(rng.standard_normal(12)).requires_grad_() for _ in range(2))
    fn = lambda *t: layer_norm(*t, segments=2, relu=True)  # noqa: E731
    torch.autograd.gradcheck(fn, (x, g, b), check_undefined_grad=True)  # an undefined output gradient too
    torch.autograd.gradgradcheck(fn, (x, g, b))


@pytest.mark.filterwarnings("ignore")  # torch.jit.trace's deprecation and tracer warnings
def test_jit_trace_records_the_custom_op(rng):
    x, g, b, _ = _inputs(rng, "float32", 1, 6, 96)
    traced = torch.jit.trace(lambda x, g, b: layer_norm(x, g, b), (x.detach(), g.detach(), b.detach()))
    assert "blocksparse::layer_norm" in str(traced.graph)
    torch.testing.assert_close(traced(x.detach(), g.detach(), b.detach()), layer_norm(x, g, b).detach())


@pytest.mark.gpu
@pytest.mark.parametrize("axis, n, c", [(1, 64, 1024), (1, 16, 40000), (0, 1000, 1024), (0, 64, 8192)],
                         ids=["NC", "NC-chunked", "CN", "CN-long"])
def test_gpu_fused_relu_keeps_nan(axis, n, c):
    """A NaN in a token's features makes its whole row NaN with the fused relu too (the GPU's max
    instruction returns the other operand of a NaN unless told to propagate it), as on the CPU."""
    x = torch.randn(n, c, device="cuda")
    x[3, 5] = float("nan")
    x[7, 0] = 3.3  # a finite row beside it
    g, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    y = layer_norm(x if axis == 1 else x.t().contiguous(), g, b, axis=axis, relu=True)
    y = y if axis == 1 else y.t()
    assert torch.isnan(y[3]).all() and torch.isfinite(y[torch.arange(n, device="cuda") != 3]).all()
