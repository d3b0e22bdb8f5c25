"""The native layer norm on a CUDA GPU (``csrc/norms.cpp`` over the kernel library's entry point):
one C++ autograd node against float64 and against the eager twin (the same kernels through the
launchers), parameters of another dtype, a backward that builds a graph, and the calls it leaves to
Python.  Skipped without a GPU."""
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.torch import _native, layer_norm  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@pytest.fixture
def native(aot):
    if not _native.available():
        pytest.skip(f"the native op cannot be built here: {_native._state.get('why')}")


def _inputs(rng, dtype, param_dtype, axis, n, c):
    x, g, b, dy = ref.draw_layer_norm(rng, n, c, axis)
    x, dy = (torch.from_numpy(a).to("cuda", DTYPES[dtype]) for a in (x, dy))
    g, b = (torch.from_numpy(a).to("cuda", DTYPES[param_dtype or dtype]).requires_grad_() for a in (g, b))
    return x.requires_grad_(), g, b, dy


def _node(y):
    return type(y.grad_fn).__name__


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("axis, n, c, segments, relu, param_dtype", [
    (1, 4096, 1024, 1, False, "float32"), (1, 333, 4096, 2, True, None), (1, 64, 40000, 1, True, "float32"),
    (0, 4099, 2048, 1, True, "float32"), (0, 1024, 1024, 4, False, None)])
def test_one_cpp_node_against_float64_and_the_twin(native, rng, monkeypatch, dtype, axis, n, c, segments, relu,
                                                   param_dtype):
    x, g, b, dy = _inputs(rng, dtype, param_dtype, axis, n, c)
    kw = dict(axis=axis, relu=relu, segments=segments)
    y = layer_norm(x, g, b, **kw)
    assert _node(y) == "CppFunction"
    x64, g64, b64 = (t.detach().double() for t in (x, g, b))
    ref_kw = dict(kw, epsilon=1e-6, xp=torch)
    y64 = ref.layer_norm(x64, g64, b64, **ref_kw)
    if relu:
        dy = ref.relu_safe(dy.double(), y64).to(dy.dtype)
    tol = tolerance(dtype)
    assert rel_error(y, y64) < tol
    grads = torch.autograd.grad(y, (x, g, b), dy)
    assert grads[1].dtype == g.dtype and grads[2].dtype == b.dtype
    for name, got, want in zip("xgb", grads, ref.layer_norm_grad(dy.double(), x64, g64, b64, **ref_kw)):
        assert rel_error(got, want) < tol, f"d{name}"
    monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", "off")  # the eager twin: the same kernels, by Python
    y_twin = layer_norm(x, g, b, **kw)
    assert _node(y_twin) == "LayerNormFunctionBackward"
    assert rel_error(y, y_twin.double()) < tol / 10
    for name, got, twin in zip("xgb", grads, torch.autograd.grad(y_twin, (x, g, b), dy)):
        assert rel_error(got, twin.double()) < tol / 10, f"d{name}"


def test_a_backward_building_a_graph_runs_the_reference_formulas(native, rng, monkeypatch):
    x, g, b, dy = _inputs(rng, "float32", None, 0, 256, 512)
    y = layer_norm(x, g, b, axis=0, segments=2)
    assert _node(y) == "CppFunction"
    (dx,) = torch.autograd.grad(y, (x,), dy, create_graph=True)
    w = torch.randn_like(dx)
    second = torch.autograd.grad((dx * w).sum(), (x, g))
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    y_ref = layer_norm(x, g, b, axis=0, segments=2)
    (dx_ref,) = torch.autograd.grad(y_ref, (x,), dy, create_graph=True)
    assert rel_error(dx, dx_ref.double()) < 1e-5
    for got, want in zip(second, torch.autograd.grad((dx_ref * w).sum(), (x, g))):
        assert rel_error(got, want.double()) < 1e-4


def test_calls_left_to_python(native, rng):
    x, g, b, _ = _inputs(rng, "bfloat16", "float32", 1, 64, 1024)
    assert _node(layer_norm(x.t().contiguous().t(), g, b)) == "LayerNormFunctionBackward"  # strided x
    assert _node(layer_norm(x, g, b, axis=-1)) == "CppFunction"  # axis counted from the end
    with torch.autocast("cuda", dtype=torch.float16):
        y = layer_norm(x, g, b)  # Python casts x to float16, then the twin runs
    assert y.dtype == torch.float16 and _node(y) == "LayerNormFunctionBackward"
    with torch.no_grad():
        assert layer_norm(x, g, b).grad_fn is None


def _gates_inputs(rng, dtype, n, k, packing, bias_dtype):
    c, h, bias, dc, dh = (torch.from_numpy(a) for a in ref.draw_lstm_gates(rng, n, k))
    c, h, dc, dh = (t.to("cuda", DTYPES[dtype]) for t in (c, h, dc, dh))
    gates = (h,) if packing == "merged" else tuple(t.contiguous() for t in h.split(k, 1))
    bias = None if bias_dtype is None else bias.to("cuda", DTYPES[bias_dtype]).requires_grad_()
    return c.requires_grad_(), tuple(t.requires_grad_() for t in gates), bias, dc, dh


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n, k, packing, bias_dtype", [(4096, 1024, "merged", "float32"), (333, 256, "four", None),
                                                       (64, 2048, "merged", None), (1000, 512, "four", "bfloat16")])
def test_gates_one_cpp_node_against_float64_and_the_twin(native, rng, monkeypatch, dtype, n, k, packing,
                                                         bias_dtype):
    from blocksparse.torch import fused_lstm_gates

    c, gates, bias, dc, dh = _gates_inputs(rng, dtype, n, k, packing, bias_dtype)
    out = fused_lstm_gates(c, *gates, bias=bias, forget_bias=1.0)
    assert _node(out[0]) == "CppFunction"
    leaves = (c, *gates) + (() if bias is None else (bias,))
    f64 = [t.detach().double() for t in leaves]
    merged = f64[1] if packing == "merged" else torch.cat(f64[1:5], 1)
    b64 = None if bias is None else f64[-1]
    tol = tolerance(dtype)
    for got, want in zip(out, ref.lstm_gates(f64[0], merged, bias=b64, forget_bias=1.0, xp=torch)):
        assert rel_error(got, want) < tol
    grads = torch.autograd.grad(out, leaves, (dc, dh))
    dc64, dgates64, *db64 = ref.lstm_gates_grad(dc.double(), dh.double(), f64[0], merged, bias=b64, forget_bias=1.0,
                                                xp=torch)
    dgates = grads[1] if packing == "merged" else torch.cat(grads[1:5], 1)
    assert rel_error(grads[0], dc64) < tol and rel_error(dgates, dgates64) < tol
    if bias is not None:
        # dbias is rounded to the bias's dtype
        assert grads[-1].dtype == bias.dtype and rel_error(grads[-1], db64[0]) < max(tol, tolerance(bias_dtype))
    monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", "off")
    twin = fused_lstm_gates(c, *gates, bias=bias, forget_bias=1.0)
    assert _node(twin[0]) != "CppFunction"
    for got, want in zip(out + grads, twin + torch.autograd.grad(twin, leaves, (dc, dh))):
        assert rel_error(got, want.double()) < tol / 10


def test_captured_in_a_cuda_graph(native, rng):
    """The nodes' launches, allocations and the library's spec choices are capturable: a training
    step's forward and backward replayed from a CUDA graph give the eager step's values."""
    from blocksparse.torch import fused_lstm_gates

    x, g, b, dy = _inputs(rng, "bfloat16", None, 1, 512, 1024)
    c, gates, bias, dc, dh = _gates_inputs(rng, "bfloat16", 512, 256, "merged", "float32")
    static = [t.detach().clone() for t in (x, c, gates[0])]
    leaves = [t.requires_grad_() for t in static] + [g, b, bias]

    def step():
        y = layer_norm(leaves[0], g, b, relu=True)
        c_next, h_next = fused_lstm_gates(leaves[1], leaves[2], bias=bias)
        return torch.autograd.grad((y, c_next, h_next), leaves, (dy, dc, dh))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm up: the library's choices, the entries
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step()
    with torch.no_grad():
        for t in static:  # new inputs for the replay
            t.copy_(torch.randn_like(t) * 2)
    graph.replay()
    want = step()  # eager, on the same new inputs
    torch.cuda.synchronize()
    for a, w in zip(got, want):
        assert torch.equal(a, w)


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)], ids=["none", "g", "b"])
def test_an_absent_gain_or_bias(native, rng, affine):
    x, g, b, dy = _inputs(rng, "bfloat16", "float32", 1, 1000, 1024)
    g, b = (p if keep else None for p, keep in zip((g, b), affine))
    y = layer_norm(x, g, b)
    assert _node(y) == "CppFunction"
    f64 = [None if t is None else t.detach().double() for t in (x, g, b)]
    kw = dict(axis=1, epsilon=1e-6, xp=torch)
    assert rel_error(y, ref.layer_norm(*f64, **kw)) < tolerance("bfloat16")
    leaves = [t for t in (x, g, b) if t is not None]
    want = [w for w in ref.layer_norm_grad(dy.double(), *f64, **kw) if w is not None]
    for got, expected in zip(torch.autograd.grad(y, leaves, dy), want):
        assert rel_error(got, expected) < tolerance("bfloat16")
