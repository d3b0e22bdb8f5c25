"""blocksparse.ew (and blocksparse.ewops): values and gradients against float64 numpy, in every
execution mode and dtype; float_cast, dropout, add_n8; bad arguments."""
import numpy as np
import pytest
import tensorflow as tf

import blocksparse.ew as ew
from blocksparse._tf.ew.math import NATIVE
from blocksparse.testing import rel_error, tolerance
from blocksparse.testing import ew as ref
from tf_modes import MODES, assert_raises, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
#: ops whose input must be positive
POSITIVE = {"sqrt", "log", "reciprocal"}
#: ops with a parameter, and the value to test it with
PARAMS = {"elu": 0.7, "gelu": 0.044715, "swish": 1.3}
UNARY = sorted(ref.UNARY)


def unary_input(rng, op, shape):
    if op in POSITIVE:
        return rng.uniform(0.5, 2.0, shape)
    return rng.standard_normal(shape) * 2.0


def call_unary(op):
    fn = getattr(ew, op)
    return (lambda x: fn(x, PARAMS[op])) if op in PARAMS else fn


def check_unary(op, res, dtype):
    f, df = ref.UNARY[op]
    params = (PARAMS[op],) if op in PARAMS else ()
    x, dy = res.inputs[0], res.grad_ys[0]
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == [dtype.name]
    tol = tolerance(dtype)
    assert rel_error(res.outputs[0], f(x, *params)) < tol, "value"
    assert rel_error(res.grads[0], dy * df(x, *params)) < tol, "gradient"


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op", UNARY)
def test_unary_eager(rng, op, dtype):
    x = unary_input(rng, op, (5, 33))
    res = run("eager", call_unary(op), [x], [dtype], [rng.standard_normal(x.shape)])
    check_unary(op, res, dtype)


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("op", UNARY)
def test_unary_graph_modes(rng, op, mode):
    x = unary_input(rng, op, (6, 7))
    dtype = tf.bfloat16 if op in ("relu", "gelu") else tf.float32
    res = run(mode, call_unary(op), [x], [dtype], [rng.standard_normal(x.shape)], unknown={0: (0,)})
    check_unary(op, res, dtype)


SHAPES = {"same": ((4, 6), (4, 6)), "row": ((4, 6), (6,)), "outer": ((4, 1), (1, 6)),
          "scalar": ((3, 5), ())}


def check_binary(op, res, dtype):
    f, dfdx, dfdy = ref.BINARY[op]
    x, y = res.inputs
    dz = res.grad_ys[0]
    tol = tolerance(dtype)
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == [dtype.name] * 2
    assert rel_error(res.outputs[0], f(x, y)) < tol
    # a broadcast operand's gradient is a sum, measured against the magnitude of its terms
    assert ref.unbroadcast_error(res.grads[0], dz * dfdx(x, y), x.shape) < tol
    assert ref.unbroadcast_error(res.grads[1], dz * dfdy(x, y), y.shape) < tol


def binary_inputs(rng, op, shapes):
    x, y = (rng.standard_normal(s) for s in shapes)
    if op == "divide":
        y = np.sign(y) * (np.abs(y) + 0.5)  # keep away from 0
    return x, y


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("op", sorted(ref.BINARY))
def test_binary_eager(rng, op, shapes, dtype):
    x, y = binary_inputs(rng, op, shapes)
    dz = rng.standard_normal(np.broadcast_shapes(x.shape, y.shape))
    res = run("eager", getattr(ew, op), [x, y], [dtype, dtype], [dz])
    check_binary(op, res, dtype)


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("op", sorted(ref.BINARY))
def test_binary_graph_modes(rng, op, mode):
    x, y = binary_inputs(rng, op, ((5, 6), (6,)))
    res = run(mode, getattr(ew, op), [x, y], [tf.float16] * 2, [rng.standard_normal(x.shape)],
              unknown={0: (0,)})
    check_binary(op, res, tf.float16)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_gelu_gradient_is_finite_for_huge_inputs(dtype):
    """The cube of |x| > 1e13 overflows float32: the gradient was inf * 0 = NaN there."""
    x = tf.constant([-1e30, -1e20, -1e13, -50.0, 50.0, 1e13, 1e20, 1e30], dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ew.gelu(x)
    grad = tf.cast(tape.gradient(y, x), tf.float64).numpy()
    np.testing.assert_array_equal(grad, [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(tf.cast(y, tf.float64).numpy()[4:], tf.cast(x, tf.float64).numpy()[4:])


def test_python_number_takes_the_tensors_dtype(rng):
    x = tf.constant(rng.standard_normal((3, 4)), tf.bfloat16)
    for z in (ew.add(x, 2.0), ew.multiply(0.5, x), ew.maximum(x, 0), ew.divide(1.0, ew.add(x, 10.0))):
        assert z.dtype == tf.bfloat16
    expect = np.asarray(tf.cast(x, tf.float64)) * 0.5
    assert rel_error(tf.cast(ew.multiply(0.5, x), tf.float64), expect) < tolerance(tf.bfloat16)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_python_number_is_not_rounded_to_16_bits(rng, dtype):
    """A number beside a 16-bit tensor enters the float32 computation as given: the result is
    rounded once, not the number first (1e5 in float16 is inf; 1e-8 is 0 in float16)."""
    x = tf.constant([3.0, 1000.0, -7.5], dtype)
    x64 = np.asarray(tf.cast(x, tf.float64))
    for got, want in ((ew.divide(x, 1e5), x64 / 1e5), (ew.multiply(x, 1e-6), x64 * 1e-6),
                      (ew.divide(3e4, x), 3e4 / x64), (ew.add(x, 1e-3), x64 + 1e-3), (ew.subtract(0.3, x), 0.3 - x64)):
        assert got.dtype == dtype
        want16 = np.asarray(tf.cast(tf.constant(want, tf.float32), dtype), dtype=np.float64)
        np.testing.assert_array_equal(np.asarray(tf.cast(got, tf.float64)), want16)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ew.multiply(x, 1e-3)
    grad = tape.gradient(y, x, output_gradients=tf.ones_like(x))
    assert grad.dtype == dtype and rel_error(tf.cast(grad, tf.float64), np.full(3, 1e-3)) < tolerance(dtype)


@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_lists_and_numpy_arrays_take_the_tensors_dtype(rng, dt):
    """As TensorFlow's own ops convert them: a list or numpy operand (float64 included) beside a
    tensor takes its dtype, broadcast, on either side; its gradient reaches the tensor."""
    dtype = DTYPES[dt]
    x = tf.constant(rng.standard_normal((3, 4)), dtype)
    x64 = np.asarray(tf.cast(x, tf.float64))
    row, col = rng.standard_normal(4), rng.standard_normal((3, 1))
    den, ints = row.astype(np.float32) + 3.0 * np.sign(row), [[0, 1, 0, 1]]
    cases = ((ew.add(x, row.tolist()), x64 + row), (ew.subtract(col, x), col - x64),
             (ew.multiply(x, np.float64(1.5)), x64 * 1.5), (ew.maximum(ints, x), np.maximum(ints, x64)),
             (ew.divide(x, den), x64 / den))
    for got, want in cases:
        assert got.dtype == dtype and got.shape == want.shape
        assert rel_error(tf.cast(got, tf.float64), want) < tolerance(dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ew.multiply(row.tolist(), x)
    grad = tape.gradient(y, x, output_gradients=tf.ones_like(x))
    assert grad.dtype == dtype and rel_error(tf.cast(grad, tf.float64), np.broadcast_to(row, (3, 4))) < tolerance(dtype)
    with pytest.raises(TypeError, match="y must be a tensor or real numbers"):
        ew.add(x, ["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="x and y must have shapes that broadcast"):
        ew.add(x, [1.0, 2.0, 3.0])


@pytest.mark.parametrize("dt", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", MODES)
def test_float32_bias_and_gain_beside_16bit_activations(rng, dt, mode):
    """As the original's bias / gain ops took them: a float32 tensor beside a 16-bit one is added or
    multiplied in float32 and rounded once to the 16-bit dtype; its gradient comes back float32."""
    dtype = DTYPES[dt]
    x64, b64, g64, dz = (rng.standard_normal(s) for s in ((5, 8), (8,), (1, 8), (5, 8)))
    res = run(mode, lambda x, b, g: ew.multiply(g, ew.add(x, b)), [x64, b64, g64], [dtype, tf.float32, tf.float32],
              [dz])
    x, b, g = res.inputs
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == [dtype.name, "float32", "float32"]
    assert rel_error(res.outputs[0], g * (x + b)) < tolerance(dtype)
    dy = res.grad_ys[0]
    z = tf.cast(tf.cast(tf.constant(x + b, tf.float32), dtype), tf.float64).numpy()  # the sum as the product saw it
    for got, want in zip(res.grads, (dy * g, (dy * g).sum(0), (dy * z).sum(0, keepdims=True))):
        assert rel_error(got, want) < tolerance(dtype)
    with pytest.raises(TypeError, match="same dtype"):
        ew.add(tf.ones([2], tf.float16), tf.ones([2], tf.bfloat16))


def test_fast_gelu_is_swish_1702(rng):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    assert rel_error(ew.fast_gelu(x), ref.UNARY["swish"][0](x.astype(np.float64), 1.702)) < 1e-6


def test_low_precision_is_rounded_once(rng):
    """gelu of bfloat16 computed in float32 and rounded once: within half an ulp of bfloat16."""
    x = tf.cast(tf.constant(rng.standard_normal(4096) * 3), tf.bfloat16)
    x64 = np.asarray(tf.cast(x, tf.float64))
    got = np.asarray(tf.cast(ew.gelu(x), tf.float64))
    want = ref.UNARY["gelu"][0](x64, 0.044715)
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - 7)
    assert np.all(np.abs(got - want) <= 0.5 * ulp + 1e-30)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("op", sorted(NATIVE))
def test_native_ops_equal_float32_rounded_once(rng, op, dtype):
    """The ops run in the input's dtype give exactly the float32 result rounded to it."""
    x, y = (tf.cast(tf.constant(rng.standard_normal((64, 64)) * 100), dtype) for _ in range(2))
    operands = (x, y) if op in ref.BINARY else (x,)
    got = getattr(ew, op)(*operands)
    want = tf.cast(getattr(ew, op)(*(tf.cast(t, tf.float32) for t in operands)), dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy())


def test_xla(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)

    @tf.function(jit_compile=True)
    def f(x):
        return ew.add(ew.gelu(x), ew.multiply(x, 2.0)), ew.add_n8([x, x, x])

    y, s = f(x)
    x64 = x.astype(np.float64)
    assert rel_error(y, ref.UNARY["gelu"][0](x64, 0.044715) + 2 * x64) < 1e-5
    assert rel_error(s, 3 * x64) < 1e-6


def test_ewops_is_ew():
    import blocksparse.ewops as ewops

    assert sorted(ewops.__all__) == sorted(ew.__all__)
    assert all(getattr(ewops, name) is getattr(ew, name) for name in ew.__all__)


# ------------------------------------------------------------------------- float_cast

CASTS = [("fp32", "fp16", None), ("fp16", "fp32", None), ("fp32", "bf16", "fp32"),
         ("fp32", "fp32", "bf16"), ("bf16", "fp32", "fp16")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("src, dst, dx", CASTS, ids=[f"{a}-to-{b}-dx-{c}" for a, b, c in CASTS])
def test_float_cast(rng, src, dst, dx, mode):
    src_t, dst_t = DTYPES[src], DTYPES[dst]
    dx_t = src_t if dx is None else DTYPES[dx]
    x = rng.standard_normal((5, 6)) * 10
    dy = rng.standard_normal((5, 6)) * 1000.0 + rng.standard_normal((5, 6))  # needs many bits
    res = run(mode, lambda x: ew.float_cast(x, dst_t, dx_dtype=None if dx is None else dx_t),
              [x], [src_t], [dy], unknown={0: (0,)})
    assert res.out_dtypes == [dst_t.name] and res.grad_dtypes == [src_t.name]
    want_y = np.asarray(tf.cast(tf.constant(res.inputs[0]), dst_t), dtype=np.float64)
    np.testing.assert_array_equal(res.outputs[0], want_y)
    # dy is rounded to dst (the output's dtype), then to dx_dtype, then to x's dtype
    rounded = tf.cast(tf.cast(tf.constant(res.grad_ys[0]), dx_t), src_t)
    np.testing.assert_array_equal(res.grads[0], np.asarray(tf.cast(rounded, tf.float64)))


def test_float_cast_same_dtype_is_identity(rng):
    x = tf.constant(rng.standard_normal(4), tf.float16)
    y = ew.float_cast(x, "float16")
    assert y.dtype == tf.float16 and np.array_equal(y.numpy(), x.numpy())


# ------------------------------------------------------------------------- dropout

@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_dropout_values_and_gradient(rng, dtype):
    x = tf.cast(tf.constant(rng.standard_normal((64, 50))), dtype)
    dy = tf.cast(tf.constant(rng.standard_normal((64, 50))), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y, mask = ew.dropout(x, keep_prob=0.7)
    dx = tape.gradient(y, x, output_gradients=dy)
    assert y.dtype == dtype and dx.dtype == dtype and mask.dtype == tf.bool
    m = mask.numpy()
    assert rel_error(tf.cast(y, tf.float64), ref.dropout(tf.cast(x, tf.float64), m, 0.7)) < tolerance(dtype)
    assert rel_error(tf.cast(dx, tf.float64), ref.dropout(tf.cast(dy, tf.float64), m, 0.7)) < tolerance(dtype)
    # 3200 Bernoulli(0.7) draws: the kept fraction is within 5 standard deviations of 0.7
    assert abs(m.mean() - 0.7) < 5 * np.sqrt(0.7 * 0.3 / m.size)


def test_dropout_mask_is_reusable(rng):
    x = tf.constant(rng.standard_normal((32, 40)), tf.float32)
    y1, mask = ew.dropout(x, keep_prob=0.5)
    y2, mask2 = ew.dropout(x, keep_prob=0.5, mask=mask)
    assert np.array_equal(y1.numpy(), y2.numpy()) and np.array_equal(mask.numpy(), mask2.numpy())
    # a 0/1 float mask works the same, and another input gets the same elements dropped
    y3, _ = ew.dropout(2.0 * x, keep_prob=0.5, mask=tf.cast(mask, tf.float32))
    np.testing.assert_allclose(y3.numpy(), 2.0 * y1.numpy(), rtol=1e-6)


def test_dropout_is_seeded_like_tensorflow(rng):
    x = tf.ones([16, 16])
    tf.random.set_seed(1234)
    first = ew.dropout(x, 0.5, seed=7)[1].numpy()
    tf.random.set_seed(1234)
    again = ew.dropout(x, 0.5, seed=7)[1].numpy()
    other = ew.dropout(x, 0.5, seed=8)[1].numpy()
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_dropout_keep_all(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y, mask = ew.dropout(x, keep_prob=1.0)
    assert np.array_equal(y.numpy(), x) and mask.numpy().all()


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_dropout_graph_modes(rng, mode):
    x = rng.standard_normal((20, 8))
    dy = rng.standard_normal((20, 8))
    res = run(mode, lambda x: ew.dropout(x, keep_prob=tf.constant(0.6))[0], [x], [tf.float32], [dy],
              unknown={0: (0,)})
    kept = res.outputs[0] != 0  # x is never exactly 0
    assert 0 < kept.mean() < 1
    assert rel_error(res.outputs[0], ref.dropout(res.inputs[0], kept, 0.6)) < 1e-6
    assert rel_error(res.grads[0], ref.dropout(dy, kept, 0.6)) < 1e-6


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_dropout_keep_prob_keras_variable_under_mixed_precision(rng, policy):
    """A float32 Keras variable read inside a layer under a mixed policy arrives in the compute
    dtype: taken as float32 (its rounding), the mask's kept fraction and the scale agree."""
    import keras

    class Drop(keras.layers.Layer):
        def build(self, shape):
            self.kp = self.add_weight(shape=(), initializer=keras.initializers.Constant(0.75), trainable=False,
                                      dtype="float32")

        def call(self, x):
            return ew.dropout(x, keep_prob=self.kp)

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        x = rng.standard_normal((64, 64)).astype(np.float32) + 3.0
        y, mask = Drop()(x)
    finally:
        keras.mixed_precision.set_global_policy(before)
    kept = mask.numpy().astype(bool)
    scale = float(tf.cast(tf.cast(0.75, y.dtype), tf.float32))
    want = np.where(kept, x.astype(y.dtype.as_numpy_dtype).astype(np.float64) / scale, 0.0)
    assert y.dtype.name == policy.split("_")[1] and 0.65 < kept.mean() < 0.85
    assert rel_error(tf.cast(y, tf.float64).numpy(), want) < tolerance(y.dtype.name)


def test_dropout_keep_prob_checked_when_the_graph_runs():
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float32, [])
        y, _ = ew.dropout(tf.ones([4]), keep_prob=p)
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {p: 0.5}).shape == (4,)
            with pytest.raises(tf.errors.InvalidArgumentError, match="keep_prob"):
                sess.run(y, {p: 1.5})
    with tf.Graph().as_default():  # a shape unknown until run time: a vector is refused then
        p = tf.compat.v1.placeholder(tf.float32, None)
        y, _ = ew.dropout(tf.ones([4]), keep_prob=p)
        assert y.shape == (4,)
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {p: 0.5}).shape == (4,)
            with pytest.raises(tf.errors.InvalidArgumentError, match="keep_prob must be a scalar"):
                sess.run(y, {p: [0.5, 1.0, 0.25, 0.1]})


# ------------------------------------------------------------------------- add_n8

@pytest.mark.parametrize("count", [1, 2, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_add_n8(rng, count, dtype):
    xs = [rng.standard_normal((6, 10)) for _ in range(count)]
    dz = rng.standard_normal((6, 10))
    res = run("eager", lambda *xs: ew.add_n8(list(xs)), xs, [dtype] * count, [dz])
    assert res.out_dtypes == [dtype.name]
    assert rel_error(res.outputs[0], sum(res.inputs)) < tolerance(dtype)
    for g in res.grads:
        np.testing.assert_array_equal(g, res.grad_ys[0])


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_add_n8_graph_modes(rng, mode):
    xs = [rng.standard_normal((4, 3)) for _ in range(3)]
    res = run(mode, lambda *xs: ew.add_n8(list(xs)), xs, [tf.float32] * 3, [np.ones((4, 3))],
              unknown={i: (0,) for i in range(3)})
    assert rel_error(res.outputs[0], sum(res.inputs)) < 1e-6


def test_add_n8_unknown_shape_mismatch_is_caught_when_the_graph_runs():
    with tf.Graph().as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None, 3])
        b = tf.compat.v1.placeholder(tf.float32, [None, 3])
        z = ew.add_n8([a, b])
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"xs\[1\]"):
                sess.run(z, {a: np.ones((2, 3)), b: np.ones((4, 3))})


# ------------------------------------------------------------------------- bad arguments

BAD = {
    "binary-dtypes": (lambda: ew.add(tf.ones([2], tf.bfloat16), tf.ones([2], tf.float16)), TypeError, "x and y"),
    "binary-shapes": (lambda: ew.multiply(tf.ones([2, 3]), tf.ones([4])), ValueError, "broadcast"),
    "int-input": (lambda: ew.exp(tf.constant([1, 2])), TypeError, "x must have dtype"),
    "float64-input": (lambda: ew.relu(tf.constant([1.0], tf.float64)), TypeError, "x must have dtype"),
    "elu-alpha": (lambda: ew.elu(tf.ones([2]), alpha="1"), TypeError, "alpha"),
    "swish-alpha-nan": (lambda: ew.swish(tf.ones([2]), alpha=float("nan")), ValueError, "alpha"),
    "name": (lambda: ew.tanh(tf.ones([2]), name=3), TypeError, "name"),
    "cast-dtype": (lambda: ew.float_cast(tf.ones([2]), tf.int32), TypeError, "dtype"),
    "cast-dx-dtype": (lambda: ew.float_cast(tf.ones([2]), tf.float16, dx_dtype="float64"), TypeError,
                      "dx_dtype"),
    "keep-prob-zero": (lambda: ew.dropout(tf.ones([2]), keep_prob=0.0), ValueError, "keep_prob"),
    "keep-prob-big": (lambda: ew.dropout(tf.ones([2]), keep_prob=1.5), ValueError, "keep_prob"),
    "keep-prob-str": (lambda: ew.dropout(tf.ones([2]), keep_prob="0.5"), TypeError, "keep_prob"),
    "keep-prob-tensor": (lambda: ew.dropout(tf.ones([2]), keep_prob=tf.constant(2.0)), ValueError, "keep_prob"),
    "mask-shape": (lambda: ew.dropout(tf.ones([2, 3]), mask=tf.ones([3, 2], tf.bool)), ValueError, "mask"),
    "mask-dtype": (lambda: ew.dropout(tf.ones([2]), mask=tf.constant(["a", "b"])), TypeError, "mask"),
    "add-n8-nine": (lambda: ew.add_n8([tf.ones([2])] * 9), ValueError, "1 to 8"),
    "add-n8-empty": (lambda: ew.add_n8([]), ValueError, "1 to 8"),
    "add-n8-tensor": (lambda: ew.add_n8(tf.ones([2, 2])), TypeError, "list"),
    "add-n8-dtypes": (lambda: ew.add_n8([tf.ones([2]), tf.ones([2], tf.bfloat16)]), TypeError, r"xs\[1\]"),
    "add-n8-shapes": (lambda: ew.add_n8([tf.ones([2]), tf.ones([3])]), ValueError, r"xs\[1\]"),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_bad_arguments(case):
    assert_raises(case)


def test_bad_arguments_in_graph_mode():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        with pytest.raises(ValueError, match="broadcast"):
            ew.add(x, tf.ones([4]))
        with pytest.raises(TypeError, match="x and y"):
            ew.maximum(tf.cast(x, tf.float16), tf.ones([3], tf.bfloat16))


def test_square_float16_gradient_rounds_once(rng):
    """d(x^2) = 2 x dy computed in float32 and rounded once: no float16 overflow of 2 x where the
    product is representable (x = 40000: 2 x overflows float16, 2 x * 1e-3 does not)."""
    x = tf.constant([40000.0, -3.0, 0.5], tf.float16)
    dy = tf.constant([1e-3, 2.0, -1.0], tf.float16)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ew.square(x)
    dx = tape.gradient(y, x, output_gradients=dy)
    want = (2.0 * x.numpy().astype(np.float64) * dy.numpy().astype(np.float64)).astype(np.float16)
    assert dx.dtype == tf.float16 and np.array_equal(dx.numpy(), want)
    assert np.isinf(y.numpy()[0]) and np.array_equal(y.numpy()[1:], np.float16([9.0, 0.25]))
