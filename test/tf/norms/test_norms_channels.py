"""batch_norm, batch_norm_inference (blocksparse.norms) and cwise_linear (blocksparse.conv) on
channels-first tensors: values and every gradient against float64 numpy; bad arguments."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.conv import cwise_linear
from blocksparse.norms import batch_norm, batch_norm_inference
from blocksparse.testing import norms as ref
from blocksparse.testing import rel_error, tolerance
from tf_modes import assert_raises, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
SHAPES = {"NC": (16, 6), "NCW": (4, 5, 7), "NCHW": (3, 4, 5, 6), "NCDHW": (2, 3, 4, 3, 5)}


def assert_close(got, want, tol, what):
    err = rel_error(got, want)
    assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.0e}"


@pytest.mark.parametrize("stats_grads", [False, True], ids=["y-grad", "all-grads"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_batch_norm(rng, dtype, shape, stats_grads):
    c = shape[1]
    x = rng.standard_normal(shape) * 2 + rng.standard_normal((1, c) + (1,) * (len(shape) - 2))
    g, b = rng.standard_normal(c), rng.standard_normal(c)
    grad_ys = [rng.standard_normal(shape)] + [rng.standard_normal(c) if stats_grads else None] * 2
    res = run("eager", lambda x, g, b: batch_norm(x, g, b, epsilon=1e-5), [x, g, b],
              [dtype, tf.float32, tf.float32], grad_ys)
    tol = tolerance(dtype)
    assert res.out_dtypes == [dtype.name, "float32", "float32"]
    assert res.grad_dtypes == [dtype.name, "float32", "float32"]
    x, g, b = res.inputs
    for what, got, want in zip(("y", "mean", "var"), res.outputs, ref.batch_norm(x, g, b, 1e-5)):
        assert_close(got, want, tol, what)
    want = ref.batch_norm_grad(*res.grad_ys, x, g, b, 1e-5)
    for what, got, w in zip(("dx", "dg", "db"), res.grads, want):
        assert_close(got, w, tol, what)


@pytest.mark.parametrize("mode", ["eager", "graph"])  # (tf_modes' function mode marks missing gradients by (0,))
def test_batch_norm_without_channels(rng, mode):
    """C = 0: empty outputs and gradients (the gradient once divided by the channel count)."""
    shape = (3, 0, 4, 2)
    res = run(mode, lambda x, g, b: batch_norm(x, g, b), [np.zeros(shape), np.zeros(0), np.zeros(0)],
              [tf.float32] * 3, [np.zeros(shape), np.zeros(0), np.zeros(0)])
    assert [np.shape(o) for o in res.outputs] == [shape, (0,), (0,)]
    assert [np.shape(d) for d in res.grads] == [shape, (0,), (0,)]


def test_batch_norm_of_an_empty_batch(rng):
    """N = 0: an empty ``y``, NaN statistics (the mean of nothing, as documented), zero gradients
    for ``g`` and ``b``."""
    g, b = rng.standard_normal(3), rng.standard_normal(3)
    res = run("eager", lambda x, g, b: batch_norm(x, g, b), [np.zeros((0, 3, 4)), g, b], [tf.float32] * 3,
              [np.zeros((0, 3, 4)), None, None])
    y, mean, var = res.outputs
    assert np.shape(y) == (0, 3, 4) and np.isnan(mean).all() and np.isnan(var).all()
    assert np.shape(res.grads[0]) == (0, 3, 4) and not np.any(res.grads[1]) and not np.any(res.grads[2])


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_batch_norm_graph_modes(rng, mode):
    shape = (4, 3, 5, 5)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    g, b = rng.standard_normal(3), rng.standard_normal(3)
    res = run(mode, lambda x, g, b: batch_norm(x, g, b), [x, g, b], [tf.bfloat16, tf.float32, tf.float32],
              [dy, None, rng.standard_normal(3)], unknown={0: (0, 2, 3)})
    x, g, b = res.inputs
    for got, want in zip(res.outputs, ref.batch_norm(x, g, b)):
        assert_close(got, want, tolerance(tf.bfloat16), "outputs")
    for got, want in zip(res.grads, ref.batch_norm_grad(res.grad_ys[0], None, res.grad_ys[2], x, g, b)):
        assert_close(got, want, tolerance(tf.bfloat16), "grads")


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_batch_norm_inference(rng, dtype, mode):
    shape = (3, 4, 5, 6)
    x = rng.standard_normal(shape)
    g, b, m = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)
    v = rng.uniform(0.5, 2.0, 4)
    res = run(mode, lambda x, g, b, m, v: batch_norm_inference(x, g, b, m, v, 1e-3), [x, g, b, m, v],
              [dtype] + [tf.float32] * 4, [rng.standard_normal(shape)], unknown={0: (0,)})
    tol = tolerance(dtype)
    assert res.out_dtypes == [dtype.name]
    assert_close(res.outputs[0], ref.batch_norm_inference(*res.inputs, 1e-3), tol, "y")
    for what, got, want in zip("x g b m v".split(), res.grads,
                               ref.batch_norm_inference_grad(res.grad_ys[0], *res.inputs, 1e-3)):
        assert_close(got, want, tol, "d" + what)


CWISE = {"a-and-b": (True, True), "a-only": (True, False), "b-only": (False, True)}


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
@pytest.mark.parametrize("parts", CWISE.values(), ids=CWISE.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_cwise_linear(rng, dtype, parts, mode):
    shape = (2, 6, 4, 5)
    use_a, use_b = parts
    x = rng.standard_normal(shape)
    params = [rng.standard_normal((1, 6, 1, 1)) for use in parts if use]  # the original's shape

    def fn(x, *params):
        it = iter(params)
        return cwise_linear(x, a=next(it) if use_a else None, b=next(it) if use_b else None)

    res = run(mode, fn, [x] + params, [dtype] + [tf.float32] * len(params), [rng.standard_normal(shape)],
              unknown={0: (0, 3)})
    tol = tolerance(dtype)
    it = iter(res.inputs[1:])
    a = next(it).ravel() if use_a else None
    b = next(it).ravel() if use_b else None
    assert_close(res.outputs[0], ref.cwise_linear(res.inputs[0], a, b), tol, "y")
    want = [w for w in ref.cwise_linear_grad(res.grad_ys[0], res.inputs[0], a, b) if w is not None]
    for got, w in zip(res.grads, want):
        assert_close(np.reshape(got, w.shape), w, tol, "grad")


def test_xla(rng):
    x, dz = (rng.standard_normal((4, 3, 5, 2)).astype(np.float32) for _ in range(2))
    g, b, a = (rng.standard_normal(3).astype(np.float32) for _ in range(3))

    @tf.function(jit_compile=True)
    def step(x, g, b, a, dz):
        with tf.GradientTape() as tape:
            tape.watch([x, g])
            y, mean, var = batch_norm(x, g, b)
            z = cwise_linear(y, a=a, b=b)
        return y, mean, var, z, tape.gradient(z, [x, g], output_gradients=dz)

    y, mean, var, z, (dx, dg) = step(x, g, b, a, dz)
    for got, want in zip((y, mean, var), ref.batch_norm(x, g, b)):
        assert_close(got, want, 1e-5, "batch_norm")
    assert_close(z, ref.cwise_linear(ref.batch_norm(x, g, b)[0], a, b), 1e-5, "cwise_linear")
    dy = dz * a.reshape(1, 3, 1, 1)  # through cwise_linear
    want_dx, want_dg, _ = ref.batch_norm_grad(dy, None, None, x, g, b)
    assert_close(dx, want_dx, 1e-5, "dx")
    assert_close(dg, want_dg, 1e-5, "dg")


def test_xla_gradient_inside_a_loop(rng):
    """batch_norm's gradient inside ``tf.while_loop`` under XLA compiles (shapes from dy) and
    matches float64."""
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    # gains away from 0: a channel of gain ~0 leaves tanh nearly constant, and the next norm scales up its rounding
    g = (rng.choice([-1, 1], 3) * rng.uniform(0.5, 1.5, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    steps = 2

    @tf.function(input_signature=[tf.TensorSpec([None, 3, 5]), tf.TensorSpec([3]), tf.TensorSpec([3])],
                 jit_compile=True)
    def run(x, g, b):
        with tf.GradientTape() as tape:
            tape.watch([x, g])
            # tanh between the norms: batch_norm of a batch_norm would not depend on x at all
            _, h = tf.while_loop(lambda t, h: t < steps, lambda t, h: (t + 1, tf.tanh(batch_norm(h, g, b)[0])),
                                 [0, x], maximum_iterations=steps)
            loss = tf.reduce_sum(h * h)
        return tape.gradient(loss, [x, g])

    dx, dg = run(x, g, b)
    hs = [x.astype(np.float64)]
    for _ in range(steps):
        hs.append(np.tanh(ref.batch_norm(hs[-1], g, b)[0]))
    dh, want_dg = 2 * hs[-1], 0.0
    for h, out in zip(reversed(hs[:-1]), reversed(hs[1:])):
        dh, dg_t, _ = ref.batch_norm_grad(dh * (1 - out ** 2), None, None, h, g, b)
        want_dg = want_dg + dg_t
    assert_close(dx, dh, 1e-4, "dx")
    assert_close(dg, want_dg, 1e-4, "dg")


X = tf.ones([2, 3, 4, 4])
V3 = tf.ones([3])
BAD = {
    "bn-g-size": (lambda: batch_norm(X, tf.ones([4]), V3), ValueError, r"g must have shape \(3,\)"),
    "bn-rank1": (lambda: batch_norm(tf.ones([3]), V3, V3), ValueError, "rank >= 2"),
    "bn-epsilon": (lambda: batch_norm(X, V3, V3, epsilon=-1.0), ValueError, "epsilon"),
    "bn-x-dtype": (lambda: batch_norm(tf.ones([2, 3], tf.float64), V3, V3), TypeError, "x must have dtype"),
    "bni-v-size": (lambda: batch_norm_inference(X, V3, V3, V3, tf.ones([2])), ValueError, "v must"),
    "bni-m-dtype": (lambda: batch_norm_inference(X, V3, V3, tf.ones([3], tf.int32), V3), TypeError, "m must"),
    "cwise-none": (lambda: cwise_linear(X), ValueError, "needs a, b or both"),
    "cwise-a-shape": (lambda: cwise_linear(X, a=tf.ones([1, 3, 2, 1])), ValueError, r"a must have shape \(3,\)"),
    "cwise-b-size": (lambda: cwise_linear(X, b=tf.ones([4])), ValueError, "b must"),
    "cwise-rank1": (lambda: cwise_linear(tf.ones([3]), a=V3), ValueError, "rank >= 2"),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_bad_arguments(case):
    assert_raises(case)


def test_unknown_channels_are_an_error_in_graphs():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 4, 4])
        for call in (lambda: batch_norm(x, V3, V3), lambda: cwise_linear(x, a=V3)):
            with pytest.raises(ValueError, match="known size on the feature axis 1"):
                call()
