"""blocksparse.lstm (and ew) fused_lstm_gates, split4, concat4: values and gradients against
float64 numpy, merged and four-tensor forms, bias, every dtype and execution mode; bad arguments."""
import numpy as np
import pytest
import tensorflow as tf

import blocksparse.ew as ew
from blocksparse.lstm import concat4, fused_lstm_gates, split4
from blocksparse.testing import norms as ref
from blocksparse.testing import rel_error, tolerance
from tf_modes import MODES, assert_raises, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}


def gates_case(rng, shape, bias):
    """c, the four gates (..., K), and a bias (4K,) or None."""
    k = shape[-1]
    c = rng.standard_normal(shape)
    gates = [rng.standard_normal(shape) * 2 for _ in range(4)]
    return c, gates, (rng.standard_normal(4 * k) if bias else None)


def check(res, gates_merged, forget_bias, dtypes, with_bias, grads_of):
    """``res``: a run of ``(c, gates...)`` (+ bias); ``grads_of``: which outputs got gradients."""
    c, gates = res.inputs[0], res.inputs[1:2] if gates_merged else res.inputs[1:5]
    bias = res.inputs[-1] if with_bias else None
    tol = tolerance(dtypes[0])
    assert res.out_dtypes == [dtypes[0].name] * 2 and res.grad_dtypes == [d.name for d in dtypes]
    for got, want in zip(res.outputs, ref.lstm_gates(c, *gates, bias=bias, forget_bias=forget_bias)):
        assert rel_error(got, want) < tol
    dc_next, dh_next = (g if use else np.zeros_like(c) for g, use in zip(res.grad_ys, grads_of))
    want = ref.lstm_gates_grad(dc_next, dh_next, c, *gates, bias=bias, forget_bias=forget_bias)
    dc, dgates, dbias = want[0], want[1:-1], want[-1]
    for what, got, w in zip(["dc", "dgates"] + ["dgates"] * 3 + ["dbias"], res.grads,
                            [dc, *dgates] + ([dbias] if with_bias else [])):
        assert rel_error(got, w) < tol, what


GRADS = {"both": (True, True), "h-only": (False, True), "c-only": (True, False)}


@pytest.mark.parametrize("grads_of", GRADS.values(), ids=GRADS.keys())
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_lstm_gates_eager(rng, dtype, merged, bias, grads_of):
    c, gates, b = gates_case(rng, (9, 24), bias)
    forget_bias = float(rng.uniform(0.0, 2.0))
    inputs = [c] + ([np.concatenate(gates, axis=-1)] if merged else gates) + ([b] if bias else [])
    dtypes = [dtype] * (len(inputs) - bias) + ([tf.float32] if bias else [])

    def fn(c, *rest):
        gate_args, b = (rest[:-1], rest[-1]) if bias else (rest, None)
        return fused_lstm_gates(c, *gate_args, bias=b, forget_bias=forget_bias)

    grad_ys = [rng.standard_normal(c.shape) if use else None for use in grads_of]
    res = run("eager", fn, inputs, dtypes, grad_ys)
    check(res, merged, forget_bias, dtypes, bias, grads_of)


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
def test_lstm_gates_graph_modes(rng, merged, mode):
    c, gates, b = gates_case(rng, (6, 16), True)
    inputs = [c] + ([np.concatenate(gates, axis=-1)] if merged else gates) + [b]
    dtypes = [tf.float16] * (len(inputs) - 1) + [tf.float32]

    def fn(c, *rest):
        return fused_lstm_gates(c, *rest[:-1], bias=rest[-1], forget_bias=1.0)

    res = run(mode, fn, inputs, dtypes, [rng.standard_normal(c.shape)] * 2,
              unknown={i: (0,) for i in range(len(inputs) - 1)})
    check(res, merged, 1.0, dtypes, True, (True, True))


def test_feature_axis_0_layout_with_four_tensors(rng):
    """(K, N) activations of a feature_axis=0 model: the four-tensor form is elementwise."""
    c, gates, _ = gates_case(rng, (16, 5), False)
    c_next, h_next = fused_lstm_gates(*(tf.constant(v, tf.float32) for v in (c, *gates)))
    for got, want in zip((c_next, h_next), ref.lstm_gates(c, *gates)):
        assert rel_error(got, want) < 1e-5


def test_merged_order_is_i_j_f_o(rng):
    c, gates, b = gates_case(rng, (4, 3, 8), True)   # rank 3: gates on the last axis
    c, b = tf.constant(c, tf.float32), tf.constant(b, tf.float32)
    gates = [tf.constant(g, tf.float32) for g in gates]
    merged = fused_lstm_gates(c, tf.concat(gates, axis=-1), bias=b, forget_bias=0.5)
    four = ew.fused_lstm_gates(c, *gates, bias=b, forget_bias=0.5)
    for m, f in zip(merged, four):
        np.testing.assert_allclose(m.numpy(), f.numpy(), rtol=1e-6, atol=1e-7)


def test_xla(rng):
    c, gates, b = gates_case(rng, (4, 8), True)

    @tf.function(jit_compile=True)
    def step(c, h, b):
        with tf.GradientTape() as tape:
            tape.watch([c, h, b])
            c_next, h_next = fused_lstm_gates(c, h, bias=b)
            loss = tf.reduce_sum(h_next) + tf.reduce_sum(c_next)
        return c_next, h_next, tape.gradient(loss, [c, h, b])

    c_next, h_next, grads = step(*(tf.constant(v, tf.float32) for v in (c, np.concatenate(gates, -1), b)))
    for got, want in zip((c_next, h_next), ref.lstm_gates(c, *gates, bias=b)):
        assert rel_error(got, want) < 1e-5
    ones = np.ones_like(c)
    want = ref.lstm_gates_grad(ones, ones, c, *gates, bias=b)
    assert rel_error(grads[0], want[0]) < 1e-5
    assert rel_error(grads[1], np.concatenate(want[1:5], axis=-1)) < 1e-5
    assert rel_error(grads[2], want[5]) < 1e-5


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_split4_concat4(rng, dtype, mode):
    x = rng.standard_normal((5, 4 * 6))
    res = run(mode, split4, [x], [dtype], [rng.standard_normal((5, 6)) for _ in range(4)], unknown={0: (0,)})
    for got, want in zip(res.outputs, np.split(res.inputs[0], 4, axis=-1)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(res.grads[0], np.concatenate(res.grad_ys, axis=-1))
    parts = [rng.standard_normal((2, 3, 5)) for _ in range(4)]
    res = run(mode, concat4, parts, [dtype] * 4, [rng.standard_normal((2, 3, 20))],
              unknown={i: (0,) for i in range(4)})
    np.testing.assert_array_equal(res.outputs[0], np.concatenate(res.inputs, axis=-1))
    for got, want in zip(res.grads, np.split(res.grad_ys[0], 4, axis=-1)):
        np.testing.assert_array_equal(got, want)


def test_ew_reexports_the_gates():
    assert ew.fused_lstm_gates is fused_lstm_gates and ew.split4 is split4 and ew.concat4 is concat4


C = tf.ones([3, 4])
BAD = {
    "three-gates": (lambda: fused_lstm_gates(C, C, C, C), TypeError, "one merged tensor h"),
    "no-gates": (lambda: fused_lstm_gates(C), TypeError, "got 0 gate arguments"),
    "merged-not-4": (lambda: fused_lstm_gates(C, tf.ones([3, 10])), ValueError, "divisible by 4"),
    "merged-shape": (lambda: fused_lstm_gates(C, tf.ones([3, 20])), ValueError, "gates of h"),
    "merged-rank": (lambda: fused_lstm_gates(C, tf.ones([3, 1, 16])), ValueError, "rank of h"),
    "gate-shape": (lambda: fused_lstm_gates(C, C, C, tf.ones([3, 5]), C), ValueError, "f must have the shape of c"),
    "gate-dtype": (lambda: fused_lstm_gates(C, C, tf.ones([3, 4], tf.float16), C, C), TypeError, "c and j"),
    "bias-size": (lambda: fused_lstm_gates(C, tf.ones([3, 16]), bias=tf.ones([12])), ValueError, "bias"),
    "forget-bias": (lambda: fused_lstm_gates(C, tf.ones([3, 16]), forget_bias="1"), TypeError, "forget_bias"),
    "c-int": (lambda: fused_lstm_gates(tf.ones([3, 4], tf.int32), tf.ones([3, 16])), TypeError, "c must"),
    "c-scalar": (lambda: fused_lstm_gates(tf.ones([]), *[tf.ones([])] * 4), ValueError, "c must have rank >= 1"),
    "c-scalar-bias": (lambda: fused_lstm_gates(tf.ones([]), *[tf.ones([])] * 4, bias=tf.zeros([4])), ValueError,
                      "c must have rank >= 1"),
    "split4": (lambda: split4(tf.ones([2, 6])), ValueError, "divisible by 4"),
    "concat4-shape": (lambda: concat4(C, C, C, tf.ones([3, 5])), ValueError, "x3"),
    "concat4-dtype": (lambda: concat4(C, tf.ones([3, 4], tf.bfloat16), C, C), TypeError, "x1"),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_bad_arguments(case):
    assert_raises(case)


def test_unknown_gate_shape_checked_when_the_graph_runs():
    with tf.Graph().as_default():
        c = tf.compat.v1.placeholder(tf.float32, [None, 4])
        h = tf.compat.v1.placeholder(tf.float32, [None, 16])
        c_next, _ = fused_lstm_gates(c, h)
        with tf.compat.v1.Session() as sess:
            assert sess.run(c_next, {c: np.ones((2, 4)), h: np.ones((2, 16))}).shape == (2, 4)
            with pytest.raises(tf.errors.InvalidArgumentError, match="shape of c"):
                sess.run(c_next, {c: np.ones((2, 4)), h: np.ones((3, 16))})


def test_merged_gates_reach_an_implementation_checked(monkeypatch):
    """The GPU kernels read the merged gates whole (not their checked split): a minibatch that
    differs from c's, unknown until the graph runs, must fail there, naming h."""
    from blocksparse import lstm
    from blocksparse._tf.norms.backend import Implementation

    def whole(c, gates, bias, forget_bias, merged=None):
        return tf.reduce_sum(merged), tf.reduce_sum(merged)

    monkeypatch.setattr(lstm.backend, "select", lambda *a: Implementation("whole", None, whole))
    with tf.Graph().as_default():
        c, h = (tf.compat.v1.placeholder(tf.float32, [None, k]) for k in (4, 16))
        y, _ = fused_lstm_gates(c, h)
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {c: np.ones((2, 4)), h: np.ones((2, 16))}) == 32
            with pytest.raises(tf.errors.InvalidArgumentError, match="h must have the shape of c"):
                sess.run(y, {c: np.ones((2, 4)), h: np.ones((3, 16))})
