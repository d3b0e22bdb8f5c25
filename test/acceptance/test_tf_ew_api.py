"""Acceptance: ``blocksparse.ew`` / ``blocksparse.ewops`` as the original README lists them: every
elementwise op (binary ops broadcasting), ``fused_lstm_gates`` with one or four gate tensors,
``split4``, ``concat4``, ``float_cast``, ``dropout`` (mask reuse) and ``add_n8``; values and
gradients against float64 numpy in every dtype, and bad arguments."""
import numpy as np
import pytest
import tensorflow as tf

import blocksparse.ew as ew
import blocksparse.ewops as ewops
from blocksparse import lstm
from blocksparse.testing import ew as ref
from blocksparse.testing import norms as nref
from blocksparse.testing import rel_error, tolerance
from tf_modes import assert_raises, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
UNARY = ["negative", "reciprocal", "square", "sqrt", "exp", "log", "sigmoid", "tanh", "relu", "elu"]
BINARY = ["add", "multiply", "subtract", "divide", "maximum", "minimum"]
POSITIVE = {"sqrt", "log", "reciprocal"}


def test_ewops_is_ew():
    for name in UNARY + BINARY + ["fused_lstm_gates", "split4", "concat4", "float_cast", "dropout", "add_n8"]:
        assert getattr(ewops, name) is getattr(ew, name)
    assert ew.fused_lstm_gates is lstm.fused_lstm_gates


def unary_input(rng, op, shape):
    x = rng.uniform(0.5, 2.0, shape) if op in POSITIVE else 2.0 * rng.standard_normal(shape)
    if op == "relu":   # keep away from the kink, where the float16 rounding could flip the side
        x = np.where(np.abs(x) < 0.05, 0.5, x)
    return x


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op", UNARY)
def test_unary(rng, op, dtype):
    x = unary_input(rng, op, (3, 17))
    dy = rng.standard_normal(x.shape)
    call = (lambda t: ew.elu(t, alpha=0.6)) if op == "elu" else (lambda t: getattr(ew, op)(t, name="op"))
    res = run("eager", call, [x], [dtype], [dy])
    f, df = ref.UNARY[op]
    args = (0.6,) if op == "elu" else ()
    xin = res.inputs[0]
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == [dtype.name]
    assert rel_error(res.outputs[0], f(xin, *args)) < tolerance(dtype)
    assert rel_error(res.grads[0], res.grad_ys[0] * df(xin, *args)) < tolerance(dtype)


def test_elu_default_alpha_and_positional(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    want = np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))
    assert rel_error(ew.elu(x).numpy(), want) < 1e-6
    assert rel_error(ew.elu(x, 0.3, "e").numpy(), np.where(x > 0, x, 0.3 * np.expm1(np.minimum(x, 0.0)))) < 1e-6


SHAPES = {"same": ((4, 6), (4, 6)), "row": ((4, 6), (6,)), "column": ((4, 6), (4, 1)),
          "outer": ((4, 1), (1, 6)), "scalar_tensor": ((3, 5), ()), "x_broadcast": ((6,), (2, 3, 6))}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("op", BINARY)
def test_binary_broadcasting(rng, op, shapes, dtype):
    x, y = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    if op == "divide":
        y = np.sign(y) * (0.5 + np.abs(y))
    if op in ("maximum", "minimum"):   # no ties after rounding
        y = y + 0.25
    out_shape = np.broadcast_shapes(x.shape, y.shape)
    dz = rng.standard_normal(out_shape)
    res = run("eager", getattr(ew, op), [x, y], [dtype, dtype], [dz])
    f, dfdx, dfdy = ref.BINARY[op]
    (xin, yin), dz = res.inputs, res.grad_ys[0]    # the values the op saw, rounded to dtype
    tol = tolerance(dtype)
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == [dtype.name] * 2
    assert res.outputs[0].shape == out_shape
    assert rel_error(res.outputs[0], f(xin, yin)) < tol
    for grad, terms, shape in ((res.grads[0], dz * dfdx(xin, yin), x.shape),
                               (res.grads[1], dz * dfdy(xin, yin), y.shape)):
        assert ref.unbroadcast_error(grad, terms, shape) < tol


@pytest.mark.parametrize("op", BINARY)
def test_binary_python_number_and_unknown_shapes(rng, op):
    x = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float16)
    got = getattr(ew, op)(tf.constant(x), 2.0)                 # the number takes x's dtype
    assert got.dtype == tf.float16
    f = ref.BINARY[op][0]
    assert rel_error(got.numpy(), f(x.astype(np.float64), 2.0)) < tolerance(tf.float16)
    got = getattr(ew, op)(3, tf.constant(x))
    assert rel_error(got.numpy(), f(3.0, x.astype(np.float64))) < tolerance(tf.float16)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.float32)])
    def unknown(a, b):
        return getattr(ew, op)(a, b)

    a, b = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32), rng.uniform(0.5, 2.0, 4).astype(np.float32)
    assert rel_error(unknown(a, b).numpy(), f(a.astype(np.float64), b)) < tolerance(tf.float32)


# -- LSTM gates, split4, concat4 -----------------------------------------------------------------

def lstm_case(rng, n=3, k=5):
    c = rng.standard_normal((n, k))
    h = 1.5 * rng.standard_normal((n, 4 * k))
    return c, h, 0.5 * rng.standard_normal(4 * k), rng.standard_normal((n, k)), rng.standard_normal((n, k))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("form", ["merged", "four"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_fused_lstm_gates(rng, form, with_bias, dtype):
    c, h, bias, dc, dh = lstm_case(rng)
    gates = [h] if form == "merged" else np.split(h, 4, axis=-1)
    forget_bias = 0.7
    inputs = [c, *gates] + ([bias] if with_bias else [])
    dtypes = [dtype] * (1 + len(gates)) + ([tf.float32] if with_bias else [])

    def call(c, *rest):
        kw = {"bias": rest[-1]} if with_bias else {}
        return ew.fused_lstm_gates(c, *rest[:len(gates)], forget_bias=forget_bias, **kw)

    res = run("eager", call, inputs, dtypes, [dc, dh])
    kw = {"bias": res.inputs[-1] if with_bias else None, "forget_bias": forget_bias}
    xs = res.inputs[:1 + len(gates)]
    want = nref.lstm_gates(*xs, **kw)
    want_grads = nref.lstm_gates_grad(*res.grad_ys, *xs, **kw)
    tol = tolerance(dtype)
    assert res.out_dtypes == [dtype.name] * 2
    for got, exp in zip(res.outputs, want):
        assert rel_error(got, exp) < tol
    for got, exp in zip(res.grads, [g for g in want_grads if g is not None]):
        assert rel_error(got, exp) < tol
    if with_bias:
        assert res.grad_dtypes[-1] == "float32"


def test_fused_lstm_gates_defaults_and_modes(rng):
    """forget_bias defaults to 1.0; unknown minibatch inside tf.function and in a v1 graph."""
    c, h, _, dc, dh = lstm_case(rng, n=4, k=3)
    for mode in ("function", "graph"):
        res = run(mode, ew.fused_lstm_gates, [c, h], [tf.float32, tf.float32], [dc, dh], unknown={0: (0,), 1: (0,)})
        for got, exp in zip(res.outputs, nref.lstm_gates(*res.inputs)):
            assert rel_error(got, exp) < tolerance(tf.float32)
        for got, exp in zip(res.grads, nref.lstm_gates_grad(*res.grad_ys, *res.inputs)):
            assert rel_error(got, exp) < tolerance(tf.float32)


def test_fused_lstm_gates_rank3_and_only_h_used(rng):
    c = rng.standard_normal((2, 3, 4)).astype(np.float32)
    h = rng.standard_normal((2, 3, 16)).astype(np.float32)
    ct, ht = tf.constant(c), tf.constant(h)
    with tf.GradientTape() as tape:
        tape.watch([ct, ht])
        _, h_next = ew.fused_lstm_gates(ct, ht)
        loss = tf.reduce_sum(h_next)
    dcg, dhg = tape.gradient(loss, [ct, ht])   # c_next unused: its gradient is absent
    dc_ref, dh_ref, _ = nref.lstm_gates_grad(np.zeros_like(c), np.ones_like(c), c, h)
    assert rel_error(dcg.numpy(), dc_ref) < 1e-5 and rel_error(dhg.numpy(), dh_ref) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_split4_concat4(rng, dtype):
    x = rng.standard_normal((3, 20))
    res = run("eager", lambda t: ew.split4(t), [x], [dtype], [rng.standard_normal((3, 5))] * 4)
    xin = res.inputs[0]
    for n, part in enumerate(res.outputs):
        assert np.array_equal(part, xin[:, 5 * n:5 * (n + 1)])
    assert np.array_equal(res.grads[0], np.concatenate(res.grad_ys, axis=1))
    parts = [rng.standard_normal((2, 3, 5)) for _ in range(4)]
    dz = rng.standard_normal((2, 3, 20))
    res = run("eager", ew.concat4, parts, [dtype] * 4, [dz])
    assert np.array_equal(res.outputs[0], np.concatenate(res.inputs, axis=-1))
    for n, grad in enumerate(res.grads):
        assert np.array_equal(grad, res.grad_ys[0][..., 5 * n:5 * (n + 1)])
    merged = tf.constant(rng.standard_normal((2, 8)), dtype)
    assert np.array_equal(ew.concat4(*ew.split4(merged)).numpy(), merged.numpy())


# -- float_cast, dropout, add_n8 ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("dx_dtype", [None, tf.float16, tf.bfloat16], ids=["dx_default", "dx_fp16", "dx_bf16"])
def test_float_cast(rng, dtype, dx_dtype):
    x = rng.standard_normal((4, 7))
    dy = rng.standard_normal((4, 7)) * 1.001
    res = run("eager", lambda t: ew.float_cast(t, dtype, dx_dtype=dx_dtype), [x], [tf.float32], [dy])
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == ["float32"]
    want = tf.cast(tf.constant(res.inputs[0], tf.float32), dtype).numpy().astype(np.float64)
    assert np.array_equal(res.outputs[0], want)
    dy_in = res.grad_ys[0]   # dy as the op saw it (in dtype)
    rounded = dy_in if dx_dtype is None else tf.cast(tf.constant(dy_in, tf.float32), dx_dtype).numpy()
    assert np.array_equal(res.grads[0], np.asarray(rounded, np.float64))


def test_float_cast_positional_and_numpy_dtype(rng):
    x = tf.constant(rng.standard_normal((2, 3)), tf.bfloat16)
    assert ew.float_cast(x, np.float16).dtype == tf.float16
    assert ew.float_cast(x, "float32", "float16").dtype == tf.float32
    assert ew.float_cast(x, tf.bfloat16).dtype == tf.bfloat16


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("keep_prob", [0.8, 0.3, 1.0])
def test_dropout_and_mask_reuse(rng, dtype, keep_prob):
    x = tf.constant(rng.standard_normal((64, 33)) + 3.0, dtype)    # no zeros in x: the mask shows in y
    dy = tf.constant(rng.standard_normal((64, 33)), dtype)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y, mask = ew.dropout(x, keep_prob=keep_prob) if keep_prob != 0.8 else ew.dropout(x)
        y2, mask2 = ew.dropout(x, keep_prob, mask)                  # positional, the same mask
    assert y.dtype == dtype and mask.dtype == tf.bool and mask.shape == x.shape
    m = mask.numpy()
    x64 = x.numpy().astype(np.float64)
    assert rel_error(y.numpy(), ref.dropout(x64, m, keep_prob)) < tolerance(dtype)
    assert np.array_equal((y.numpy() != 0), m)
    assert np.array_equal(y2.numpy(), y.numpy()) and np.array_equal(mask2.numpy(), m)
    dx = tape.gradient(y, x, output_gradients=dy)
    assert dx.dtype == dtype
    assert rel_error(dx.numpy(), ref.dropout(dy.numpy().astype(np.float64), m, keep_prob)) < tolerance(dtype)
    frac = m.mean()
    # TensorFlow's own generator draws the mask (no test seed replays it): 6 sigma, ~2e-9 a case
    assert abs(frac - keep_prob) < 6 * np.sqrt(keep_prob * (1 - keep_prob) / m.size) + 1e-9


def test_dropout_in_graph_with_unknown_shape_and_tensor_keep_prob(rng):
    x0 = rng.standard_normal((5, 6)).astype(np.float32) + 3.0
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6])
        kp = tf.compat.v1.placeholder(tf.float32, [])
        y, mask = ew.dropout(x, keep_prob=kp)
        y2, _ = ew.dropout(x * 2.0, kp, mask=mask)
        with tf.compat.v1.Session() as sess:
            yv, mv, y2v = sess.run([y, mask, y2], {x: x0, kp: 0.5})
            with pytest.raises(tf.errors.InvalidArgumentError, match="keep_prob"):
                sess.run(y, {x: x0, kp: 0.0})
    assert rel_error(yv, ref.dropout(x0, mv, 0.5)) < 1e-6
    assert rel_error(y2v, ref.dropout(2.0 * x0, mv, 0.5)) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("count", [1, 3, 8])
def test_add_n8(rng, dtype, count):
    xs = [rng.standard_normal((3, 9)) for _ in range(count)]
    dz = rng.standard_normal((3, 9))
    res = run("eager", lambda *t: ew.add_n8(list(t)), xs, [dtype] * count, [dz])
    assert res.out_dtypes == [dtype.name]
    assert rel_error(res.outputs[0], np.sum(res.inputs, axis=0)) < tolerance(dtype)
    for grad in res.grads:
        assert rel_error(grad, res.grad_ys[0]) < tolerance(dtype)
    assert ew.add_n8(tuple(tf.constant(x, dtype) for x in xs), name="sum").shape == (3, 9)


def bad_calls():
    x = tf.ones([2, 8])
    return {
        "binary_dtypes": (lambda: ew.add(tf.ones([2, 8], tf.bfloat16), tf.ones([2, 8], tf.float16)), TypeError,
                          "same dtype"),
        "binary_shapes": (lambda: ew.multiply(x, tf.ones([3])), ValueError, "broadcast"),
        "binary_int": (lambda: ew.maximum(tf.ones([2], tf.int32), tf.ones([2], tf.int32)), TypeError, "x must"),
        "unary_int": (lambda: ew.tanh(tf.ones([2], tf.int32)), TypeError, "x must have dtype"),
        "unary_float64": (lambda: ew.exp(tf.ones([2], tf.float64)), TypeError, "x must have dtype"),
        "elu_alpha": (lambda: ew.elu(x, alpha="big"), TypeError, "alpha"),
        "lstm_two_gates": (lambda: ew.fused_lstm_gates(x, x, x), TypeError, "gate"),
        "lstm_no_gates": (lambda: ew.fused_lstm_gates(x), TypeError, "gate"),
        "lstm_width": (lambda: ew.fused_lstm_gates(tf.ones([2, 2]), tf.ones([2, 12])), ValueError, "shape of c"),
        "lstm_not_4": (lambda: ew.fused_lstm_gates(tf.ones([2, 2]), tf.ones([2, 10])), ValueError, "divisible by 4"),
        "lstm_bias": (lambda: ew.fused_lstm_gates(tf.ones([2, 2]), x, bias=tf.ones([4])), ValueError, "bias"),
        "lstm_forget_bias": (lambda: ew.fused_lstm_gates(tf.ones([2, 2]), x, forget_bias=None), TypeError,
                             "forget_bias"),
        "lstm_dtypes": (lambda: ew.fused_lstm_gates(tf.ones([2, 2], tf.float16), x), TypeError, "same dtype"),
        "lstm_four_shapes": (lambda: ew.fused_lstm_gates(tf.ones([2, 2]), *[tf.ones([2, 2])] * 3, tf.ones([2, 3])),
                             ValueError, "o must have the shape of c"),
        "split4_width": (lambda: ew.split4(tf.ones([2, 6])), ValueError, "divisible by 4"),
        "concat4_shapes": (lambda: ew.concat4(x, x, x, tf.ones([2, 7])), ValueError, "x3 must have the shape"),
        "concat4_dtypes": (lambda: ew.concat4(x, x, tf.ones([2, 8], tf.float16), x), TypeError, "same dtype"),
        "float_cast_int": (lambda: ew.float_cast(x, tf.int32), TypeError, "dtype"),
        "float_cast_dx": (lambda: ew.float_cast(x, tf.float16, dx_dtype=tf.float64), TypeError, "dx_dtype"),
        "dropout_keep_0": (lambda: ew.dropout(x, keep_prob=0.0), ValueError, "keep_prob"),
        "dropout_keep_big": (lambda: ew.dropout(x, keep_prob=1.5), ValueError, "keep_prob"),
        "dropout_keep_str": (lambda: ew.dropout(x, keep_prob="0.5"), TypeError, "keep_prob"),
        "dropout_mask_shape": (lambda: ew.dropout(x, 0.5, mask=tf.ones([2, 7], tf.bool)), ValueError, "mask"),
        "dropout_mask_str": (lambda: ew.dropout(x, 0.5, mask=tf.constant(["a"])), TypeError, "mask"),
        "add_n8_nine": (lambda: ew.add_n8([x] * 9), ValueError, "1 to 8"),
        "add_n8_empty": (lambda: ew.add_n8([]), ValueError, "1 to 8"),
        "add_n8_tensor": (lambda: ew.add_n8(x), TypeError, "xs must be a list"),
        "add_n8_shapes": (lambda: ew.add_n8([x, tf.ones([2, 7])]), ValueError, r"xs\[1\]"),
        "add_n8_dtypes": (lambda: ew.add_n8([x, tf.ones([2, 8], tf.bfloat16)]), TypeError, r"xs\[1\]"),
        "name_type": (lambda: ew.add(x, x, name=3), TypeError, "name"),
    }


@pytest.mark.parametrize("case", sorted(bad_calls()))
def test_bad_arguments(case):
    assert_raises(bad_calls()[case])


@pytest.mark.parametrize("size", [1, 12], ids=["size1_broadcastable", "size12"])
def test_lstm_bias_size_checked_at_run_time(size):
    @tf.function(input_signature=[tf.TensorSpec([None])])
    def gates(bias):
        return ew.fused_lstm_gates(tf.ones([2, 4]), tf.ones([2, 16]), bias=bias)

    assert gates(tf.zeros([16]))[0].shape == (2, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias must have shape"):
        gates(tf.zeros([size]))
