"""Acceptance, second round: ``blocksparse.conv`` (TensorFlow) as a demanding user calls it --
unused channels, 1x1 filters, long strides, an edge-biased deconvolution with explicit padding
(eager, ``tf.function`` with an unknown batch, ``tf.compat.v1`` graphs), transposed inputs,
copies, second derivatives and bad shape-helper arguments -- against float64 numpy."""
import copy
import pickle

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from conv_cases import (BAD_MINIBATCH, MORE_CASES, MORE_IDS, assert_results, check_bad_minibatch, make,  # noqa: E402
                        reference)
from tf_modes import MODES, run  # noqa: E402

from blocksparse import conv as bsconv  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402


def _split(conv, flat):
    sizes = [int(np.prod(conv.f_shape(b))) for b in range(conv.blocks)]
    return [p.reshape(conv.f_shape(b)) for b, p in enumerate(np.split(flat, np.cumsum(sizes)[:-1]))]


def _draw(conv, rng, N):
    """float32 ``(x, flat filter, edge bias, output gradient)``."""
    shapes = [conv.i_shape(N), conv.f_shape() if len(conv.f_shape()) == 1 else [int(np.prod(conv.f_shape()))],
              conv.edge_bias_shape(), conv.o_shape(N)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", MORE_CASES, ids=MORE_IDS)
def test_more_shapes_values_and_gradients(case, mode, rng):
    conv = make(case, bsconv)
    with_eb = case.kwargs.get("edge_bias", False)
    x, flat, eb, gy = _draw(conv, rng, case.N)

    def fn(x, F, eb):
        return conv(F, x, edge_bias=eb if with_eb else None)

    got = run(mode, fn, [x, flat, eb], [tf.float32] * 3, [gy], unknown={0: (0,)})
    x64, flat64, eb64, gy64 = *got.inputs, got.grad_ys[0]
    want = reference(case, conv, x64, _split(conv, flat64), eb64 if with_eb else None, gy64)
    assert_results(case, conv, (got.outputs[0], *got.grads), want, tolerance("float32"), rel_error)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unused_channels_half_types(dtype, rng):
    case = MORE_CASES[0]
    conv = make(case, bsconv)
    x, flat, eb, _ = _draw(conv, rng, 2)
    dt = getattr(tf, dtype)
    y = conv(tf.cast(flat, dt), tf.cast(x, dt), edge_bias=tf.cast(eb, dt))
    assert y.dtype == dt
    as_dt = lambda a: tf.cast(tf.cast(a, dt), tf.float64).numpy()  # noqa: E731
    want, *_ = reference(case, conv, as_dt(x), _split(conv, as_dt(flat)), as_dt(eb), np.zeros(conv.o_shape(2)))
    assert rel_error(y, want) < tolerance(dtype)
    assert not conv(tf.cast(flat, dt), tf.cast(x, dt))[:, 1].numpy().any()   # output 1: no block, no bias


def test_transposed_input(rng):
    case = MORE_CASES[0]
    conv = make(case, bsconv)
    x, flat, eb, _ = _draw(conv, rng, 2)
    x_t = tf.transpose(tf.constant(x.transpose(0, 2, 3, 1)), [0, 3, 1, 2])
    want, *_ = reference(case, conv, x.astype(np.float64), _split(conv, flat.astype(np.float64)),
                         eb.astype(np.float64), np.zeros(conv.o_shape(2)))
    assert rel_error(conv(flat, x_t, eb), want) < tolerance("float32")


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_compute_the_same(how, rng):
    conv = make(MORE_CASES[3], bsconv)
    other = copy.deepcopy(conv) if how == "deepcopy" else pickle.loads(pickle.dumps(conv))
    x, flat, eb, _ = _draw(conv, rng, 2)
    np.testing.assert_array_equal(other(flat, x, eb), conv(flat, x, eb))
    assert (other.f_shape(), other.edge_bias_shape(), other.MPQ) == (conv.f_shape(), conv.edge_bias_shape(), conv.MPQ)


@pytest.mark.parametrize("case", [MORE_CASES[0], MORE_CASES[3]], ids=[MORE_IDS[0], MORE_IDS[3]])
def test_second_derivatives(case, rng):
    """The op is bilinear in (F, I): ``<conv(F, I), c>`` gives ``dI``, and ``<dI, e>`` differentiated in
    ``F`` is the filter gradient of input ``e`` with output gradient ``c``, in ``c`` it is ``conv(F, e)``."""
    conv = make(case, bsconv)
    x, flat, _, c = _draw(conv, rng, 2)
    e = rng.standard_normal(conv.i_shape(2)).astype(np.float32)
    x, flat, c = tf.constant(x), tf.constant(flat), tf.constant(c)
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([flat, c])
        with tf.GradientTape() as inner:
            inner.watch(x)
            loss = tf.reduce_sum(conv(flat, x) * c)
        dx = inner.gradient(loss, x)
        second = tf.reduce_sum(dx * e)
    dF, dc = outer.gradient(second, [flat, c])
    f64 = lambda t: np.asarray(t, np.float64)  # noqa: E731
    y_e, _, dF_e, _ = reference(case, conv, f64(e), _split(conv, f64(flat)), None, f64(c))
    assert rel_error(dc, y_e) < tolerance("float32")
    assert rel_error(dF, np.concatenate([d.ravel() for d in dF_e])) < tolerance("float32")


@BAD_MINIBATCH
def test_shape_helpers_reject_bad_minibatch(N, error):
    check_bad_minibatch(bsconv, N, error)
    assert bsconv.BlocksparseConv([([0, 1], [0])], (3,), (5,), strides=2).o_shape(0) == [0, 1, 3]


def test_shape_helpers_take_a_runtime_batch(rng):
    conv = bsconv.BlocksparseDeconv([([0, 1], [0])], (3,), (5,), strides=2)
    F = tf.constant(rng.standard_normal(conv.f_shape()), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 2, 5], tf.float32)])
    def shifted(x):
        return conv(F, x) + tf.ones(conv.o_shape(tf.shape(x)[0]))

    x = rng.standard_normal(conv.i_shape(3)).astype(np.float32)
    np.testing.assert_allclose(shifted(x), conv(F, x) + 1, rtol=1e-6, atol=1e-6)
