"""Acceptance, second round: ``blocksparse.ew`` / ``ewops``, ``blocksparse.lstm``, ``blocksparse.norms``
and ``blocksparse.conv.cwise_linear`` as a demanding user calls them -- every execution mode
(``tf.compat.v1`` graphs, ``tf.function`` with unknown sizes, XLA), empty and rank-0 tensors,
numpy / list / variable inputs, higher-rank layouts, parameters of other float dtypes, and bad
arguments (graph-time unknowns included); values and gradients against float64 numpy."""
import numpy as np
import pytest
import tensorflow as tf

import blocksparse.ewops as ew
from blocksparse.conv import cwise_linear
from blocksparse.lstm import concat4, fused_lstm_gates, split4
from blocksparse.norms import batch_norm, batch_norm_inference, layer_norm
from blocksparse.testing import ew as ref
from blocksparse.testing import norms as nref
from blocksparse.testing import rel_error, tolerance
from tf_modes import assert_raises, check_run, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
UNARY = ["negative", "reciprocal", "square", "sqrt", "exp", "log", "sigmoid", "tanh", "relu", "elu"]
BINARY = ["add", "multiply", "subtract", "divide", "maximum", "minimum"]


def _unary_input(rng, op, shape):
    if op in ("sqrt", "log", "reciprocal"):
        return rng.uniform(0.5, 2.0, shape)
    x = 2.0 * rng.standard_normal(shape)
    return np.where(np.abs(x) < 0.05, 0.5, x)   # no relu kink at float16 rounding


# -- elementwise ops in graphs and functions with unknown sizes ---------------------------------

@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("op", UNARY)
def test_unary_unknown_shape_modes(rng, op, mode):
    x = _unary_input(rng, op, (5, 7))
    dy = rng.standard_normal(x.shape)
    call = (lambda t: ew.elu(t, 0.4)) if op == "elu" else getattr(ew, op)
    res = run(mode, call, [x], [tf.bfloat16], [dy], unknown={0: (0, 1)})
    f, df = ref.UNARY[op]
    params = (0.4,) if op == "elu" else ()
    xin = res.inputs[0]
    assert res.out_dtypes == ["bfloat16"] and res.grad_dtypes == ["bfloat16"]
    check_run(res, [f(xin, *params)], [res.grad_ys[0] * df(xin, *params)], tf.bfloat16)


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("op", BINARY)
def test_binary_broadcast_unknown_batch(rng, op, mode):
    x, y = rng.standard_normal((6, 5)), rng.standard_normal((1, 5)) + 0.25   # y broadcast over rows
    if op == "divide":
        y = np.sign(y) * (0.5 + np.abs(y))
    dz = rng.standard_normal((6, 5))
    res = run(mode, getattr(ew, op), [x, y], [tf.float16, tf.float16], [dz], unknown={0: (0,)})
    f, dfdx, dfdy = ref.BINARY[op]
    xin, yin = res.inputs
    dz = res.grad_ys[0]
    assert res.outputs[0].shape == (6, 5) and res.grads[1].shape == (1, 5)
    tol = tolerance(tf.float16)
    assert rel_error(res.outputs[0], f(xin, yin)) < tol
    assert rel_error(res.grads[0], dz * dfdx(xin, yin)) < tol
    want_dy = ref.unbroadcast(dz * dfdy(xin, yin), (1, 5))
    assert np.abs(res.grads[1] - want_dy).max() <= 4 * tol * np.abs(dz * dfdy(xin, yin)).sum(0).max()


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op", ["gelu", "swish", "fast_gelu"])
def test_readme_activations_defaults(rng, op, dtype):
    """The README's extra activations with their documented defaults: gelu's tanh form with
    alpha=0.044715, swish with alpha=1, fast_gelu = swish(x, alpha=1.702)."""
    x, dy = 3.0 * rng.standard_normal((4, 9)), rng.standard_normal((4, 9))
    res = run("graph", getattr(ew, op), [x], [dtype], [dy], unknown={0: (0,)})
    name, alpha = {"gelu": ("gelu", 0.044715), "swish": ("swish", 1.0), "fast_gelu": ("swish", 1.702)}[op]
    f, df = ref.UNARY[name]
    xin = res.inputs[0]
    assert res.out_dtypes == [dtype.name]
    check_run(res, [f(xin, alpha)], [res.grad_ys[0] * df(xin, alpha)], dtype)


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,))], ids=["same", "broadcast"])
def test_maximum_minimum_ties_send_the_gradient_to_x(rng, shapes):
    y = rng.standard_normal(shapes[1])
    x = np.broadcast_to(y, shapes[0]).copy()
    dz = rng.standard_normal(shapes[0])
    for op in ("maximum", "minimum"):
        res = run("eager", getattr(ew, op), [x, y], [tf.float16, tf.float16], [dz])
        assert np.array_equal(res.grads[0], res.grad_ys[0]) and not np.any(res.grads[1])


def test_rank0_and_number_operands():
    x = tf.constant(1.5, tf.bfloat16)
    assert ew.add(x, x).shape == () and ew.add(x, x).dtype == tf.bfloat16
    assert float(ew.tanh(x)) == pytest.approx(np.tanh(1.5), rel=1e-2)
    both = ew.multiply(2.0, 3.0)                  # two numbers: float32, as TensorFlow's default
    assert both.dtype == tf.float32 and float(both) == 6.0
    assert float(ew.subtract(1, tf.constant(4.0, tf.float16))) == -3.0


def test_numpy_list_and_variable_operands(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    v = tf.Variable(rng.standard_normal((3, 4)), dtype=tf.float32)
    with tf.GradientTape() as tape:
        z = ew.multiply(a, v)
    assert rel_error(z.numpy(), a.astype(np.float64) * v.numpy()) < 1e-6
    assert rel_error(tape.gradient(z, v).numpy(), a) < 1e-6
    assert rel_error(ew.sigmoid([[0.0, 1.0]]).numpy(), ref.sigmoid(np.array([[0.0, 1.0]]))) < 1e-6
    assert rel_error(ew.add_n8([a, a, v]).numpy(), 2.0 * a + v.numpy()) < 1e-6


EMPTY_CALLS = {
    "unary": (lambda x: ew.exp(x), (0, 8)),
    "binary": (lambda x: ew.maximum(x, tf.ones([8])), (0, 8)),
    "elu": (lambda x: ew.elu(x, 0.5), (0, 8)),
    "float_cast": (lambda x: ew.float_cast(x, tf.float16, tf.bfloat16), (0, 8)),
    "dropout": (lambda x: ew.dropout(x, 0.5)[0], (0, 8)),
    "add_n8": (lambda x: ew.add_n8([x, x, x]), (0, 8)),
    "split_concat": (lambda x: concat4(*split4(x)), (0, 8)),
    "lstm_merged": (lambda x: fused_lstm_gates(tf.zeros([0, 2]), x, bias=tf.ones([8]))[1], (0, 8)),
    "layer_norm": (lambda x: layer_norm(x, tf.ones([8]), tf.zeros([8]), segments=2, relu=True), (0, 8)),
    "layer_norm_axis0": (lambda x: layer_norm(x, tf.ones([8]), tf.zeros([8]), axis=0), (8, 0)),
    "bn_inference": (lambda x: batch_norm_inference(x, *[tf.ones([3])] * 4), (0, 3, 2, 2)),
    "cwise_linear": (lambda x: cwise_linear(x, tf.ones([3]), tf.ones([3])), (0, 3, 2)),
}


@pytest.mark.parametrize("case", sorted(EMPTY_CALLS))
def test_empty_batch(case):
    """An empty minibatch gives empty outputs and gradients of the right shapes, no error."""
    call, shape = EMPTY_CALLS[case]
    x = tf.zeros(shape, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = call(x)
    assert y.shape.num_elements() == 0 and y.dtype.is_floating
    dx = tape.gradient(y, x)
    assert dx is None or tuple(dx.shape) == shape


# -- XLA -------------------------------------------------------------------------------------------

def test_xla_norms_gates_and_casts(rng):
    """The documented ops under ``jit_compile=True``: values and gradients as in eager mode."""
    x = tf.constant(rng.standard_normal((6, 16)), tf.float32)
    g, b = tf.constant(1 + 0.2 * rng.standard_normal(16), tf.float32), tf.constant(rng.standard_normal(16),
                                                                                    tf.float32)
    c = tf.constant(rng.standard_normal((6, 4)), tf.float32)
    bias = tf.constant(0.3 * rng.standard_normal(16), tf.float32)
    x4 = tf.constant(1 + rng.standard_normal((2, 4, 3, 3)), tf.float32)
    a4 = tf.constant(rng.uniform(0.5, 1.5, 4), tf.float32)

    def step(x, g, b, c, bias, x4, a4):
        with tf.GradientTape() as tape:
            tape.watch([x, g, b, c, bias, x4, a4])
            y = layer_norm(x, g, b, axis=1, segments=4)
            c_next, h_next = fused_lstm_gates(c, y, bias=bias, forget_bias=0.5)
            cw = cwise_linear(x4, a4, None)
            bn, _, var = batch_norm(cw, a4, a4)
            loss = (tf.reduce_sum(tf.cast(ew.float_cast(h_next, tf.bfloat16, tf.float16), tf.float32))
                    + tf.reduce_sum(ew.add_n8([c_next, c_next])) + tf.reduce_sum(bn * bn) + tf.reduce_sum(var))
        return [loss] + tape.gradient(loss, [x, g, b, c, bias, x4, a4])

    args = (x, g, b, c, bias, x4, a4)
    eager = step(*args)
    xla = tf.function(step, jit_compile=True)(*args)
    for want, got in zip(eager, xla):
        assert rel_error(got.numpy(), want.numpy()) < 1e-4


# -- float_cast, dropout, add_n8 in graphs --------------------------------------------------------

@pytest.mark.parametrize("mode", ["function", "graph"])
def test_float_cast_modes(rng, mode):
    x = rng.standard_normal((3, 5))
    dy = rng.standard_normal((3, 5)) * 1.001
    res = run(mode, lambda t: ew.float_cast(t, tf.float16, dx_dtype=tf.bfloat16), [x], [tf.float32], [dy],
              unknown={0: (0,)})
    assert res.out_dtypes == ["float16"] and res.grad_dtypes == ["float32"]
    assert np.array_equal(res.outputs[0], x.astype(np.float32).astype(np.float16).astype(np.float64))
    want = tf.cast(tf.constant(res.grad_ys[0], tf.float32), tf.bfloat16).numpy().astype(np.float64)
    assert np.array_equal(res.grads[0], want)


def test_float_cast_same_dtype_is_identity_with_rounded_gradient(rng):
    x = tf.constant(rng.standard_normal((4, 4)), tf.float32)
    dy = tf.constant(rng.standard_normal((4, 4)) * 1.0001, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ew.float_cast(x, "float32", tf.float16)
    assert y.dtype == tf.float32 and np.array_equal(y.numpy(), x.numpy())
    dx = tape.gradient(y, x, output_gradients=dy)
    assert np.array_equal(dx.numpy(), dy.numpy().astype(np.float16).astype(np.float32))


def test_dropout_seed_reproducible_and_mask_forms(rng):
    x = tf.constant(rng.standard_normal((40, 30)) + 3.0, tf.float16)
    tf.random.set_seed(11)
    _, m1 = ew.dropout(x, 0.5, seed=5)
    tf.random.set_seed(11)
    _, m2 = ew.dropout(x, 0.5, seed=5)
    assert np.array_equal(m1.numpy(), m2.numpy())
    ints = m1.numpy().astype(np.int32) * 7             # numbers: nonzero keeps
    y, mask = ew.dropout(x, keep_prob=tf.Variable(0.5), mask=ints)
    assert mask.dtype == tf.bool and np.array_equal(mask.numpy(), m1.numpy())
    x64 = x.numpy().astype(np.float64)
    assert rel_error(y.numpy(), ref.dropout(x64, m1.numpy(), 0.5)) < tolerance(tf.float16)


def test_dropout_mask_reuse_in_function_unknown_batch(rng):
    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.bfloat16)])
    def twice(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y, mask = ew.dropout(x, 0.7)
            y2, _ = ew.dropout(x * 2, 0.7, mask)
            loss = tf.reduce_sum(tf.cast(y2, tf.float32))
        return y, y2, mask, tape.gradient(loss, x)

    x = tf.constant(rng.standard_normal((9, 6)) + 4.0, tf.bfloat16)
    y, y2, mask, dx = twice(x)
    m = mask.numpy()
    x64 = x.numpy().astype(np.float64)
    assert rel_error(y.numpy(), ref.dropout(x64, m, 0.7)) < tolerance(tf.bfloat16)
    assert rel_error(y2.numpy(), ref.dropout(2 * x64, m, 0.7)) < tolerance(tf.bfloat16)
    assert rel_error(dx.numpy(), ref.dropout(2 * np.ones_like(x64), m, 0.7)) < tolerance(tf.bfloat16)


@pytest.mark.parametrize("count", [2, 8])
def test_add_n8_graph_unknown_batch(rng, count):
    xs = [rng.standard_normal((4, 3)) for _ in range(count)]
    dz = rng.standard_normal((4, 3))
    res = run("graph", lambda *t: ew.add_n8(t), xs, [tf.bfloat16] * count, [dz],
              unknown={i: (0,) for i in range(count)})
    assert rel_error(res.outputs[0], np.sum(res.inputs, axis=0)) < tolerance(tf.bfloat16)
    for grad in res.grads:
        assert np.array_equal(grad, res.grad_ys[0])


# -- LSTM gates ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["function", "graph"])
def test_lstm_rank3_merged_with_bias_unknown_batch_and_time(rng, mode):
    c, h = rng.standard_normal((2, 3, 4)), 1.5 * rng.standard_normal((2, 3, 16))
    bias = 0.5 * rng.standard_normal(16)
    dc, dh = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    res = run(mode, lambda c, h, b: fused_lstm_gates(c, h, bias=b, forget_bias=2), [c, h, bias],
              [tf.float16, tf.float16, tf.float32], [dc, dh], unknown={0: (0, 1), 1: (0, 1)})
    cin, hin, bin_ = res.inputs
    kw = {"bias": bin_, "forget_bias": 2.0}
    check_run(res, nref.lstm_gates(cin, hin, **kw), nref.lstm_gates_grad(*res.grad_ys, cin, hin, **kw), tf.float16)
    assert res.grad_dtypes == ["float16", "float16", "float32"]


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_lstm_four_gates_feature_axis0_and_saturation(rng, mode):
    """Four (K, N) gate tensors (a feature_axis=0 model), pre-activations large enough to saturate
    every nonlinearity: finite values and gradients, as the formula gives them."""
    c = rng.standard_normal((8, 5))
    gates = [30.0 * rng.standard_normal((8, 5)) for _ in range(4)]
    dc, dh = rng.standard_normal((8, 5)), rng.standard_normal((8, 5))
    res = run(mode, lambda *t: fused_lstm_gates(*t, forget_bias=-1.0), [c, *gates], [tf.float32] * 5, [dc, dh],
              unknown={i: (1,) for i in range(5)})
    kw = {"forget_bias": -1.0}
    want = nref.lstm_gates(*res.inputs, **kw)
    want_grads = nref.lstm_gates_grad(*res.grad_ys, *res.inputs, **kw)
    for got, exp in zip(res.outputs, want):
        assert rel_error(got, exp) < tolerance(tf.float32)
    for got, exp in zip(res.grads, want_grads):
        assert np.all(np.isfinite(got)) and np.abs(got - exp).max() < 1e-5 * max(1.0, np.abs(exp).max())


def test_lstm_float64_bias_tensor_and_numpy_state(rng):
    """``bias`` of any float dtype (float64 here, its gradient float64); numpy c and h."""
    c, h = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)
    bias = tf.constant(rng.standard_normal(16), tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(bias)
        c_next, h_next = fused_lstm_gates(c, h, bias=bias, forget_bias=1)
        loss = tf.reduce_sum(c_next) + tf.reduce_sum(h_next)
    dbias = tape.gradient(loss, bias)
    want = nref.lstm_gates(c, h, bias=bias.numpy())
    assert rel_error(c_next.numpy(), want[0]) < 1e-5 and rel_error(h_next.numpy(), want[1]) < 1e-5
    grads = nref.lstm_gates_grad(np.ones((3, 4)), np.ones((3, 4)), c, h, bias=bias.numpy())
    assert dbias.dtype == tf.float64 and rel_error(dbias.numpy(), grads[-1]) < 1e-5


# -- layer norm, batch norm, cwise_linear --------------------------------------------------------

@pytest.mark.parametrize("layout", ["NTC_axis-1", "CNT_axis0", "NCT_axis1"])
def test_layer_norm_rank3(rng, layout):
    shape, axis = {"NTC_axis-1": ((2, 3, 16), -1), "CNT_axis0": ((16, 2, 3), 0),
                   "NCT_axis1": ((2, 16, 3), 1)}[layout]
    x = 1.0 + 2.0 * rng.standard_normal(shape)
    g, b = 1 + 0.3 * rng.standard_normal(16), rng.standard_normal(16)
    dy = rng.standard_normal(shape)
    res = run("function", lambda x, g, b: layer_norm(x, g, b, axis=axis, segments=2), [x, g, b],
              [tf.float32] * 3, [dy], unknown={0: tuple(i for i in range(3) if i != axis % 3)})
    xin, gin, bin_ = res.inputs
    moved = np.moveaxis(xin, axis, -1).reshape(-1, 16)                     # (positions, C)
    want = np.moveaxis(nref.layer_norm(moved, gin, bin_, segments=2).reshape(
        np.moveaxis(xin, axis, -1).shape), -1, axis)
    dmoved = np.moveaxis(dy, axis, -1).reshape(-1, 16)
    dx, dg, db = nref.layer_norm_grad(dmoved, moved, gin, bin_, segments=2)
    dx = np.moveaxis(dx.reshape(np.moveaxis(xin, axis, -1).shape), -1, axis)
    check_run(res, [want], [dx, dg, db], tf.float32)


def test_layer_norm_float64_parameters_and_numpy_flags(rng):
    """g and b of any float dtype: float64 tensors work, their gradients float64; numpy scalars
    for ``relu`` and ``epsilon``."""
    x = tf.constant(rng.standard_normal((4, 8)), tf.float16)
    g = tf.Variable(1 + 0.2 * rng.standard_normal(8), dtype=tf.float64)
    b = tf.Variable(rng.standard_normal(8), dtype=tf.float64)
    with tf.GradientTape() as tape:
        y = layer_norm(x, g, b, 1, np.float32(1e-4), np.bool_(False))
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.range(8, dtype=tf.float32))
    dg, db = tape.gradient(loss, [g, b])
    x64 = x.numpy().astype(np.float64)
    want = nref.layer_norm(x64, g.numpy(), b.numpy(), epsilon=1e-4)
    assert y.dtype == tf.float16 and rel_error(y.numpy(), want) < tolerance(tf.float16)
    _, wg, wb = nref.layer_norm_grad(np.tile(np.arange(8.0), (4, 1)), x64, g.numpy(), b.numpy(), epsilon=1e-4)
    assert dg.dtype == tf.float64 and db.dtype == tf.float64
    assert rel_error(dg.numpy(), wg) < tolerance(tf.float16) and rel_error(db.numpy(), wb) < 1e-6


def test_batch_norm_inference_and_cwise_linear_float64_parameters(rng):
    x = tf.constant(rng.standard_normal((2, 3, 4)), tf.bfloat16)
    g, b, m = (tf.constant(rng.standard_normal(3), tf.float64) for _ in range(3))
    v = tf.constant(rng.uniform(0.5, 2.0, 3), tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([g, v])
        y = batch_norm_inference(x, g, b, m, v)
        z = cwise_linear(x, a=g)
        loss = tf.reduce_sum(tf.cast(y, tf.float32)) + tf.reduce_sum(tf.cast(z, tf.float32))
    dg, dv = tape.gradient(loss, [g, v])
    x64 = x.numpy().astype(np.float64)
    args = [t.numpy() for t in (g, b, m, v)]
    assert y.dtype == tf.bfloat16 and rel_error(y.numpy(), nref.batch_norm_inference(x64, *args)) < 2e-2
    assert rel_error(z.numpy(), nref.cwise_linear(x64, args[0])) < 2e-2
    ones = np.ones_like(x64)
    want = nref.batch_norm_inference_grad(ones, x64, *args)
    assert dg.dtype == dv.dtype == tf.float64
    assert rel_error(dg.numpy(), want[1] + nref.cwise_linear_grad(ones, x64, args[0])[1]) < 2e-2
    assert rel_error(dv.numpy(), want[4]) < 2e-2


def test_layer_norm_one_feature_per_segment_and_constant_rows(rng):
    """Segments of one feature (variance 0) and constant rows give ``y = b`` exactly as the formula
    says (x - mean = 0), with finite gradients."""
    x = tf.constant(np.repeat(rng.standard_normal((3, 1)), 8, axis=1), tf.float32)
    g, b = rng.standard_normal(8), rng.standard_normal(8)
    for kw in ({"segments": 8}, {}):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer_norm(x, g, b, **kw)
        assert rel_error(y.numpy(), np.tile(b, (3, 1))) < 1e-6
        assert np.all(np.isfinite(tape.gradient(y, x).numpy()))


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_batch_norm_ncdhw_unknown_spatial_with_statistics_gradients(rng, mode):
    shape = (2, 3, 2, 3, 2)
    x = 1.0 + 2.0 * rng.standard_normal(shape)
    g, b = rng.uniform(0.5, 1.5, 3), rng.standard_normal(3)
    dy, dmean, dvar = rng.standard_normal(shape), rng.standard_normal(3), rng.standard_normal(3)
    res = run(mode, lambda x, g, b: batch_norm(x, g, b, epsilon=1e-5), [x, g, b], [tf.bfloat16, tf.float32,
              tf.float32], [dy, dmean, dvar], unknown={0: (0, 2, 3, 4)})
    assert res.out_dtypes == ["bfloat16", "float32", "float32"]
    xin, gin, bin_ = res.inputs
    check_run(res, nref.batch_norm(xin, gin, bin_, 1e-5), nref.batch_norm_grad(*res.grad_ys, xin, gin, bin_, 1e-5),
           tf.bfloat16, scale=2.0)


def test_batch_norm_single_value_per_channel(rng):
    """N = 1 and 1x1 spatial: the variance is 0, y = b, the statistics are x itself."""
    x = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    y, mean, var = batch_norm(x, np.ones(4), np.arange(4.0))
    assert rel_error(y.numpy().reshape(4), np.arange(4.0)) < 1e-6
    assert rel_error(mean.numpy(), x.reshape(4)) < 1e-6 and np.all(var.numpy() == 0)


@pytest.mark.parametrize("params", ["a_and_b", "a_only", "b_only"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 5), (2, 4, 2, 3, 2)], ids=["NC", "NCW", "NCDHW"])
def test_cwise_linear(rng, shape, mode, params):
    x = rng.standard_normal(shape)
    a, b = rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    dy = rng.standard_normal(shape)
    use_a, use_b = params != "b_only", params != "a_only"
    inputs = [x] + ([a] if use_a else []) + ([b] if use_b else [])

    def call(x, *p):
        kw = {"a": p[0]} if use_a else {}
        if use_b:
            kw["b"] = p[-1]
        return cwise_linear(x, **kw)

    res = run(mode, call, inputs, [tf.float16] + [tf.float32] * (len(inputs) - 1), [dy], unknown={0: (0,)})
    xin = res.inputs[0]
    ain = res.inputs[1] if use_a else None
    bin_ = res.inputs[-1] if use_b else None
    assert res.out_dtypes == ["float16"]
    grads = [g for g in nref.cwise_linear_grad(res.grad_ys[0], xin, ain, bin_) if g is not None]
    check_run(res, [nref.cwise_linear(xin, ain, bin_)], grads, tf.float16, scale=2.0)


def test_cwise_linear_original_parameter_shape_keeps_its_gradient_shape(rng):
    x = tf.constant(rng.standard_normal((2, 3, 4, 4)), tf.bfloat16)
    a = tf.constant(rng.uniform(0.5, 1.5, (1, 3, 1, 1)), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(a)
        y = cwise_linear(x, a)
        loss = tf.reduce_sum(tf.cast(y, tf.float32))
    da = tape.gradient(loss, a)
    x64 = x.numpy().astype(np.float64)
    assert rel_error(y.numpy(), x64 * a.numpy()) < tolerance(tf.bfloat16)
    assert da.shape == (1, 3, 1, 1) and rel_error(da.numpy(), x64.sum(axis=(0, 2, 3), keepdims=True)) < 1e-2


# -- bad arguments ----------------------------------------------------------------------------------

def bad_calls():
    x = tf.ones([4, 8])
    x4 = tf.ones([2, 3, 2, 2])
    v3 = tf.ones([3])
    return {
        "ln_epsilon_inf": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), epsilon=float("inf")), ValueError,
                           "epsilon"),
        "ln_epsilon_nan": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), epsilon=float("nan")), ValueError,
                           "epsilon"),
        "bn_epsilon_inf": (lambda: batch_norm(x4, v3, v3, float("inf")), ValueError, "epsilon"),
        "bni_epsilon_zero": (lambda: batch_norm_inference(x4, v3, v3, v3, v3, 0.0), ValueError, "epsilon"),
        "ln_relu_str": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), relu="True"), TypeError, "relu"),
        "ln_g_int_list": (lambda: layer_norm(x, [1] * 7, tf.zeros([8])), ValueError, r"g must have shape \(8,\)"),
        "ln_g_2d": (lambda: layer_norm(x, tf.ones([2, 4]), tf.zeros([8])), ValueError, r"g must have shape \(8,\)"),
        "ln_x_string": (lambda: layer_norm("x", tf.ones([8]), tf.zeros([8])), TypeError, "x must"),
        "ln_unknown_rank": (lambda: tf.function(lambda t: layer_norm(t, tf.ones([8]), tf.zeros([8])),
                                                input_signature=[tf.TensorSpec(None)])(x), ValueError,
                            "x must have a known rank"),
        "ln_unknown_features": (lambda: tf.function(lambda t: layer_norm(t, tf.ones([8]), tf.zeros([8])),
                                                    input_signature=[tf.TensorSpec([None, None])])(x), ValueError,
                                "known size on the feature axis"),
        "bn_unknown_channels": (lambda: tf.function(lambda t: batch_norm(t, v3, v3)[0],
                                                    input_signature=[tf.TensorSpec([None, None, 2, 2])])(x4),
                                ValueError, "x"),
        "cwise_neither": (lambda: cwise_linear(x4), ValueError, "a, b or both"),
        "cwise_b_size": (lambda: cwise_linear(x4, b=tf.ones([4])), ValueError, r"b must have shape \(3,\)"),
        "cwise_a_int": (lambda: cwise_linear(x4, a=tf.ones([3], tf.int32)), TypeError, "a must"),
        "cwise_x_rank1": (lambda: cwise_linear(v3, v3), ValueError, "x must have rank"),
        "dropout_seed_str": (lambda: ew.dropout(x, 0.5, seed="7"), TypeError, "seed"),
        "dropout_seed_float": (lambda: ew.dropout(x, 0.5, seed=1.5), TypeError, "seed"),
        "dropout_keep_nan": (lambda: ew.dropout(x, float("nan")), ValueError, "keep_prob"),
        "dropout_keep_vector": (lambda: ew.dropout(x, tf.constant([0.5, 0.5])), TypeError, "keep_prob"),
        "dropout_mask_broadcast": (lambda: ew.dropout(x, 0.5, tf.ones([8], tf.bool)), ValueError, "mask"),
        "float_cast_name": (lambda: ew.float_cast(x, "float8"), TypeError, "dtype"),
        "float_cast_dx_float64": (lambda: ew.float_cast(x, tf.float16, tf.float64), TypeError, "dx_dtype"),
        "add_n8_none": (lambda: ew.add_n8([x, None]), TypeError, r"xs\[1\]"),
        "add_n8_number": (lambda: ew.add_n8(3.0), TypeError, "xs must be a list"),
        "binary_none": (lambda: ew.divide(None, x), TypeError, "x must"),
        "binary_string": (lambda: ew.minimum(x, "y"), TypeError, "y must"),
        "lstm_c_int": (lambda: fused_lstm_gates(tf.ones([4, 2], tf.int32), tf.ones([4, 8])), TypeError, "c must"),
        "lstm_bias_int": (lambda: fused_lstm_gates(tf.ones([4, 2]), x, bias=tf.ones([8], tf.int32)), TypeError,
                          "bias must"),
        "lstm_bias_2d": (lambda: fused_lstm_gates(tf.ones([4, 2]), x, bias=tf.ones([2, 4])), ValueError, "bias"),
        "lstm_rank_mismatch": (lambda: fused_lstm_gates(tf.ones([4, 1, 2]), x), ValueError, "rank of h"),
        "lstm_forget_inf": (lambda: fused_lstm_gates(tf.ones([4, 2]), x, forget_bias=float("inf")), ValueError,
                            "forget_bias"),
        "lstm_five_gates": (lambda: fused_lstm_gates(tf.ones([4, 2]), *[tf.ones([4, 2])] * 5), TypeError, "gate"),
        "concat4_rank0": (lambda: concat4(*[tf.ones([])] * 4), ValueError, "x0 must have rank"),
        "split4_int": (lambda: split4(tf.ones([2, 8], tf.int32)), TypeError, "x must"),
        "name_empty": (lambda: ew.relu(x, name=""), TypeError, "name"),
    }


@pytest.mark.parametrize("case", sorted(bad_calls()))
def test_bad_arguments(case):
    assert_raises(bad_calls()[case])


GRAPH_TIME = {
    "lstm_h_width": (lambda c, h: fused_lstm_gates(c, h)[0], (4, 2), (4, 10), r"h \(the merged gates"),
    "lstm_h_vs_c": (lambda c, h: fused_lstm_gates(c, h)[0], (4, 2), (4, 12), "shape of c"),
    "split4_width": (lambda c, h: split4(h)[0], (4, 2), (4, 6), "x must have a last dimension divisible by 4"),
    "concat4_width": (lambda c, h: concat4(c, c, c, h), (4, 2), (4, 3), "x3 must have the shape of x0"),
    "add_n8_shape": (lambda c, h: ew.add_n8([c, h]), (4, 2), (4, 1), r"xs\[1\] must have the shape"),
    "dropout_mask": (lambda c, h: ew.dropout(c, 0.5, h)[0], (4, 2), (1, 2), "mask must have the shape"),
}


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("case", sorted(GRAPH_TIME))
def test_sizes_unknown_until_run_are_checked_then(case, mode):
    """A wrong size hidden until the graph runs raises InvalidArgumentError naming the argument,
    never a silent broadcast or TensorFlow's anonymous split error."""
    call, c_shape, h_shape, pattern = GRAPH_TIME[case]
    c, h = np.ones(c_shape, np.float32), np.ones(h_shape, np.float32)
    if mode == "function":
        fn = tf.function(call, input_signature=[tf.TensorSpec([None, None])] * 2)
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            fn(c, h)
        return
    with tf.Graph().as_default():
        cp, hp = (tf.compat.v1.placeholder(tf.float32, [None, None]) for _ in range(2))
        y = call(cp, hp)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
                sess.run(y, {cp: c, hp: h})
