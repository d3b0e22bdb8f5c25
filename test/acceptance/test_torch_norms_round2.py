"""Acceptance, second round: ``blocksparse.torch.layer_norm`` and ``fused_lstm_gates`` as a demanding
user calls them -- the meta device, ``no_grad`` / ``inference_mode``, double backward, forward-mode
AD and ``torch.func`` transforms, ``gradcheck`` in float64, expanded / sliced / transposed inputs,
parameter shapes and dtypes, numpy scalars for the options, ``torch.compile`` with dynamic shapes
and under autocast, ``opcheck`` of the custom ops, the Triton kernels on strided inputs
(interpreter, tiny), and bad arguments.  Values and gradients against float64 formulas."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_setup import poison_empty  # noqa: E402,F401

from blocksparse.torch import fused_lstm_gates, layer_norm  # noqa: E402
from torch_acceptance import close, draw, f64  # noqa: E402


def _ln64(x, g, b, axis=1, epsilon=1e-6, relu=False, segments=1):
    """The documented formula in float64 torch ops (differentiable): ``x`` (N, C) or (C, N)."""
    xt = x.double() if axis % 2 == 1 else x.double().t()
    n, c = xt.shape
    parts = xt.reshape(n, segments, c // segments)
    mean = parts.mean(-1, keepdim=True)
    var = ((parts - mean) ** 2).mean(-1, keepdim=True)
    y = ((parts - mean) / torch.sqrt(var + epsilon)).reshape(n, c)
    y = y if g is None else y * g.double().reshape(c)
    y = y if b is None else y + b.double().reshape(c)
    y = torch.relu(y) if relu else y
    return y if axis % 2 == 1 else y.t()


def _lstm64(c, gates, bias=None, forget_bias=1.0):
    h = torch.cat([t.double() for t in gates], 1)
    if bias is not None:
        h = h + bias.double().reshape(-1)
    i, j, f, o = h.chunk(4, 1)
    c_next = torch.sigmoid(f + forget_bias) * c.double() + torch.sigmoid(i) * torch.tanh(j)
    return c_next, torch.sigmoid(o) * torch.tanh(c_next)


def _grads(outputs, inputs, douts):
    return torch.autograd.grad(outputs, inputs, douts, allow_unused=True)


# ---------------------------------------------------------------------------------------- devices, modes
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_meta_device_shapes_and_backward(axis):
    """Shape-only runs on the meta device (model sizing, deferred init) work for both ops."""
    shape = (5, 32) if axis == 1 else (32, 5)
    x = torch.empty(shape, device="meta", dtype=torch.bfloat16, requires_grad=True)
    g = torch.empty(32, device="meta", requires_grad=True)
    y = layer_norm(x, g, None, axis, 1e-5, True, segments=4)
    assert y.shape == shape and y.device.type == "meta" and y.dtype == torch.bfloat16
    y.sum().backward()
    assert x.grad.shape == shape and g.grad.shape == (32,) and g.grad.dtype == torch.float32
    c = torch.empty(5, 8, device="meta", dtype=torch.float16)
    for gates in ([torch.empty(5, 32, device="meta", dtype=torch.float16)],
                  [torch.empty(5, 8, device="meta", dtype=torch.float16)] * 4):
        c_next, h_next = fused_lstm_gates(c, *gates, bias=torch.empty(32, device="meta"))
        assert c_next.shape == h_next.shape == (5, 8) and c_next.device.type == "meta"
        assert c_next.dtype == torch.float16


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode(rng, mode):
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    x, g, b = draw(rng, (4, 24), torch.float32, True), draw(rng, (24,), torch.float32, True), None
    c, h = draw(rng, (4, 6), torch.float32, True), draw(rng, (4, 24), torch.float32)
    with ctx():
        y = layer_norm(x, g, b, segments=3)
        c_next, h_next = fused_lstm_gates(c, h, forget_bias=0.0)
    assert not (y.requires_grad or c_next.requires_grad or h_next.requires_grad)
    close(y, f64(_ln64(x, g, b, segments=3)), torch.float32)
    for got, want in zip((c_next, h_next), _lstm64(c, [h], forget_bias=0.0)):
        close(got, f64(want), torch.float32)


@pytest.mark.parametrize("axis, relu, segments", [(1, False, 1), (0, True, 2)], ids=["NC", "CN-relu-seg2"])
def test_layer_norm_double_backward(rng, axis, relu, segments):
    """Second derivatives (a gradient penalty): ``gradgradcheck`` in float64, and a Hessian-vector
    product in float32 against the float64 formula."""
    shape = (3, 8) if axis == 1 else (8, 3)
    x = draw(rng, shape, torch.float64, True)
    g, b = draw(rng, (8,), torch.float64, True), draw(rng, (8,), torch.float64, True)
    assert torch.autograd.gradgradcheck(lambda x, g, b: layer_norm(x, g, b, axis, 1e-3, relu, segments=segments),
                                        (x, g, b))
    x32, g32 = x.detach().float().requires_grad_(), g.detach().float().requires_grad_()
    (dx,) = torch.autograd.grad(layer_norm(x32, g32, None, axis, 1e-3, relu, segments=segments).pow(3).sum(), x32,
                                create_graph=True)
    hvp = torch.autograd.grad(dx.square().sum(), [x32, g32])
    x64, g64 = x.detach().requires_grad_(), g.detach().requires_grad_()
    (dx64,) = torch.autograd.grad(_ln64(x64, g64, None, axis, 1e-3, relu, segments).pow(3).sum(), x64,
                                  create_graph=True)
    for got, want in zip(hvp, torch.autograd.grad(dx64.square().sum(), [x64, g64])):
        close(got, f64(want), torch.float32)


def test_forward_mode_and_func_transforms(rng):
    """Forward-mode AD (``jvp``, ``jacfwd``, dual tensors), ``grad``, ``hessian`` and ``vmap`` give
    the formula's derivatives -- a dropped tangent would read as a zero derivative."""
    x, g = draw(rng, (3, 8), torch.float64), draw(rng, (8,), torch.float64)
    c, h = draw(rng, (3, 2), torch.float64), draw(rng, (3, 8), torch.float64)

    def ln_loss(fn):
        return lambda t: fn(t, g, None, 1, 1e-6, True, segments=2).pow(3).sum()

    ours, ref = ln_loss(layer_norm), ln_loss(lambda *a, segments: _ln64(*a, segments))
    for transform in (torch.func.grad, torch.func.jacfwd, torch.func.hessian):
        close(transform(ours)(x), f64(transform(ref)(x)), torch.float64)
    tangent = draw(rng, (3, 8), torch.float64)
    _, got = torch.func.jvp(lambda t: layer_norm(t, g, None, axis=0), (x.t(),), (tangent.t(),))
    _, want = torch.func.jvp(lambda t: _ln64(t, g, None, 0), (x.t(),), (tangent.t(),))
    close(got, f64(want), torch.float64)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(h, tangent)
        got = [torch.autograd.forward_ad.unpack_dual(t).tangent for t in fused_lstm_gates(c, dual, forget_bias=0.5)]
        want = [torch.autograd.forward_ad.unpack_dual(t).tangent for t in _lstm64(c, [dual], forget_bias=0.5)]
    for a, e in zip(got, want):
        close(a, f64(e), torch.float64)
    four = torch.func.jacrev(lambda t: fused_lstm_gates(c, *t.split(2, 1))[1])(h)
    close(four, f64(torch.func.jacrev(lambda t: _lstm64(c, list(t.split(2, 1)))[1])(h)), torch.float64)
    batch = draw(rng, (4, 3, 8), torch.float64)
    close(torch.func.vmap(lambda t: layer_norm(t, g, None, segments=4))(batch),
          f64(torch.stack([_ln64(t, g, None, segments=4) for t in batch])), torch.float64)


# ---------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("axis, relu, segments", [(1, False, 1), (0, False, 2), (1, True, 4)],
                         ids=["NC", "CN-seg2", "NC-relu-seg4"])
def test_layer_norm_gradcheck_float64(rng, axis, relu, segments):
    shape = (3, 8) if axis == 1 else (8, 3)
    x = draw(rng, shape, torch.float64, True)
    x = (x + torch.sign(x) * 0.1).detach().requires_grad_()
    g, b = draw(rng, (8,), torch.float64, True), draw(rng, (8,), torch.float64, True)
    assert torch.autograd.gradcheck(lambda x, g, b: layer_norm(x, g, b, axis, 1e-3, relu, segments=segments),
                                    (x, g, b))


@pytest.mark.parametrize("four", [False, True], ids=["merged", "four"])
def test_lstm_gates_gradcheck_and_gradgradcheck_float64(rng, four):
    c, h = draw(rng, (3, 2), torch.float64, True), draw(rng, (3, 8), torch.float64)
    gates = [t.detach().requires_grad_() for t in (h.split(2, 1) if four else [h])]
    bias = draw(rng, (8,), torch.float64, True)

    def step(c, b, *gs):
        return fused_lstm_gates(c, *gs, bias=b, forget_bias=0.5)

    assert torch.autograd.gradcheck(step, (c, bias, *gates))
    assert torch.autograd.gradgradcheck(step, (c, bias, *gates))


# ---------------------------------------------------------------------------------------- input forms
def _strided_forms(rng, n, c):
    """(name, leaf, view) pairs: the view is the (n, c) input, the leaf receives its gradient."""
    base = draw(rng, (2 * n, c + 5), torch.float32, True)
    row = draw(rng, (1, c), torch.float32, True)
    tall = draw(rng, (c, n), torch.float32, True)
    return [("sliced", base, base[::2, 2:2 + c]), ("expanded", row, row.expand(n, c)), ("transposed", tall, tall.t())]


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_layer_norm_strided_inputs(rng, axis):
    for name, leaf, view in _strided_forms(rng, 5, 16):
        x = view if axis == 1 else view.t()
        g = draw(rng, (16,), torch.float32, True)
        y = layer_norm(x, g, None, axis, 1e-5, False, segments=2)
        assert y.shape == x.shape, name
        leaf64 = leaf.detach().double().requires_grad_()
        g64 = g.detach().double().requires_grad_()
        view64 = {"sliced": lambda t: t[::2, 2:18], "expanded": lambda t: t.expand(5, 16),
                  "transposed": lambda t: t.t()}[name](leaf64)
        want = _ln64(view64 if axis == 1 else view64.t(), g64, None, axis, 1e-5, False, 2)
        close(y, f64(want), torch.float32)
        dy = draw(rng, tuple(y.shape), torch.float32)
        got = _grads(y, [leaf, g], dy)
        exp = _grads(want, [leaf64, g64], dy.double())
        for a, e in zip(got, exp):
            close(a, f64(e), torch.float32)


def test_lstm_gates_strided_inputs(rng):
    c_row = draw(rng, (1, 4), torch.float32, True)
    h_base = draw(rng, (6, 20), torch.float32, True)
    c, h = c_row.expand(3, 4), h_base[::2, 2:18]
    bias = draw(rng, (1, 16), torch.float64, True)                       # (1, 4K), float64: any float dtype
    out = fused_lstm_gates(c, h, bias=bias, forget_bias=np.float32(0.25))
    c64, hb64, b64 = (t.detach().double().requires_grad_() for t in (c_row, h_base, bias))
    want = _lstm64(c64.expand(3, 4), [hb64[::2, 2:18]], b64, 0.25)
    douts = [draw(rng, (3, 4), torch.float32) for _ in range(2)]
    for got, exp in zip(out, want):
        close(got, f64(exp), torch.float32)
    got = _grads(out, [c_row, h_base, bias], douts)
    exp = _grads(want, [c64, hb64, b64], [d.double() for d in douts])
    assert got[2].dtype == torch.float64
    for a, e in zip(got, exp):
        close(a, f64(e), torch.float32)


@pytest.mark.parametrize("pshape", [(1, 12), (12, 1)], ids=["1xC", "Cx1"])
@pytest.mark.parametrize("pdtype", [torch.float64, torch.bfloat16], ids=["f64-params", "bf16-params"])
def test_layer_norm_parameter_shapes_and_dtypes(rng, pshape, pdtype):
    x = draw(rng, (4, 12), torch.float32, True)
    g, b = draw(rng, pshape, pdtype, True), draw(rng, pshape, pdtype, True)
    y = layer_norm(x, g, b, relu=np.bool_(False), segments=np.int64(3), axis=np.int64(1))
    want = _ln64(x, g, b, segments=3)
    close(y, f64(want), torch.bfloat16 if pdtype == torch.bfloat16 else torch.float32)
    dy = draw(rng, (4, 12), torch.float32)
    got, exp = _grads(y, [x, g, b], dy), _grads(want, [x, g, b], dy.double())
    for a, e, leaf in zip(got, exp, (x, g, b)):
        assert a.shape == leaf.shape and a.dtype == leaf.dtype
        close(a, f64(e), torch.bfloat16 if pdtype == torch.bfloat16 else torch.float32)


def test_relu_as_numpy_bool(rng):
    x = draw(rng, (3, 8), torch.float32)
    y = layer_norm(x, None, None, 1, 1e-6, np.bool_(True))
    close(y, f64(_ln64(x, None, None, relu=True)), torch.float32)


# ---------------------------------------------------------------------------------------- compile, autocast, ops
def test_compile_dynamic_shapes(rng):
    ln = torch.compile(lambda x, g: layer_norm(x, g, None, axis=0, relu=True, segments=2), fullgraph=True,
                       backend="aot_eager", dynamic=True)
    gates = torch.compile(lambda c, h, b: fused_lstm_gates(c, *h.chunk(4, 1), bias=b), fullgraph=True,
                          backend="aot_eager", dynamic=True)
    g, bias = draw(rng, (8,), torch.float32), draw(rng, (16,), torch.float32)
    for n in (3, 5, 1):
        x = draw(rng, (8, n), torch.float32, True)
        y = ln(x, g)
        want = _ln64(x, g, None, 0, 1e-6, True, 2)
        close(y, f64(want), torch.float32)
        dy = draw(rng, (8, n), torch.float32)
        close(_grads(y, [x], dy)[0], f64(_grads(want, [x], dy.double())[0]), torch.float32)
        c, h = draw(rng, (n, 4), torch.float32), draw(rng, (n, 16), torch.float32)
        for got, exp in zip(gates(c, h, bias), _lstm64(c, [h], bias)):
            close(got, f64(exp), torch.float32)


def test_compile_under_autocast(rng):
    fn = torch.compile(lambda x, g, b, c: fused_lstm_gates(c, layer_norm(x, g, b, segments=4)), fullgraph=True,
                       backend="aot_eager")
    x, g, b = draw(rng, (3, 16), torch.float32, True), draw(rng, (16,), torch.float32), draw(rng, (16,), torch.float32)
    c = draw(rng, (3, 4), torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c_next, h_next = fn(x, g, b, c)
    assert c_next.dtype == h_next.dtype == torch.bfloat16
    xb, cb = x.to(torch.bfloat16), c.to(torch.bfloat16)
    y = _ln64(xb, g, b, segments=4).to(torch.bfloat16)               # the op rounds y to bfloat16
    for got, exp in zip((c_next, h_next), _lstm64(cb, [y])):
        close(got, f64(exp), torch.bfloat16)
    h_next.float().sum().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("four", [False, True], ids=["merged", "four"])
def test_autocast_mixed_state_and_gate_dtypes(rng, four):
    """Under autocast a float32 cell state with bfloat16 gates is cast like any other activation."""
    c, h = draw(rng, (3, 4), torch.float32), draw(rng, (3, 16), torch.bfloat16)
    gates = list(h.split(4, 1)) if four else [h]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_lstm_gates(c, *gates)
    for got, exp in zip(out, _lstm64(c.to(torch.bfloat16), [h])):
        assert got.dtype == torch.bfloat16
        close(got, f64(exp), torch.bfloat16)
    with pytest.raises(TypeError, match="c's dtype"):                 # outside autocast: one dtype
        fused_lstm_gates(c, *gates)


def test_autocast_leaves_float64_alone(rng):
    x, c, h = draw(rng, (3, 8), torch.float64), draw(rng, (3, 2), torch.float64), draw(rng, (3, 8), torch.float64)
    with torch.autocast("cpu", dtype=torch.float16):
        y = layer_norm(x, None, None)
        c_next, _ = fused_lstm_gates(c, h)
    assert y.dtype == c_next.dtype == torch.float64
    close(y, f64(_ln64(x, None, None)), torch.float64)


def test_custom_ops_pass_opcheck(rng):
    x, g = draw(rng, (4, 16), torch.float32), draw(rng, (16,), torch.float32)
    c, h, bias = draw(rng, (4, 4), torch.float32), draw(rng, (4, 16), torch.float32), draw(rng, (16,), torch.float32)
    ops = torch.ops.blocksparse
    cases = [(ops.layer_norm.default, (x, g, None, 1, 1e-5, True, 2)),
             (ops.layer_norm.default, (x.t(), None, g, 0, 1e-5, False, 4)),
             (ops.lstm_gates.default, (c, h, bias, 1.0)),
             (ops.lstm_gates4.default, (c, *h.split(4, 1), None, 0.5)),
             # transposed views: the reference path's outputs are contiguous, as the fake functions say
             (ops.layer_norm.default, (draw(rng, (16, 4), torch.float32).t(), g, g, 1, 1e-5, False, 2)),
             (ops.lstm_gates.default, (c.t().contiguous().t(), draw(rng, (16, 4), torch.float32).t(), None, 1.0)),
             (ops.lstm_gates4.default, (c, *(draw(rng, (4, 4), torch.float32).t() for _ in range(4)), bias, 1.0))]
    for op, args in cases:
        args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), result


# ---------------------------------------------------------------------------------------- Triton kernels (interpreter)
@pytest.mark.interpreter
def test_triton_kernels_on_strided_inputs(rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    for _, leaf, view in _strided_forms(rng, 3, 16):
        for axis in (1, 0):
            x = view if axis == 1 else view.t()
            y = layer_norm(x, None, None, axis, 1e-5, True, segments=2)
            close(y, f64(_ln64(x.detach(), None, None, axis, 1e-5, True, 2)), torch.float32)
    c, hb = draw(rng, (3, 4), torch.bfloat16, True), draw(rng, (16, 3), torch.bfloat16, True)
    bias = draw(rng, (16,), torch.float32, True)
    out = fused_lstm_gates(c, *hb.t().split(4, 1), bias=bias)
    c64, hb64, b64 = (t.detach().double().requires_grad_() for t in (c, hb, bias))
    want = _lstm64(c64, list(hb64.t().split(4, 1)), b64)
    for got, exp in zip(out, want):
        close(got, f64(exp), torch.bfloat16)
    douts = [draw(rng, (3, 4), torch.bfloat16) for _ in range(2)]
    for a, e in zip(_grads(out, [c, hb, bias], douts), _grads(want, [c64, hb64, b64], [d.double() for d in douts])):
        close(a, f64(e), torch.bfloat16)


# ---------------------------------------------------------------------------------------- bad arguments
BAD = {
    "ln-epsilon-inf": (lambda x, c, h: layer_norm(x, None, None, epsilon=float("inf")), ValueError, "epsilon"),
    "ln-relu-str": (lambda x, c, h: layer_norm(x, None, None, relu="yes"), TypeError, "relu must be a bool"),
    "ln-segments-float": (lambda x, c, h: layer_norm(x, None, None, segments=2.0), TypeError, "segments"),
    "ln-segments-over-C": (lambda x, c, h: layer_norm(x, None, None, segments=32), ValueError, "segments must divide"),
    "ln-axis-bool": (lambda x, c, h: layer_norm(x, None, None, axis=True), TypeError, "axis"),
    "ln-axis-none": (lambda x, c, h: layer_norm(x, None, None, axis=None), TypeError, "axis"),
    "ln-x-none": (lambda x, c, h: layer_norm(None, None, None), TypeError, "x must be"),
    "ln-x-complex": (lambda x, c, h: layer_norm(x.to(torch.complex64), None, None), TypeError, "x must be"),
    "ln-g-int": (lambda x, c, h: layer_norm(x, torch.ones(16, dtype=torch.int32), None), TypeError, "g must be"),
    "ln-b-size": (lambda x, c, h: layer_norm(x, None, torch.zeros(15)), ValueError, "b must have 16 elements"),
    "ln-b-numpy": (lambda x, c, h: layer_norm(x, None, np.zeros(16)), TypeError, "b must be"),
    "ln-no-features": (lambda x, c, h: layer_norm(x[:, :0], None, None), ValueError, "at least one feature"),
    "lstm-no-features": (lambda x, c, h: fused_lstm_gates(c[:, :0], h[:, :0]), ValueError, "c must have at least one"),
    "lstm-gates-list": (lambda x, c, h: fused_lstm_gates(c, [h]), TypeError, "h must be a torch.Tensor"),
    "lstm-forget-bool": (lambda x, c, h: fused_lstm_gates(c, h, forget_bias=True), TypeError, "forget_bias"),
    "lstm-forget-tensor": (lambda x, c, h: fused_lstm_gates(c, h, forget_bias=torch.tensor(1.0)), TypeError,
                           "forget_bias"),
    "lstm-bias-int": (lambda x, c, h: fused_lstm_gates(c, h, bias=torch.ones(16, dtype=torch.int64)), TypeError,
                      "bias must be"),
    "lstm-bias-device": (lambda x, c, h: fused_lstm_gates(c, h, bias=torch.ones(16, device="meta")), ValueError,
                         "bias must be on"),
    "lstm-four-tokens": (lambda x, c, h: fused_lstm_gates(c, *h.split(4, 1)[:3], h[:2, :4]), ValueError,
                         r"o must have shape \(3, 4\)"),
    "lstm-four-dtype": (lambda x, c, h: fused_lstm_gates(c, *h.split(4, 1)[:3], h[:, :4].half()), TypeError,
                        "o must have c's dtype"),
    "lstm-c-none": (lambda x, c, h: fused_lstm_gates(None, h), TypeError, "c must be"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments(rng, case):
    call, error, pattern = BAD[case]
    x, c, h = draw(rng, (4, 16), torch.float32), draw(rng, (3, 4), torch.float32), draw(rng, (3, 16), torch.float32)
    with pytest.raises(error, match=pattern):
        call(x, c, h)
