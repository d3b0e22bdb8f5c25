"""blocksparse.norms.layer_norm: values and gradients (x, g, b) against float64 numpy, both
activation layouts, segments, fused relu, every dtype and execution mode; bad arguments."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.norms import layer_norm
from blocksparse.testing import norms as ref
from blocksparse.testing import rel_error, tolerance
from tf_modes import run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
#: (x shape, axis): (N, C) and (C, N) as BlocksparseMatMul lays activations out, then other ranks
LAYOUTS = {"NC-axis1": ((12, 64), 1), "CN-axis0": ((64, 12), 0), "NTC-axis-1": ((3, 5, 32), -1),
           "NCT-axis1": ((3, 32, 4), 1)}


def case(rng, shape, axis):
    x = rng.standard_normal(shape) * 3.0 + rng.standard_normal()  # a mean and scale to remove
    c = shape[axis]
    return x, rng.standard_normal(c), 0.5 * rng.standard_normal(c), rng.standard_normal(shape)


def check(res, axis, segments, relu, dtypes, epsilon=1e-6):
    x, g, b = res.inputs
    assert res.out_dtypes == [dtypes[0].name]
    assert res.grad_dtypes == [d.name for d in dtypes]
    tol = tolerance(dtypes[0])
    y = ref.layer_norm(x, g, b, axis, segments, epsilon, relu)
    assert rel_error(res.outputs[0], y) < tol, "y"
    for what, got, want in zip(("dx", "dg", "db"), res.grads,
                               ref.layer_norm_grad(res.grad_ys[0], x, g, b, axis, segments, epsilon, relu)):
        assert rel_error(got, want) < tol, what


@pytest.mark.parametrize("relu", [False, True], ids=["linear", "relu"])
@pytest.mark.parametrize("segments", [1, 4], ids=["seg1", "seg4"])
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_layer_norm_eager(rng, dtype, layout, segments, relu):
    shape, axis = layout
    res = run("eager", lambda x, g, b: layer_norm(x, g, b, axis=axis, relu=relu, segments=segments),
              case(rng, shape, axis)[:3], [dtype] * 3, [case(rng, shape, axis)[3]])
    check(res, axis, segments, relu, [dtype] * 3)


@pytest.mark.parametrize("x_dtype", ["fp16", "bf16"])
def test_float32_parameters_with_low_precision_activations(rng, x_dtype):
    x, g, b, dy = case(rng, (16, 48), 1)
    dtypes = [DTYPES[x_dtype], tf.float32, tf.float32]
    res = run("eager", lambda x, g, b: layer_norm(x, g, b, relu=True), [x, g, b], dtypes, [dy])
    check(res, 1, 1, True, dtypes)


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("layout", ["NC-axis1", "CN-axis0"])
def test_layer_norm_graph_modes(rng, layout, mode):
    shape, axis = LAYOUTS[layout]
    x, g, b, dy = case(rng, shape, axis)
    res = run(mode, lambda x, g, b: layer_norm(x, g, b, axis, 1e-5, True, segments=2), [x, g, b],
              [tf.bfloat16, tf.float32, tf.float32], [dy], unknown={0: (1 - axis,)})
    check(res, axis, 2, True, [tf.bfloat16, tf.float32, tf.float32], epsilon=1e-5)


def test_xla(rng):
    x, g, b, dy = case(rng, (8, 64), 1)

    @tf.function(jit_compile=True)
    def step(x, g, b):
        with tf.GradientTape() as tape:
            tape.watch([x, g, b])
            y = layer_norm(x, g, b, segments=4)
        return y, tape.gradient(y, [x, g, b], output_gradients=tf.constant(dy, tf.float32))

    y, grads = step(*(tf.constant(v, tf.float32) for v in (x, g, b)))
    assert rel_error(y, ref.layer_norm(x, g, b, segments=4)) < 1e-5
    for got, want in zip(grads, ref.layer_norm_grad(dy, x, g, b, segments=4)):
        assert rel_error(got, want) < 1e-5


def test_xla_gradient_inside_a_loop(rng):
    """An RNN step under XLA: the gradient of layer norms inside ``tf.while_loop`` compiles (its
    reshapes take their shape from dy, not from a value the loop carries over) and matches float64."""
    x, g, b, _ = case(rng, (4, 16), 1)
    steps = 3

    @tf.function(input_signature=[tf.TensorSpec([None, 16])] + [tf.TensorSpec([16])] * 2, jit_compile=True)
    def run(x, g, b):
        with tf.GradientTape() as tape:
            tape.watch([x, g, b])
            _, h = tf.while_loop(lambda t, h: t < steps, lambda t, h: (t + 1, layer_norm(h, g, b, segments=2)),
                                 [0, x], maximum_iterations=steps)
            loss = tf.reduce_sum(h * h)
        return loss, tape.gradient(loss, [x, g, b])

    loss, grads = run(*(tf.constant(v, tf.float32) for v in (x, g, b)))
    hs = [x]
    for _ in range(steps):
        hs.append(ref.layer_norm(hs[-1], g, b, segments=2))
    dh, dg, db = 2 * hs[-1], 0.0, 0.0
    for h in reversed(hs[:-1]):
        dh, dg_t, db_t = ref.layer_norm_grad(dh, h, g, b, segments=2)
        dg, db = dg + dg_t, db + db_t
    assert rel_error(loss, np.sum(hs[-1] ** 2)) < 1e-5
    for got, want in zip(grads, (dh, dg, db)):
        assert rel_error(got, want) < 1e-4


@pytest.mark.parametrize("g_shape", [(1, 32), (32, 1)], ids=["1xC", "Cx1"])
def test_original_gain_shapes(rng, g_shape):
    """The original accepted g and b of any shape with C elements; gradients keep that shape."""
    x, g, b, dy = case(rng, (6, 32), 1)
    gt = tf.Variable(g.reshape(g_shape), dtype=tf.float32)
    with tf.GradientTape() as tape:
        y = layer_norm(tf.constant(x, tf.float32), gt, tf.constant(b, tf.float32))
    dg = tape.gradient(y, gt, output_gradients=tf.constant(dy, tf.float32))
    assert dg.shape == g_shape
    assert rel_error(dg.numpy().ravel(), ref.layer_norm_grad(dy, x, g, b)[1]) < 1e-5


def test_constant_features_give_the_bias(rng):
    """var = 0: y = b exactly (epsilon keeps the division finite)."""
    x = np.full((3, 16), 2.5, np.float32)
    g, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    np.testing.assert_allclose(layer_norm(x, g, b).numpy(), np.broadcast_to(b, (3, 16)), atol=1e-6)


def test_triton_backend_insists(monkeypatch):
    from blocksparse._tf.dispatch import BackendUnavailableError

    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(BackendUnavailableError, match="reference"):
        layer_norm(tf.ones([2, 16]), tf.ones([16]), tf.zeros([16]))
    # (N, C) rows of C not a multiple of 16 have no kernels: the reference path, silently
    assert layer_norm(tf.ones([2, 8]), tf.ones([8]), tf.zeros([8])).shape == (2, 8)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    assert layer_norm(tf.ones([2, 16]), tf.ones([16]), tf.zeros([16])).shape == (2, 16)


BAD = {
    "g-size": (dict(g=np.ones(7)), ValueError, r"g must have shape \(8,\)"),
    "b-matrix": (dict(b=np.ones((2, 4))), ValueError, r"b must have shape \(8,\)"),
    "segments-divide": (dict(segments=3), ValueError, "segments must divide"),
    "segments-zero": (dict(segments=0), ValueError, "segments"),
    "segments-float": (dict(segments=2.0), TypeError, "segments"),
    "axis-range": (dict(axis=2), ValueError, r"axis must be in \[-2, 2\)"),
    "axis-float": (dict(axis=1.0), TypeError, "axis"),
    "epsilon": (dict(epsilon=0.0), ValueError, "epsilon"),
    "relu": (dict(relu=1), TypeError, "relu"),
    "x-dtype": (dict(x=np.ones((4, 8))), TypeError, "x must have dtype"),
    "x-int": (dict(x=tf.ones([4, 8], tf.int32)), TypeError, "x must have dtype"),
    "g-string": (dict(g=tf.constant(["a"] * 8)), TypeError, "g must have dtype"),
}


@pytest.mark.parametrize("case_", BAD.values(), ids=BAD.keys())
def test_bad_arguments(case_):
    change, error, match = case_
    kwargs = dict(x=tf.ones([4, 8]), g=tf.ones([8]), b=tf.zeros([8]))
    kwargs.update(change)
    with pytest.raises(error, match=match):
        layer_norm(**kwargs)


def test_bad_arguments_in_graphs():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="known rank"):
            layer_norm(tf.compat.v1.placeholder(tf.float32), tf.ones([8]), tf.zeros([8]))
        with pytest.raises(ValueError, match="known size on the feature axis"):
            layer_norm(tf.compat.v1.placeholder(tf.float32, [4, None]), tf.ones([8]), tf.zeros([8]))
        g = tf.compat.v1.placeholder(tf.float32, [None])
        y = layer_norm(tf.ones([4, 8]), g, tf.zeros([8]))
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {g: np.ones(8)}).shape == (4, 8)
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"g must have shape \(8,\)"):
                sess.run(y, {g: np.ones(6)})
