"""Acceptance: ``blocksparse.norms`` as the original README documents it: ``layer_norm`` on both
activation layouts (``axis=1`` for (N, C), ``axis=0`` for (C, N)), with relu and segments;
``batch_norm`` and ``batch_norm_inference`` on NCHW; values and gradients against float64 numpy,
every dtype and execution mode, and bad arguments."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.norms import batch_norm, batch_norm_inference, layer_norm
from blocksparse.testing import norms as nref
from blocksparse.testing import rel_error
from tf_modes import assert_raises, check_run, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1_NC", "axis0_CN"])
@pytest.mark.parametrize("relu", [False, True], ids=["linear", "relu"])
@pytest.mark.parametrize("segments", [1, 4], ids=["seg1", "seg4"])
def test_layer_norm(rng, axis, relu, segments, dtype):
    n, c = 5, 24
    x, g, b, dy = nref.draw_layer_norm(rng, n, c, axis=axis)
    kw = {"segments": segments} if segments != 1 else {}
    if relu:
        fn = lambda x, g, b: layer_norm(x, g, b, axis, 1e-6, True, **kw)   # noqa: E731  (positional form)
    else:
        fn = lambda x, g, b: layer_norm(x, g, b, axis=axis, **kw)          # noqa: E731
    res = run("eager", fn, [x, g, b], [dtype, tf.float32, tf.float32], [dy])
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == [dtype.name, "float32", "float32"]
    xin, gin, bin_ = res.inputs
    y = nref.layer_norm(xin, gin, bin_, axis=axis, segments=segments, relu=relu)
    dyin = res.grad_ys[0]
    if relu:   # a gradient at the kink is either side's: keep away from it
        dyin = nref.relu_safe(dyin, y)
        res = run("eager", fn, [x, g, b], [dtype, tf.float32, tf.float32], [dyin])
        dyin = res.grad_ys[0]
    grads = nref.layer_norm_grad(dyin, xin, gin, bin_, axis=axis, segments=segments, relu=relu)
    check_run(res, [y], grads, dtype, scale=2.0)


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1_NC", "axis0_CN"])
def test_layer_norm_unknown_minibatch(rng, mode, axis):
    x, g, b, dy = nref.draw_layer_norm(rng, 1, 16, axis=axis)      # a minibatch of 1
    res = run(mode, lambda x, g, b: layer_norm(x, g, b, axis=axis), [x, g, b], [tf.float32] * 3, [dy],
              unknown={0: (1 - axis,)})
    xin, gin, bin_ = res.inputs
    check_run(res, [nref.layer_norm(xin, gin, bin_, axis=axis)], nref.layer_norm_grad(dy, xin, gin, bin_, axis=axis),
          tf.float32)


def test_layer_norm_defaults_and_parameter_forms(rng):
    x, g, b, _ = nref.draw_layer_norm(rng, 3, 8)
    want = nref.layer_norm(x.astype(np.float32), g.astype(np.float32), b.astype(np.float32))
    xt = tf.constant(x, tf.float32)
    forms = [layer_norm(xt, tf.constant(g, tf.float32), tf.constant(b, tf.float32)),     # axis=1 default
             layer_norm(xt, g, b),                                                      # numpy float64 params
             layer_norm(xt, tf.constant(g, tf.bfloat16), tf.constant(b, tf.float16)),     # mixed param dtypes
             layer_norm(xt, g.reshape(1, 8), b.reshape(8, 1))]                          # (1, C) / (C, 1)
    for k, y in enumerate(forms):
        assert rel_error(y.numpy(), want) < (1e-2 if k == 2 else 1e-5)
    y = layer_norm(xt, g, b, epsilon=0.5)
    assert rel_error(y.numpy(), nref.layer_norm(x.astype(np.float32), g, b, epsilon=0.5)) < 1e-5


def bn_input(rng, shape):
    return 1.5 + 2.0 * rng.standard_normal(shape)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (1, 3, 4, 4), (3, 5), (2, 3, 2, 3, 2)],
                         ids=["NCHW", "N1_CHW", "NC", "NCDHW"])
def test_batch_norm(rng, shape, dtype):
    c = shape[1]
    x, g, b = bn_input(rng, shape), 1.0 + 0.3 * rng.standard_normal(c), 0.5 * rng.standard_normal(c)
    dy, dmean, dvar = rng.standard_normal(shape), rng.standard_normal(c), rng.standard_normal(c)
    res = run("eager", lambda x, g, b: batch_norm(x, g, b), [x, g, b], [dtype, tf.float32, tf.float32],
              [dy, dmean, dvar])
    assert res.out_dtypes == [dtype.name, "float32", "float32"]
    xin, gin, bin_ = res.inputs
    check_run(res, nref.batch_norm(xin, gin, bin_), nref.batch_norm_grad(*res.grad_ys, xin, gin, bin_), dtype,
          scale=2.0)


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_batch_norm_unknown_minibatch(rng, mode):
    shape = (3, 4, 2, 5)
    x, g, b = bn_input(rng, shape), rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    dy = rng.standard_normal(shape)
    res = run(mode, lambda x, g, b: batch_norm(x, g, b, 1e-5)[0], [x, g, b], [tf.float32] * 3, [dy],
              unknown={0: (0, 2, 3)})
    xin, gin, bin_ = res.inputs
    check_run(res, [nref.batch_norm(xin, gin, bin_, 1e-5)[0]],
          nref.batch_norm_grad(dy, None, None, xin, gin, bin_, 1e-5), tf.float32)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_batch_norm_inference(rng, mode, dtype):
    shape = (2, 3, 4, 5)
    x = bn_input(rng, shape)
    g, b, m = rng.uniform(0.5, 1.5, 3), rng.standard_normal(3), rng.standard_normal(3)
    v = rng.uniform(0.5, 2.0, 3)
    dy = rng.standard_normal(shape)
    res = run(mode, lambda *t: batch_norm_inference(*t, epsilon=1e-4), [x, g, b, m, v],
              [dtype] + [tf.float32] * 4, [dy], unknown={0: (0,)})
    assert res.out_dtypes == [dtype.name]
    ins = res.inputs
    check_run(res, [nref.batch_norm_inference(*ins, epsilon=1e-4)],
          nref.batch_norm_inference_grad(res.grad_ys[0], *ins, epsilon=1e-4), dtype, scale=2.0)


def bad_calls():
    x = tf.ones([4, 8])
    x4 = tf.ones([2, 3, 4, 4])
    ones3 = tf.ones([3])
    return {
        "ln_g_size": (lambda: layer_norm(x, tf.ones([7]), tf.zeros([8])), ValueError, r"g must have shape \(8,\)"),
        "ln_b_size": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([4])), ValueError, r"b must have shape \(8,\)"),
        "ln_axis0_g": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), axis=0), ValueError,
                       r"g must have shape \(4,\)"),
        "ln_axis_range": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), axis=2), ValueError, "axis"),
        "ln_axis_float": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), axis=1.0), TypeError, "axis"),
        "ln_epsilon": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), epsilon=0.0), ValueError, "epsilon"),
        "ln_relu": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), relu="yes"), TypeError, "relu"),
        "ln_segments": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), segments=3), ValueError, "segments"),
        "ln_segments_zero": (lambda: layer_norm(x, tf.ones([8]), tf.zeros([8]), segments=0), ValueError, "segments"),
        "ln_int": (lambda: layer_norm(tf.ones([4, 8], tf.int32), tf.ones([8]), tf.zeros([8])), TypeError, "x must"),
        "ln_g_none": (lambda: layer_norm(x, None, tf.zeros([8])), TypeError, "g must"),
        "bn_rank1": (lambda: batch_norm(ones3, ones3, ones3), ValueError, "x must have rank"),
        "bn_g": (lambda: batch_norm(x4, tf.ones([4]), ones3), ValueError, r"g must have shape \(3,\)"),
        "bn_epsilon": (lambda: batch_norm(x4, ones3, ones3, epsilon=-1.0), ValueError, "epsilon"),
        "bn_int": (lambda: batch_norm(tf.ones([2, 3], tf.int32), ones3, ones3), TypeError, "x must"),
        "bni_v": (lambda: batch_norm_inference(x4, ones3, ones3, ones3, tf.ones([2])), ValueError, "v must have"),
        "bni_m": (lambda: batch_norm_inference(x4, ones3, ones3, tf.ones([3, 2]), ones3), ValueError, "m must have"),
        "bni_epsilon": (lambda: batch_norm_inference(x4, ones3, ones3, ones3, ones3, epsilon="1"), TypeError,
                        "epsilon"),
    }


@pytest.mark.parametrize("case", sorted(bad_calls()))
def test_bad_arguments(case):
    assert_raises(bad_calls()[case])


PARAMETER_CALLS = {
    "layer_norm_g": (lambda p: layer_norm(tf.ones([2, 8]), p, tf.zeros([8])), "g must have shape"),
    "layer_norm_b": (lambda p: layer_norm(tf.ones([2, 8]), tf.ones([8]), p, axis=1, relu=True), "b must have shape"),
    "batch_norm_g": (lambda p: batch_norm(tf.ones([2, 8, 3]), p, tf.zeros([8]))[0], "g must have shape"),
    "inference_v": (lambda p: batch_norm_inference(tf.ones([2, 8]), *[tf.ones([8])] * 3, p), "v must have shape"),
}


@pytest.mark.parametrize("size", [1, 7], ids=["size1_broadcastable", "size7"])
@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("case", sorted(PARAMETER_CALLS))
def test_parameter_size_checked_at_run_time(case, mode, size):
    """A parameter vector of unknown size: a wrong one fails when the graph runs, naming it (a size
    of 1 would broadcast: it must never give a silently wrong answer)."""
    call, pattern = PARAMETER_CALLS[case]
    if mode == "function":
        fn = tf.function(call, input_signature=[tf.TensorSpec([None])])
        assert fn(tf.ones([8])).shape[1] == 8
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            fn(tf.ones([size]))
        return
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float32, [None])
        y = call(p)
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {p: np.ones(8)}).shape[1] == 8
            with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
                sess.run(y, {p: np.ones(size)})
