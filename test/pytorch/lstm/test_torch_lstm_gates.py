"""blocksparse.torch.fused_lstm_gates: values and gradients against float64 on both paths, merged
and separate gates, bias; torch.compile, autocast, bad input."""
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch import fused_lstm_gates  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def _inputs(rng, dtype, n, k, bias=True):
    """Leaf tensors (c, h, bias or None) and the output gradients (dc_next, dh_next)."""
    c, h, b, dcn, dhn = (torch.from_numpy(a).to(DTYPES[dtype]) for a in ref.draw_lstm_gates(rng, n, k))
    return c.requires_grad_(), h.requires_grad_(), b.requires_grad_() if bias else None, dcn, dhn


def _f64(t):
    return None if t is None else t.detach().double().numpy()


def _check(c, h, bias, dcn, dhn, tol, merged=True, forget_bias=1.0):
    """Values and gradients (c, merged gates, bias) against the float64 formulas."""
    gates = (h,) if merged else [t.detach().clone().requires_grad_() for t in h.split(c.shape[1], 1)]
    c_next, h_next = fused_lstm_gates(c, *gates, bias=bias, forget_bias=forget_bias)
    want = ref.lstm_gates(_f64(c), _f64(h), bias=_f64(bias), forget_bias=forget_bias)
    for got, exp in zip((c_next, h_next), want):
        assert got.dtype == c.dtype and got.shape == c.shape
        assert rel_error(got, exp) < tol
    leaves = [c, *gates] + ([bias] if bias is not None else [])
    grads = torch.autograd.grad((c_next, h_next), leaves, (dcn, dhn))
    dc, dh = grads[0], torch.cat(grads[1:1 + len(gates)], 1)
    dc_ref, dh_ref, db_ref = ref.lstm_gates_grad(_f64(dcn), _f64(dhn), _f64(c), _f64(h), bias=_f64(bias),
                                                forget_bias=forget_bias)
    assert rel_error(dc, dc_ref) < tol and rel_error(dh, dh_ref) < tol
    assert all(g.dtype == leaf.dtype and g.shape == leaf.shape for g, leaf in zip(grads, leaves))
    if bias is not None:
        assert rel_error(grads[-1], db_ref) < max(tol, tolerance(bias.dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, k", [(7, 24), (1, 100)], ids=["n7-k24", "n1-k100"])
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_reference_path(rng, monkeypatch, dtype, n, k, merged, bias):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    _check(*_inputs(rng, dtype, n, k, bias), tolerance(dtype), merged=merged, forget_bias=0.5)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype, n, k, merged, bias", [
    ("float32", 7, 24, True, True), ("bfloat16", 5, 40, False, True), ("float16", 3, 16, True, False)],
    ids=["fp32-merged-bias", "bf16-four-bias", "fp16-merged"])
def test_triton_path(rng, monkeypatch, dtype, n, k, merged, bias):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    _check(*_inputs(rng, dtype, n, k, bias), tolerance(dtype), merged=merged)


def test_only_h_next_used(rng):
    """A loss on h_next alone: c_next's gradient arrives as zeros, the answer is unchanged."""
    c, h, b, dcn, dhn = _inputs(rng, "float32", 4, 8)
    _, h_next = fused_lstm_gates(c, h, bias=b)
    dc, dh = torch.autograd.grad(h_next, (c, h), dhn)
    dc_ref, dh_ref, _ = ref.lstm_gates_grad(0 * _f64(dcn), _f64(dhn), _f64(c), _f64(h), bias=_f64(b))
    assert rel_error(dc, dc_ref) < 1e-5 and rel_error(dh, dh_ref) < 1e-5


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("bias_dtype", ["float32", "float64"])
def test_bias_of_another_float_dtype(rng, monkeypatch, backend, bias_dtype):
    """The bias may have any float dtype (dbias comes in it)."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    c, h, b, dcn, dhn = _inputs(rng, "bfloat16", 5, 16)
    _check(c, h, b.detach().to(DTYPES[bias_dtype]).requires_grad_(), dcn, dhn, tolerance("bfloat16"))


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_strided_bias(rng, monkeypatch, backend):
    """A bias that is a strided view (every other element of a longer tensor) is read as the values
    it shows."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    c, h, _, dcn, dhn = _inputs(rng, "float32", 5, 16)
    wide = torch.from_numpy(rng.standard_normal(128)).float().requires_grad_()
    _check(c, h, wide[::2], dcn, dhn, 1e-5)


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
def test_one_token_as_1d(rng, merged):
    """A 1-D state (K,) with (4K,) / (K,) gates, as TensorFlow's takes them: one token."""
    c, h, bias, dcn, dhn = _inputs(rng, "float32", 1, 8, True)
    c1, h1 = (t.detach()[0].requires_grad_() for t in (c, h))
    gates = (h1,) if merged else [t.detach().clone().requires_grad_() for t in h1.split(8)]
    c_next, h_next = fused_lstm_gates(c1, *gates, bias=bias)
    assert c_next.shape == h_next.shape == (8,)
    want = ref.lstm_gates(_f64(c), _f64(h), bias=_f64(bias))
    assert rel_error(c_next[None], want[0]) < 1e-5 and rel_error(h_next[None], want[1]) < 1e-5
    grads = torch.autograd.grad((c_next, h_next), [c1, *gates], (dcn[0], dhn[0]))
    dc_ref, dh_ref, _ = ref.lstm_gates_grad(_f64(dcn), _f64(dhn), _f64(c), _f64(h), bias=_f64(bias))
    assert grads[0].shape == (8,) and rel_error(grads[0][None], dc_ref) < 1e-5
    assert rel_error(torch.cat(grads[1:])[None], dh_ref) < 1e-5
    with pytest.raises(ValueError, match="h must have shape"):
        fused_lstm_gates(c1, torch.randn(31))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
def test_more_token_axes(rng, merged):
    """(B, T, K) state and (B, T, 4K) gates, as TensorFlow's takes them: the 2-D call on the tokens
    flattened, against the float64 formulas."""
    c, h, bias, dcn, dhn = _inputs(rng, "float32", 12, 8, True)
    c3, h3 = (t.detach().reshape(3, 4, -1).requires_grad_() for t in (c, h))
    gates = (h3,) if merged else [t.detach().clone().requires_grad_() for t in h3.split(8, -1)]
    c_next, h_next = fused_lstm_gates(c3, *gates, bias=bias)
    assert c_next.shape == h_next.shape == (3, 4, 8)
    want = ref.lstm_gates(_f64(c), _f64(h), bias=_f64(bias))
    assert rel_error(c_next.reshape(12, 8), want[0]) < 1e-5 and rel_error(h_next.reshape(12, 8), want[1]) < 1e-5
    grads = torch.autograd.grad((c_next, h_next), [c3, *gates], (dcn.reshape(3, 4, 8), dhn.reshape(3, 4, 8)))
    dc_ref, dh_ref, _ = ref.lstm_gates_grad(_f64(dcn), _f64(dhn), _f64(c), _f64(h), bias=_f64(bias))
    assert rel_error(grads[0].reshape(12, 8), dc_ref) < 1e-5
    assert rel_error(torch.cat(grads[1:], -1).reshape(12, 32), dh_ref) < 1e-5


def test_empty_batch():
    c, h = torch.zeros(0, 8, requires_grad=True), torch.zeros(0, 32, requires_grad=True)
    bias = torch.ones(32, requires_grad=True)
    c_next, h_next = fused_lstm_gates(c, h, bias=bias)
    assert c_next.shape == h_next.shape == (0, 8)
    (db,) = torch.autograd.grad(h_next.sum(), (bias,))
    assert torch.equal(db, torch.zeros(32))


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
def test_torch_compile_fullgraph(rng, monkeypatch, backend, merged):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    c, h, b, dcn, dhn = _inputs(rng, "float32", 6, 16)

    def step(c, h, b):
        gates = (h,) if merged else h.split(16, 1)
        c_next, h_next = fused_lstm_gates(c, *gates, bias=b, forget_bias=1.0)
        return c_next, h_next * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    outs = compiled(c, h, b)
    eager = step(c, h, b)
    for got, want in zip(outs, eager):
        torch.testing.assert_close(got, want)
    for got, want in zip(torch.autograd.grad(outs, (c, h, b), (dcn, dhn)),
                         torch.autograd.grad(eager, (c, h, b), (dcn, dhn))):
        torch.testing.assert_close(got, want)


def test_torch_compile_of_transposed_inputs_and_gradients(rng):
    """Gates, state and output gradients of any strides: contiguous outputs, as the fake functions say."""
    c, h, b, dcn, dhn = _inputs(rng, "float32", 6, 16)
    c, h = (t.detach().t().contiguous().t().requires_grad_() for t in (c, h))
    w = dhn.t().contiguous().t()

    def step(c, h, b):
        c_next, h_next = fused_lstm_gates(c, *h.split(16, 1), bias=b)
        return (h_next * w).sum() + c_next.sum()

    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True)(c, h, b)
    grads = torch.autograd.grad(loss, (c, h, b))
    for got, exp in zip(grads, torch.autograd.grad(step(c, h, b), (c, h, b))):
        torch.testing.assert_close(got, exp)


def test_autocast_cpu(rng):
    """Under autocast the state and the gates are cast to the autocast dtype."""
    c, h, b, dcn, dhn = _inputs(rng, "float32", 6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c_next, h_next = fused_lstm_gates(c, h, bias=b)
    assert c_next.dtype == h_next.dtype == torch.bfloat16
    c16, h16 = (t.detach().bfloat16().double().numpy() for t in (c, h))
    for got, exp in zip((c_next, h_next), ref.lstm_gates(c16, h16, bias=_f64(b))):
        assert rel_error(got, exp) < tolerance("bfloat16")
    dc, dh, db = torch.autograd.grad((c_next, h_next), (c, h, b), (dcn.bfloat16(), dhn.bfloat16()))
    assert dc.dtype == dh.dtype == db.dtype == torch.float32


def _bad_cases():
    c, h = torch.randn(4, 8), torch.randn(4, 32)
    return {
        "no-gates": ((c,), {}, TypeError, r"one merged \(N, 4K\) tensor or four"),
        "two-gates": ((c, h, h), {}, TypeError, r"got 2"),
        "h-width": ((c, torch.randn(4, 30)), {}, ValueError, r"h must have shape \(4, 32\)"),
        "h-tokens": ((c, torch.randn(5, 32)), {}, ValueError, r"h must have shape \(4, 32\)"),
        "f-shape": ((c, c, c, torch.randn(4, 9), c), {}, ValueError, r"f must have shape \(4, 8\)"),
        "c-0d": ((torch.tensor(1.5), h), {}, ValueError, r"c must have a feature axis"),
        "c-3d": ((torch.randn(2, 4, 8), h), {}, ValueError, r"h must have c's leading shape \(2, 4\)"),
        "h-3d": ((c, torch.randn(2, 4, 32)), {}, ValueError, r"h must have shape \(4, 32\) for c of shape \(4, 8\)"),
        "o-1d": ((c, c, c, c, torch.randn(8)), {}, ValueError, r"o must have shape \(4, 8\)"),
        "c-int": ((torch.ones(4, 8, dtype=torch.int64), h), {}, TypeError, r"c must be float16"),
        "h-dtype": ((c, h.half()), {}, TypeError, r"h must have c's dtype torch.float32"),
        "o-dtype": ((c, c, c, c, c.double()), {}, TypeError, r"o must have c's dtype"),
        "bias-size": ((c, h), dict(bias=torch.randn(8)), ValueError, r"bias must have 32 elements"),
        "bias-dtype": ((c.half(), h.half()), dict(bias=torch.ones(32, dtype=torch.int32)), TypeError,
                       r"bias must be float16"),
        "forget-bias-str": ((c, h), dict(forget_bias="1"), TypeError, r"forget_bias must be a real number"),
        "forget-bias-inf": ((c, h), dict(forget_bias=float("inf")), ValueError, r"forget_bias must be finite"),
        "gate-list": ((c, [h]), {}, TypeError, r"h must be a torch.Tensor"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_input(case):
    args, kwargs, error, match = _bad_cases()[case]
    with pytest.raises(error, match=match):
        fused_lstm_gates(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n, k, merged", [(4096, 1024, True), (333, 4000, False), (16384, 256, True)],
                         ids=["4096x1024-merged", "333x4000-four", "16384x256-merged"])
def test_gpu(rng, dtype, n, k, merged):
    """The kernels on a GPU at realistic sizes against float64; the backward is deterministic."""
    c, h, b, dcn, dhn = (t.detach().cuda().requires_grad_(t.requires_grad) for t in _inputs(rng, dtype, n, k))
    gates = (h,) if merged else h.split(k, 1)
    outs = fused_lstm_gates(c, *gates, bias=b)
    kw = dict(forget_bias=1.0, xp=torch)
    c64, h64, b64 = (t.detach().double() for t in (c, h, b))
    for got, want in zip(outs, ref.lstm_gates(c64, h64, bias=b64, **kw)):
        assert rel_error(got, want) < tolerance(dtype)
    grads = torch.autograd.grad(outs, (c, h, b), (dcn, dhn))
    for got, want in zip(grads, ref.lstm_gates_grad(dcn.double(), dhn.double(), c64, h64, bias=b64, **kw)):
        assert rel_error(got, want) < tolerance(dtype)
    again = torch.autograd.grad(fused_lstm_gates(c, *gates, bias=b), (c, h, b), (dcn, dhn))
    assert all(torch.equal(x, y) for x, y in zip(grads, again))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
def test_eager_calls_skip_the_dispatcher(rng, merged):
    """A call that needs a gradient is one autograd node of the eager twin (not the custom op's)."""
    c = torch.from_numpy(rng.standard_normal((5, 8))).float().requires_grad_()
    h = torch.from_numpy(rng.standard_normal((5, 32))).float()
    gates = (h,) if merged else h.split(8, dim=1)
    c_next, h_next = fused_lstm_gates(c, *gates)
    name = "LstmGatesFunctionBackward" if merged else "LstmGates4FunctionBackward"
    assert type(c_next.grad_fn).__name__ == type(h_next.grad_fn).__name__ == name
    assert fused_lstm_gates(c.detach(), *gates)[0].grad_fn is None


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
def test_twice_differentiable(rng, merged):
    c = torch.from_numpy(rng.standard_normal((3, 4))).requires_grad_()
    h = torch.from_numpy(rng.standard_normal((3, 16))).requires_grad_()
    bias = torch.from_numpy(rng.standard_normal(16)).requires_grad_()

    def fn(c, h, bias):
        return fused_lstm_gates(c, *((h,) if merged else h.split(4, dim=1)), bias=bias)

    torch.autograd.gradgradcheck(fn, (c, h, bias))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
def test_inside_non_reentrant_checkpoint(rng, merged):
    """Activation checkpointing (``use_reentrant=False``) refuses a second unpack of a saved tensor:
    the backward unpacks each once, and its gradients are the plain call's."""
    from torch.utils.checkpoint import checkpoint
    c, h, bias, dcn, dhn = _inputs(rng, "float32", 6, 8)

    def cell(c, h, bias):
        return fused_lstm_gates(c, *((h,) if merged else h.split(c.shape[1], 1)), bias=bias)

    want = torch.autograd.grad(cell(c, h, bias), (c, h, bias), (dcn, dhn))
    got = torch.autograd.grad(checkpoint(cell, c, h, bias, use_reentrant=False), (c, h, bias), (dcn, dhn))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    unpacked = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: unpacked.append(t) or t):
        out = cell(c, h, bias)
    torch.autograd.grad(out, (c, h, bias), (dcn, dhn))
    assert len(unpacked) == (3 if merged else 6)
