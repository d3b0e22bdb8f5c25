"""Acceptance tests of ``blocksparse.torch.layer_norm`` and ``blocksparse.torch.fused_lstm_gates`` as
README documents them: both activation layouts, fused relu, segments, optional gain / bias, the
merged and the four-tensor gates, every dtype, edge cases and bad input."""
import pytest

torch = pytest.importorskip("torch")
from torch_setup import poison_empty  # noqa: E402,F401

from blocksparse.torch import fused_lstm_gates, layer_norm  # noqa: E402
from torch_acceptance import DTYPES, close, coarser, draw, f64  # noqa: E402


def _leaf64(t):
    return None if t is None else torch.tensor(f64(t), requires_grad=True)


# ---------------------------------------------------------------------------------------- layer norm
def _ln_reference(x, g, b, axis, epsilon, relu, segments):
    """The README formula in float64 torch ops: ``x`` (N, C) or (C, N)."""
    axis %= 2
    xt = x if axis == 1 else x.t()                                  # (N, C)
    n, c = xt.shape
    parts = xt.reshape(n, segments, c // segments)
    mean = parts.mean(-1, keepdim=True)
    var = ((parts - mean) ** 2).mean(-1, keepdim=True)              # biased
    y = ((parts - mean) / torch.sqrt(var + epsilon)).reshape(n, c)
    if g is not None:
        y = y * g.reshape(c)
    if b is not None:
        y = y + b.reshape(c)
    if relu:
        y = torch.relu(y)
    return y if axis == 1 else y.t()


def _check_ln(rng, x, g, b, axis=1, epsilon=1e-6, relu=False, segments=1, call=None):
    x.requires_grad_()
    for p in (g, b):
        if p is not None:
            p.requires_grad_()
    y = call() if call else layer_norm(x, g, b, axis, epsilon, relu, segments=segments)
    assert y.shape == x.shape and y.dtype == x.dtype
    refs = [_leaf64(t) for t in (x, g, b)]
    ref = _ln_reference(*refs, axis, epsilon, relu, segments)
    close(y, f64(ref), x.dtype)
    dy = draw(rng, tuple(y.shape), x.dtype)
    y.backward(dy)
    ref.backward(torch.tensor(f64(dy)))
    for got, want in zip((x, g, b), refs):
        if got is not None:
            assert got.grad.dtype == got.dtype
            close(got.grad, f64(want.grad), coarser(x.dtype, got.dtype))


def _ln_inputs(rng, shape, dtype, axis, pdtype=None):
    c = shape[axis]
    x = draw(rng, shape, dtype) * 2 + 0.5
    g = draw(rng, (c,), pdtype or dtype)
    b = draw(rng, (c,), pdtype or dtype)
    return x.detach(), g, b


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("relu, segments", [(False, 1), (True, 4)], ids=["plain", "relu-seg4"])
def test_layer_norm(rng, axis, dtype, relu, segments):
    x, g, b = _ln_inputs(rng, (7, 48) if axis == 1 else (48, 7), dtype, axis)
    _check_ln(rng, x, g, b, axis, 1e-5, relu, segments)


@pytest.mark.parametrize("n", [0, 1], ids=["N0", "N1"])
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_layer_norm_tiny_batches(rng, n, axis):
    x, g, b = _ln_inputs(rng, (n, 16) if axis == 1 else (16, n), torch.float32, axis)
    _check_ln(rng, x, g, b, axis)


def test_layer_norm_documented_call_forms(rng):
    x, g, b = _ln_inputs(rng, (5, 32), torch.float32, 1)
    _check_ln(rng, x, None, None)                                                  # no gain, no bias
    x2, g2 = x.detach().clone(), g.detach().clone()
    _check_ln(rng, x2, g2, None, 1, 1e-3, True, 2,
              call=lambda: layer_norm(x=x2, g=g2, b=None, axis=1, epsilon=1e-3, relu=True, segments=2))
    g32, b32 = draw(rng, (32,), torch.float32), draw(rng, (32,), torch.float32)
    xt = draw(rng, (5, 32), torch.bfloat16).detach()
    _check_ln(rng, xt.t(), g32, b32, -2)                                           # axis -2 == 0, transposed input
    _check_ln(rng, xt, g32.detach().reshape(1, 32), b32.detach(), -1)             # float32 params, bfloat16 x


def test_layer_norm_compile_and_autocast(rng):
    x, g, b = _ln_inputs(rng, (6, 32), torch.float32, 1)
    fn = torch.compile(lambda *a: layer_norm(*a, relu=True, segments=4), fullgraph=True, backend="aot_eager")
    _check_ln(rng, x, g, b, relu=True, segments=4, call=lambda: fn(x, g, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer_norm(x, g, b)
    assert y.dtype == torch.bfloat16
    close(y, f64(_ln_reference(_leaf64(x.to(torch.bfloat16)), _leaf64(g), _leaf64(b), 1, 1e-6, False, 1)),
          torch.bfloat16)


@pytest.mark.parametrize("call, err, words", [
    (lambda x, g, b: layer_norm(x.numpy(), g, b), TypeError, "x must be"),
    (lambda x, g, b: layer_norm(x.long(), g, b), TypeError, "x must be float"),
    (lambda x, g, b: layer_norm(x[0, 0], g, b), ValueError, "x must have a feature axis"),
    (lambda x, g, b: layer_norm(x[None], g, b), ValueError, "g must have 4 elements"),  # features on axis 1
    (lambda x, g, b: layer_norm(x, g[:-1], b), ValueError, "g must have 16 elements"),
    (lambda x, g, b: layer_norm(x, g, b, axis=0), ValueError,
     r"g must have 4 elements \(shape \(4,\)\); got shape \(16,\)"),
    (lambda x, g, b: layer_norm(x, g, b, axis=2), ValueError, "axis"),
    (lambda x, g, b: layer_norm(x, g, b, axis=1.0), TypeError, "axis"),
    (lambda x, g, b: layer_norm(x, g, b, epsilon=0.0), ValueError, "epsilon must be > 0"),
    (lambda x, g, b: layer_norm(x, g, b, epsilon="1e-5"), TypeError, "epsilon"),
    (lambda x, g, b: layer_norm(x, g, b, relu=1), TypeError, "relu must be a bool"),
    (lambda x, g, b: layer_norm(x, g, b, segments=3), ValueError, "segments must divide"),
    (lambda x, g, b: layer_norm(x, g, b, segments=0), ValueError, "segments"),
    (lambda x, g, b: layer_norm(x, g.to("meta"), b), ValueError, "g must be on"),
    (lambda x, g, b: layer_norm(x, [1.0] * 16, b), TypeError, "g must be"),
], ids=["numpy", "int", "0d", "3d", "g-size", "g-size-axis0", "axis-2", "axis-float", "epsilon-0", "epsilon-str",
        "relu-int", "segments-3", "segments-0", "g-device", "g-list"])
def test_layer_norm_bad_arguments(rng, call, err, words):
    x, g, b = _ln_inputs(rng, (4, 16), torch.float32, 1)
    with pytest.raises(err, match=words):
        call(x, g.detach(), b.detach())


# ---------------------------------------------------------------------------------------- LSTM gates
def _lstm_reference(c, gates, bias, forget_bias):
    h = gates[0] if len(gates) == 1 else torch.cat(gates, 1)
    if bias is not None:
        h = h + bias
    i, j, f, o = h.chunk(4, 1)
    c_next = torch.sigmoid(f + forget_bias) * c + torch.sigmoid(i) * torch.tanh(j)
    return c_next, torch.sigmoid(o) * torch.tanh(c_next)


def _check_lstm(rng, c, gates, bias=None, forget_bias=1.0, call=None):
    leaves = [c, *gates] + ([bias] if bias is not None else [])
    for t in leaves:
        t.requires_grad_()
    out = call() if call else fused_lstm_gates(c, *gates, bias=bias, forget_bias=forget_bias)
    assert isinstance(out, tuple) and len(out) == 2
    refs = [_leaf64(t) for t in leaves]
    want = _lstm_reference(refs[0], refs[1:1 + len(gates)], refs[-1] if bias is not None else None, forget_bias)
    douts = []
    for got, ref in zip(out, want):
        assert got.shape == c.shape and got.dtype == c.dtype
        close(got, f64(ref), c.dtype)
        douts.append(draw(rng, tuple(c.shape), c.dtype))
    torch.autograd.backward(out, douts)
    torch.autograd.backward(want, [torch.tensor(f64(d)) for d in douts])
    for got, ref in zip(leaves, refs):
        assert got.grad.dtype == got.dtype
        close(got.grad, f64(ref.grad), coarser(c.dtype, got.dtype))


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("four", [False, True], ids=["merged", "four"])
def test_lstm_gates(rng, dtype, four):
    c, h = draw(rng, (6, 8), dtype), draw(rng, (6, 32), dtype) * 2
    gates = [t.contiguous() for t in h.split(8, 1)] if four else [h]
    _check_lstm(rng, c, gates, draw(rng, (32,), torch.float32), forget_bias=0.5)


@pytest.mark.parametrize("n", [0, 1], ids=["N0", "N1"])
@pytest.mark.parametrize("four", [False, True], ids=["merged", "four"])
def test_lstm_gates_tiny_batches(rng, n, four):
    c, h = draw(rng, (n, 4), torch.float32), draw(rng, (n, 16), torch.float32)
    _check_lstm(rng, c, [t.contiguous() for t in h.split(4, 1)] if four else [h])


def test_lstm_gates_documented_call_forms(rng):
    c, h = draw(rng, (5, 8), torch.float32), draw(rng, (5, 32), torch.float32)
    _check_lstm(rng, c, [h])                                                        # defaults: no bias, forget_bias 1
    c2, h2 = c.detach().clone(), h.detach().clone()
    _check_lstm(rng, c2, [h2], forget_bias=2, call=lambda: fused_lstm_gates(c2, h2, forget_bias=2))
    views = list(draw(rng, (32, 5), torch.float32).t().split(8, 1))                 # strided views
    _check_lstm(rng, draw(rng, (8, 5), torch.float32).t(), views, draw(rng, (1, 32), torch.float64))


def test_lstm_gates_compile_and_autocast(rng):
    c, h, bias = draw(rng, (4, 8), torch.float32), draw(rng, (4, 32), torch.float32), draw(rng, (32,), torch.float32)
    fn = torch.compile(lambda c, h, b: fused_lstm_gates(c, h, bias=b), fullgraph=True, backend="aot_eager")
    _check_lstm(rng, c, [h], bias, call=lambda: fn(c, h, bias))
    fn4 = torch.compile(lambda c, *g: fused_lstm_gates(c, *g, forget_bias=0.0), fullgraph=True, backend="aot_eager")
    gates = [t.detach().contiguous() for t in h.split(8, 1)]
    c4 = c.detach().clone()
    _check_lstm(rng, c4, gates, forget_bias=0.0, call=lambda: fn4(c4, *gates))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_lstm_gates(c.detach(), h.detach())
    assert all(t.dtype == torch.bfloat16 for t in out)
    want = _lstm_reference(_leaf64(c.to(torch.bfloat16)), [_leaf64(h.to(torch.bfloat16))], None, 1.0)
    for got, ref in zip(out, want):
        close(got, f64(ref), torch.bfloat16)


@pytest.mark.parametrize("call, err, words", [
    (lambda c, h: fused_lstm_gates(c), TypeError, "gates must be one merged"),
    (lambda c, h: fused_lstm_gates(c, h, h), TypeError, "gates must be one merged"),
    (lambda c, h: fused_lstm_gates(c, h[:, :-1]), ValueError, r"h must have shape \(3, 16\)"),
    (lambda c, h: fused_lstm_gates(c, *h.split(4, 1)[:3], h[:, :3]), ValueError, r"o must have shape \(3, 4\)"),
    (lambda c, h: fused_lstm_gates(c, h.double()), TypeError, "h must have c's dtype"),
    (lambda c, h: fused_lstm_gates(c.numpy(), h), TypeError, "c must be"),
    (lambda c, h: fused_lstm_gates(c[0], h), ValueError, r"h must have c's leading shape \(\)"),
    (lambda c, h: fused_lstm_gates(c[None], h), ValueError, r"h must have c's leading shape \(1, 3\)"),
    (lambda c, h: fused_lstm_gates(c, h.int()), TypeError, "h must be float"),
    (lambda c, h: fused_lstm_gates(c, h, bias=torch.zeros(8)), ValueError, "bias must have 16 elements"),
    (lambda c, h: fused_lstm_gates(c, h, forget_bias="1"), TypeError, "forget_bias"),
    (lambda c, h: fused_lstm_gates(c, h, forget_bias=float("nan")), ValueError, "forget_bias must be finite"),
    (lambda c, h: fused_lstm_gates(c, h.to("meta")), ValueError, "h must be on"),
], ids=["no-gates", "two-gates", "h-width", "o-width", "dtype-mismatch", "numpy", "1d-state-2d-gates", "3d", "int",
        "bias-size", "forget-bias-str", "forget-bias-nan", "device"])
def test_lstm_gates_bad_arguments(rng, call, err, words):
    c, h = draw(rng, (3, 4), torch.float32), draw(rng, (3, 16), torch.float32)
    with pytest.raises(err, match=words):
        call(c, h)


@pytest.mark.interpreter
def test_triton_kernels_tiny(rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    x, g, b = _ln_inputs(rng, (16, 5), torch.float32, 0)
    _check_ln(rng, x, g, b, 0, 1e-5, True, 2)
    c, h = draw(rng, (3, 8), torch.float32), draw(rng, (3, 32), torch.float32)
    _check_lstm(rng, c, [h], draw(rng, (32,), torch.float32))
    _check_lstm(rng, c.detach().clone(), [t.contiguous() for t in h.detach().split(8, 1)])


def test_vmap_is_correct_or_refused(rng):
    g, b = draw(rng, (16,), torch.float32), draw(rng, (16,), torch.float32)
    x, c, h = (draw(rng, s, torch.float32) for s in ((3, 5, 16), (3, 5, 4), (3, 5, 16)))
    cases = [(lambda t: layer_norm(t, g, b, segments=2), (x,)),
             (lambda t: layer_norm(t, g, b, axis=0), (x.transpose(1, 2),)),
             (lambda a, q: fused_lstm_gates(a, q)[1], (c, h))]
    for fn, args in cases:
        try:
            got = torch.func.vmap(fn)(*args)
        except RuntimeError as exc:
            assert "vmap" in str(exc)
            continue
        close(got, f64(torch.stack([fn(*a) for a in zip(*args)])), torch.float32)


def test_gradients_of_some_inputs_only(rng):
    x, g, b = _ln_inputs(rng, (5, 16), torch.float32, 1)
    g, b = g.detach(), b.detach()
    x.requires_grad_()
    dy = draw(rng, (5, 16), torch.float32)
    layer_norm(x, g, b).backward(dy)
    xr = _leaf64(x)
    _ln_reference(xr, _leaf64(g).detach(), _leaf64(b).detach(), 1, 1e-6, False, 1).backward(torch.tensor(f64(dy)))
    close(x.grad, f64(xr.grad), torch.float32)
    assert g.grad is None and b.grad is None

    c, h, bias = draw(rng, (4, 8), torch.float32), draw(rng, (4, 32), torch.float32), draw(rng, (32,), torch.float32)
    bias.requires_grad_()
    c_next, h_next = fused_lstm_gates(c, h, bias=bias)
    (c_next.sum() + h_next.sum()).backward()
    br = _leaf64(bias)
    ref = _lstm_reference(_leaf64(c).detach(), [_leaf64(h).detach()], br, 1.0)
    (ref[0].sum() + ref[1].sum()).backward()
    close(bias.grad, f64(br.grad), torch.float32)
    assert c.grad is None and h.grad is None
