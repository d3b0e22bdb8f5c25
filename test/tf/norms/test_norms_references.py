"""The float64 references' gradients (blocksparse.testing.ew / .norms) against central finite
differences, so that the oracle the ops are tested against is itself checked; the LSTM gates'
merged and four-gate forms agree, and the torch namespace computes what numpy does."""
import numpy as np
import pytest

from blocksparse.testing import ew, norms


def directional(f, inputs, dys, rng, h=1e-6):
    """``(sum_k <dy_k, (f(x + h v) - f(x - h v)) / 2h>, v)`` for a random direction ``v``."""
    vs = [rng.standard_normal(np.shape(x)) for x in inputs]
    plus = f(*[x + h * v for x, v in zip(inputs, vs)])
    minus = f(*[x - h * v for x, v in zip(inputs, vs)])
    slope = sum(np.sum(dy * (p - m)) for dy, p, m in zip(dys, plus, minus)) / (2 * h)
    return slope, vs


def check(f, grads, inputs, dys, rng):
    slope, vs = directional(f, inputs, dys, rng)
    predicted = sum(np.sum(g * v) for g, v in zip(grads, vs))
    assert abs(slope - predicted) <= 1e-6 * max(1.0, abs(slope)), (slope, predicted)


@pytest.mark.parametrize("op", sorted(ew.UNARY))
def test_unary(rng, op):
    f, df = ew.UNARY[op]
    x = rng.uniform(0.5, 2.0, 20) if op in ("sqrt", "log", "reciprocal") else rng.standard_normal(20)
    params = (0.7,) if op in ("elu", "gelu", "swish") else ()
    dy = rng.standard_normal(20)
    check(lambda x: [f(x, *params)], [dy * df(x, *params)], [x], [dy], rng)


@pytest.mark.parametrize("op", sorted(ew.BINARY))
def test_binary(rng, op):
    f, dfdx, dfdy = ew.BINARY[op]
    x, y = rng.standard_normal((3, 4)), rng.standard_normal(4) + 3.0
    dz = rng.standard_normal((3, 4))
    grads = [ew.unbroadcast(dz * dfdx(x, y), x.shape), ew.unbroadcast(dz * dfdy(x, y), y.shape)]
    check(lambda x, y: [f(x, y)], grads, [x, y], [dz], rng)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("axis, segments", [(1, 1), (1, 3), (0, 2), (-1, 2)])
def test_layer_norm(rng, axis, segments, relu):
    x = rng.standard_normal({1: (5, 12), 0: (12, 5), -1: (2, 3, 12)}[axis])
    c = x.shape[axis]
    g, b, dy = rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(x.shape)
    kw = dict(axis=axis, segments=segments, relu=relu)
    check(lambda x, g, b: [norms.layer_norm(x, g, b, **kw)], norms.layer_norm_grad(dy, x, g, b, **kw),
          [x, g, b], [dy], rng)


@pytest.mark.parametrize("bias", [False, True])
def test_lstm_gates(rng, bias):
    shape = (3, 5)
    inputs = [rng.standard_normal(shape) for _ in range(5)] + ([rng.standard_normal(20)] if bias else [])
    dys = [rng.standard_normal(shape), rng.standard_normal(shape)]
    grads = norms.lstm_gates_grad(*dys, *inputs[:5], bias=inputs[5] if bias else None, forget_bias=0.7)

    def f(*xs):
        return norms.lstm_gates(*xs[:5], bias=xs[5] if bias else None, forget_bias=0.7)

    check(f, [g for g in grads if g is not None], inputs, dys, rng)


def test_lstm_gates_merged_and_four_gates_agree(rng):
    c, h, bias, dc_next, dh_next = norms.draw_lstm_gates(rng, 3, 4)
    four = np.split(h, 4, axis=-1)
    assert np.array_equal(norms.lstm_gates(c, h, bias=bias), norms.lstm_gates(c, *four, bias=bias))
    dc, dh, dbias = norms.lstm_gates_grad(dc_next, dh_next, c, h, bias=bias)
    dc4, *dgates, dbias4 = norms.lstm_gates_grad(dc_next, dh_next, c, *four, bias=bias)
    for merged, split in ((dc, dc4), (dh, np.concatenate(dgates, axis=-1)), (dbias, dbias4)):
        assert np.array_equal(merged, split)
    with pytest.raises(TypeError, match="got 2"):
        norms.lstm_gates(c, h, bias)  # a bias given by position would be read as a gate


@pytest.mark.parametrize("axis", [1, 0])
def test_torch_namespace_matches_numpy(rng, axis):
    torch = pytest.importorskip("torch")
    x, g, b, dy = norms.draw_layer_norm(rng, 5, 12, axis)
    c, h, bias, dc_next, dh_next = norms.draw_lstm_gates(rng, 5, 3)
    kw = dict(axis=axis, segments=3, relu=True)
    cases = [(norms.layer_norm, (x, g, b), kw), (norms.layer_norm_grad, (dy, x, g, b), kw),
             (norms.layer_norm_grad, (dy, x, None, None), {}),
             (norms.lstm_gates, (c, h), dict(bias=bias)), (norms.lstm_gates_grad, (dc_next, dh_next, c, h), {})]
    for fn, args, kwargs in cases:
        want = fn(*args, **kwargs)
        got = fn(*(None if a is None else torch.from_numpy(a) for a in args), **kwargs, xp=torch)
        for w, t in zip(want if isinstance(want, tuple) else [want], got if isinstance(got, tuple) else [got]):
            assert (w is None and t is None) or (t.dtype == torch.float64 and np.allclose(t.numpy(), w, 0, 1e-12))


def test_batch_norm(rng):
    x = rng.standard_normal((4, 3, 2, 5))
    g, b = rng.standard_normal(3), rng.standard_normal(3)
    dys = [rng.standard_normal(x.shape), rng.standard_normal(3), rng.standard_normal(3)]
    check(lambda x, g, b: norms.batch_norm(x, g, b), norms.batch_norm_grad(*dys, x, g, b), [x, g, b], dys, rng)


def test_batch_norm_inference(rng):
    x = rng.standard_normal((4, 3, 5))
    g, b, m = (rng.standard_normal(3) for _ in range(3))
    v = rng.uniform(0.5, 1.5, 3)
    dy = rng.standard_normal(x.shape)
    check(lambda *a: [norms.batch_norm_inference(*a)], norms.batch_norm_inference_grad(dy, x, g, b, m, v),
          [x, g, b, m, v], [dy], rng)


def test_cwise_linear(rng):
    x, a, b = rng.standard_normal((2, 4, 3)), rng.standard_normal(4), rng.standard_normal(4)
    dy = rng.standard_normal(x.shape)
    check(lambda *t: [norms.cwise_linear(*t)], norms.cwise_linear_grad(dy, x, a, b), [x, a, b], [dy], rng)
