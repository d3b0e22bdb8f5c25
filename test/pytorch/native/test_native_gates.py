"""The native fused LSTM gates (``blocksparse/torch/csrc/norms.cpp``) on the CPU, with a stand-in
for the kernel library's entry points (``stand_in.FAKE_GATES``: the float32 formulas, compiled
against ``src/ops/norms.h``).  Checks the op's plumbing -- both packings, the bias cast to float32
and its gradient back, gradients of one output only, strided output gradients, the reference
formulas of a backward that builds a graph, the calls it leaves to Python, errors -- against
float64.  The kernels behind the real entry points are checked on the GPU (``test/pytorch/lstm/``)."""
import ctypes

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.ops.norms.capi import LstmGatesCall  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch._lstm import ops as lstm_ops  # noqa: E402


def _op(c, gates, entry, bias=None, forget_bias=1.0):
    out = torch.ops.blocksparse_native.lstm_gates(c, *gates, *((None,) * (4 - len(gates))), bias, forget_bias, entry)
    return tuple(out) if out else None


def _runs(lib):
    return tuple((ctypes.c_int * 2).in_dll(lib, "gate_runs"))


def _inputs(rng, n, k, bias_dtype):
    c, h, bias, dc, dh = ref.draw_lstm_gates(rng, n, k)
    leaf = lambda a, dtype=torch.float32: torch.from_numpy(a).to(dtype).requires_grad_()  # noqa: E731
    return leaf(c), leaf(h), None if bias_dtype is None else leaf(bias, bias_dtype), *(
        torch.from_numpy(a).float() for a in (dc, dh))


def _f64(t):
    return None if t is None else t.detach().double().numpy()


@pytest.mark.parametrize("packing", ["merged", "four"])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.float64])
def test_values_and_gradients_match_float64(native_gates, rng, packing, bias_dtype):
    lib, entry = native_gates
    c, h, bias, dc, dh = _inputs(rng, 6, 16, bias_dtype)
    gates = (h,) if packing == "merged" else tuple(t.detach().clone().requires_grad_() for t in h.split(16, 1))
    before = _runs(lib)
    c_next, h_next = _op(c, gates, entry, bias, 0.5)
    assert type(c_next.grad_fn).__name__ == "CppFunction"
    merged = _f64(h) if packing == "merged" else np.concatenate([_f64(t) for t in gates], 1)
    want = ref.lstm_gates(_f64(c), merged, bias=_f64(bias), forget_bias=0.5)
    for got, expected in zip((c_next, h_next), want):
        np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-5, atol=1e-5)
    leaves = (c, *gates) + (() if bias is None else (bias,))
    grads = torch.autograd.grad((c_next, h_next), leaves, (dc, dh))
    assert _runs(lib) == (before[0] + 1, before[1] + 1)
    dc64, dh64, *rest = ref.lstm_gates_grad(dc.double().numpy(), dh.double().numpy(), _f64(c), merged,
                                            bias=_f64(bias), forget_bias=0.5)
    np.testing.assert_allclose(grads[0].numpy(), dc64, rtol=1e-4, atol=1e-4)
    dgates = grads[1] if packing == "merged" else torch.cat(grads[1:5], 1)
    np.testing.assert_allclose(dgates.numpy(), dh64, rtol=1e-4, atol=1e-4)
    if bias is not None:
        assert grads[-1].dtype == bias_dtype
        np.testing.assert_allclose(grads[-1].double().numpy(), rest[0], rtol=1e-4, atol=1e-4)


def test_the_call_fields_reach_the_library(native_gates, rng):
    lib, entry = native_gates
    c, h, bias, _, _ = _inputs(rng, 3, 32, torch.float64)
    assert _op(c.detach(), [t.contiguous() for t in h.detach().split(32, 1)], entry, bias.detach(), 0.25)

    call = LstmGatesCall.in_dll(lib, "gates_last")
    assert (call.dtype, call.merged, call.n_tokens, call.features, call.forget_bias) == (2, 0, 3, 32, 0.25)
    assert call.c == c.data_ptr() and call.bias != bias.data_ptr()  # a float32 copy of the float64 bias


def test_one_output_and_strided_gradients(native_gates, rng):
    _, entry = native_gates
    c, h, bias, _, dh = _inputs(rng, 8, 16, torch.float32)
    c.requires_grad_(False)
    _, h_next = _op(c, (h,), entry, bias)
    strided = dh.t().contiguous().t()
    dgates, dbias = torch.autograd.grad(h_next, (h, bias), strided)  # c_next unused: its gradient zero
    _, dh64, db64 = ref.lstm_gates_grad(np.zeros((8, 16)), dh.double().numpy(), _f64(c), _f64(h), bias=_f64(bias))
    np.testing.assert_allclose(dgates.numpy(), dh64, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dbias.numpy(), db64, rtol=1e-4, atol=1e-4)


def test_a_backward_building_a_graph_runs_the_reference_formulas(native_gates, rng):
    lib, entry = native_gates
    c, h, bias, dc, dh = _inputs(rng, 4, 16, torch.float32)
    runs = _runs(lib)
    c_next, h_next = _op(c, (h,), entry, bias)
    dgates, = torch.autograd.grad((c_next, h_next), (h,), (dc, dh), create_graph=True)
    assert _runs(lib)[1] == runs[1]
    w = torch.randn_like(dgates)
    second = torch.autograd.grad((dgates * w).sum(), (c, h, bias))
    c64, h64, b64 = (t.detach().double().requires_grad_() for t in (c, h, bias))
    i, j, f, o = (h64 + b64).split(16, 1)
    cn = torch.sigmoid(f + 1.0) * c64 + torch.sigmoid(i) * torch.tanh(j)
    hn = torch.sigmoid(o) * torch.tanh(cn)
    dgates64, = torch.autograd.grad((cn, hn), (h64,), (dc.double(), dh.double()), create_graph=True)
    torch.testing.assert_close(dgates.double(), dgates64, rtol=1e-4, atol=1e-4)
    for got, want in zip(second, torch.autograd.grad((dgates64 * w.double()).sum(), (c64, h64, b64))):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


def test_calls_the_library_does_not_serve_are_left_to_python(native_gates, rng):
    lib, entry = native_gates
    c, h, bias, _, _ = _inputs(rng, 4, 16, torch.float32)
    assert _op(c, (h,), entry) is not None
    refuse = ctypes.c_int.in_dll(lib, "refuse_gate_features")
    refuse.value = 16
    try:
        assert _op(c, (h,), entry) is None
    finally:
        refuse.value = -1
    cases = {
        "strided c": (c.t().contiguous().t(), (h,), None),
        "float64 gates": (c.double(), (h.double(),), None),
        "gates of c's width": (c, (h[:, :16].contiguous(),), None),
        "another dtype": (c, (h.half(),), None),
        "a bias of 2K": (c, (h,), bias[:32]),
        "three gates": (c, tuple(t.contiguous() for t in h.split(16, 1)[:3]) + (None,), None),
        "four strided gates": (c, h.split(16, 1), None),
    }
    for name, (cc, gates, bb) in cases.items():
        out = torch.ops.blocksparse_native.lstm_gates(cc, *gates, *((None,) * (4 - len(gates))), bb, 1.0, entry)
        assert not out, name
    assert _op(c, (h,), entry, forget_bias=float("nan")) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _op(c, (h,), entry) is None


def test_a_failed_launch_names_the_direction_and_the_library_message(native_gates):
    _, entry = native_gates
    with pytest.raises(RuntimeError, match="lstm_gates forward failed: the stand-in takes float32 only"):
        _op(torch.zeros(2, 16, dtype=torch.float16), (torch.zeros(2, 64, dtype=torch.float16),), entry)


def test_the_python_guard_leaves_cpu_tensors_and_other_argument_types_alone():
    c, h = torch.randn(4, 16), torch.randn(4, 64)
    assert lstm_ops.native_gates(c, (h,), None, 1.0) is None  # a CPU tensor
    assert lstm_ops.native_gates(c, (h,), None, 1) is None  # an int forget_bias
    assert lstm_ops.native_gates(c, (h, h), None, 1.0) is None


@pytest.mark.parametrize("packing", ["merged", "four"])
def test_without_gradients_no_node(native_gates, rng, packing):
    _, entry = native_gates
    c, h, bias, _, _ = _inputs(rng, 4, 16, torch.float32)
    gates = (h,) if packing == "merged" else tuple(t.contiguous() for t in h.split(16, 1))
    with torch.no_grad():
        c_next, h_next = _op(c, gates, entry, bias)
    assert c_next.grad_fn is None and h_next.grad_fn is None
    want = ref.lstm_gates(_f64(c), _f64(h), bias=_f64(bias))
    for got, expected in zip((c_next, h_next), want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
