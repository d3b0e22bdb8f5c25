"""The native layer norm (``blocksparse/torch/csrc/norms.cpp``) on the CPU, with a stand-in for the
kernel library's layer-norm entry points (``stand_in.FAKE_NORMS``: the float32 formulas, compiled
against ``src/ops/norms.h``, so every field of the call the op fills is the one the library reads).
Checks the op's plumbing -- the call's fields, allocation, the workspace, parameters cast to float32
and gradients cast back, ``needs_input_grad``, strided output gradients, the reference formulas of
a backward that builds a graph, the calls it leaves to Python, errors -- against float64.  The
kernels behind the real entry points are checked on the GPU (``test/pytorch/norms/``)."""
import ctypes

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.ops.norms.capi import LayerNormCall  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch import _native  # noqa: E402
from blocksparse.torch._norms import ops as norms_ops  # noqa: E402

EPS = 1e-5


def _op(x, g, b, entry, axis=1, relu=False, segments=1, epsilon=EPS):
    return torch.ops.blocksparse_native.layer_norm(x, g, b, axis, epsilon, relu, segments, entry)


def _runs(lib):
    return tuple((ctypes.c_int * 2).in_dll(lib, "ln_runs"))


def _inputs(rng, n, c, axis, param_dtype=torch.float32):
    x, g, b, dy = ref.draw_layer_norm(rng, n, c, axis, offset=3.0)
    return (torch.from_numpy(x).float().requires_grad_(), torch.from_numpy(g).to(param_dtype).requires_grad_(),
            torch.from_numpy(b).to(param_dtype).requires_grad_(), torch.from_numpy(dy).float())


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("segments,relu", [(1, False), (2, True), (4, False)])
@pytest.mark.parametrize("param_dtype", [torch.float32, torch.float64])
def test_values_and_gradients_match_float64(native_norms, rng, axis, segments, relu, param_dtype):
    lib, entry = native_norms
    x, g, b, dy = _inputs(rng, 6, 32, axis, param_dtype)
    before = _runs(lib)
    y = _op(x, g, b, entry, axis, relu, segments)
    assert type(y.grad_fn).__name__ == "CppFunction"  # one C++ autograd node
    y64 = ref.layer_norm(x.detach().double().numpy(), g.detach().double().numpy(), b.detach().double().numpy(), axis,
                         segments, EPS, relu)
    np.testing.assert_allclose(y.detach().numpy(), y64, rtol=1e-5, atol=1e-5)
    dy = torch.from_numpy(ref.relu_safe(dy.numpy(), y64)).float() if relu else dy
    dx, dg, db = torch.autograd.grad(y, (x, g, b), dy)
    assert _runs(lib) == (before[0] + 1, before[1] + 1)
    assert dg.dtype == db.dtype == param_dtype  # the float32 sums cast back to the parameters' dtype
    want = ref.layer_norm_grad(dy.double().numpy(), x.detach().double().numpy(), g.detach().double().numpy(),
                               b.detach().double().numpy(), axis, segments, EPS, relu)
    for got, expected in zip((dx, dg, db), want):
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-4, atol=1e-4)
    assert ctypes.c_size_t.in_dll(lib, "ln_workspace_bytes").value == 2 * 8 * 32


def test_call_fields_reach_the_library(native_norms, rng):
    lib, entry = native_norms
    x, g, b, _ = _inputs(rng, 5, 48, 0)
    _op(x.detach(), g.detach(), b.detach(), entry, axis=0, relu=True, segments=3, epsilon=0.25)

    call = LayerNormCall.in_dll(lib, "ln_last")
    assert (call.dtype, call.axis, call.relu, call.segments, call.n_tokens, call.features, call.epsilon) == (
        2, 0, 1, 3, 5, 48, 0.25)
    assert call.x == x.data_ptr() and call.params == 0  # float32 x: float32 parameters
    assert ctypes.c_uint64.in_dll(lib, "device_address").value == x.data_ptr()  # the context of x's GPU


def test_only_the_gradients_asked_for_and_a_strided_output_gradient(native_norms, rng):
    _, entry = native_norms
    x, g, b, dy = _inputs(rng, 8, 16, 1)
    g.requires_grad_(False)
    y = _op(x, g, b, entry)
    strided = dy.t().contiguous().t()  # the same values, column-major
    assert not strided.is_contiguous()
    y.backward(strided)
    assert g.grad is None and x.grad is not None and b.grad is not None
    want = ref.layer_norm_grad(dy.double().numpy(), x.detach().double().numpy(), g.double().numpy(),
                               b.detach().double().numpy(), 1, 1, EPS)
    np.testing.assert_allclose(x.grad.double().numpy(), want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b.grad.double().numpy(), want[2], rtol=1e-4, atol=1e-4)


def test_a_backward_building_a_graph_runs_the_reference_formulas(native_norms, rng):
    _, entry = native_norms
    x, g, b, dy = _inputs(rng, 4, 16, 0)
    runs = _runs(native_norms[0])
    y = _op(x, g, b, entry, axis=0, segments=2)
    (dx,) = torch.autograd.grad(y, (x,), dy, create_graph=True)
    assert _runs(native_norms[0])[1] == runs[1]  # no kernel: ATen formulas autograd differentiates
    w = torch.randn_like(dx)
    second = torch.autograd.grad((dx * w).sum(), (x, g))
    x64, g64, b64 = (t.detach().double().requires_grad_() for t in (x, g, b))
    xs = x64.t().reshape(-1, 2, 8)
    xc = xs - xs.mean(-1, keepdim=True)
    y64 = (xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + EPS) * g64.reshape(2, 8) + b64.reshape(2, 8))
    (dx64,) = torch.autograd.grad(y64.reshape(-1, 16).t(), (x64,), dy.double(), create_graph=True)
    want = torch.autograd.grad((dx64 * w.double()).sum(), (x64, g64))
    torch.testing.assert_close(dx.double(), dx64, rtol=1e-4, atol=1e-4)
    for got, expected in zip(second, want):
        torch.testing.assert_close(got.double(), expected, rtol=1e-3, atol=1e-3)


def test_calls_the_library_does_not_serve_are_left_to_python(native_norms, rng):
    lib, entry = native_norms
    x, g, b, _ = _inputs(rng, 4, 32, 1)
    assert _op(x, g, b, entry) is not None
    lib_refuse = ctypes.c_int.in_dll(lib, "refuse_features")
    lib_refuse.value = 32
    try:
        assert _op(x, g, b, entry) is None  # no spec
    finally:
        lib_refuse.value = -1
    cases = {
        "strided x": (x.t(), g, b, 0),
        "misaligned x": (torch.randn(129)[1:].view(4, 32), g, b, 1),
        "float64 x": (x.double(), g, b, 1),
        "3-D x": (x.reshape(2, 2, 32), g, b, 1),
        "g of another size": (x, g[:16], b, 1),
        "no b": (x, g, torch.empty(0), 1),
        "axis 2": (x, g, b, 2),
        "axis -3": (x, g, b, -3),
    }
    for name, (xx, gg, bb, axis) in cases.items():
        assert _op(xx, gg, bb, entry, axis=axis) is None, name
    assert _op(x, g, b, entry, segments=3) is None  # 32 features in 3 segments
    assert _op(x, g, b, entry, epsilon=0.0) is None
    assert _op(x, g, b, entry, epsilon=float("inf")) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _op(x, g, b, entry) is None  # Python casts x first


def test_a_failed_launch_names_the_direction_and_the_library_message(native_norms):
    _, entry = native_norms
    x = torch.randn(4, 32, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="layer_norm forward failed: the stand-in takes float32 only"):
        _op(x, torch.ones(32), torch.zeros(32), entry)


def test_the_python_guard_leaves_cpu_tensors_and_other_argument_types_alone():
    x, g, b = torch.randn(4, 32), torch.ones(32), torch.zeros(32)
    assert norms_ops.native_layer_norm(x, g, b, 1, 1e-6, False, 1) is None  # a CPU tensor
    for args in ((1.0, 1e-6, False, 1), (1, 1, False, 1), (1, 1e-6, 0, 1), (1, 1e-6, False, 1.0)):
        assert norms_ops.native_layer_norm(x, g, b, *args) is None
    assert norms_ops.native_layer_norm(x, None, b, 1, 1e-6, False, 1) is None


def test_an_entry_is_registered_once_per_library(native):
    class Library:
        names = {"bsk_layer_norm_run": 16, "bsk_layer_norm_workspace": 32, "bsk_layer_norm_select": 48,
                 "bsk_device_at": 64}

        def address(self, name):
            if name not in self.names:
                raise AttributeError(name)  # as ctypes says of a missing symbol
            return self.names[name]

    kernels = Library()
    first = _native.entry(kernels, "layer_norm")
    assert isinstance(first, int) and _native.entry(kernels, "layer_norm") == first
    older = Library()
    older.names = {k: v for k, v in Library.names.items() if k != "bsk_device_at"}
    assert _native.entry(older, "layer_norm") is None  # a library without the entry points: Python serves


def test_no_tokens(native_norms):
    lib, entry = native_norms
    runs = _runs(lib)
    x, g, b = torch.empty(0, 32, requires_grad=True), torch.ones(32, requires_grad=True), torch.randn(32)
    y = _op(x, g, b, entry)
    assert y.shape == (0, 32)
    dx, dg = torch.autograd.grad(y, (x, g), torch.empty(0, 32))
    assert dx.shape == (0, 32) and torch.equal(dg, torch.zeros(32)) and _runs(lib) == runs


def test_without_gradients_no_node(native_norms, rng):
    lib, entry = native_norms
    x, g, b, _ = _inputs(rng, 4, 32, 1)
    want = ref.layer_norm(*(t.detach().double().numpy() for t in (x, g, b)), 1, 1, EPS)
    runs = _runs(lib)
    with torch.no_grad():
        y = _op(x, g, b, entry)
    y_plain = _op(*(t.detach() for t in (x, g, b)), entry)  # nothing needs a gradient
    assert y.grad_fn is None and y_plain.grad_fn is None and _runs(lib)[0] == runs[0] + 2
    for got in (y, y_plain):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)], ids=["none", "g", "b"])
def test_an_absent_gain_or_bias(native_norms, rng, affine):
    """Ones / zeros stand in for them: the values and gradients of the formulas without them."""
    _, entry = native_norms
    x, g, b, dy = _inputs(rng, 6, 32, 0)
    g, b = (p if keep else None for p, keep in zip((g, b), affine))
    y = _op(x, g, b, entry, axis=0, relu=True, segments=2)
    assert type(y.grad_fn).__name__ == "CppFunction"
    f64 = [None if t is None else t.detach().double().numpy() for t in (x, g, b)]
    y64 = ref.layer_norm(*f64, 0, 2, EPS, True)
    np.testing.assert_allclose(y.detach().numpy(), y64, rtol=1e-5, atol=1e-5)
    dy = torch.from_numpy(ref.relu_safe(dy.numpy(), y64)).float()
    leaves = [t for t in (x, g, b) if t is not None]
    grads = torch.autograd.grad(y, leaves, dy)
    want = [w for w in ref.layer_norm_grad(dy.double().numpy(), *f64, 0, 2, EPS, True) if w is not None]
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-4, atol=1e-4)
