"""Acceptance: ``blocksparse.conv`` (TensorFlow) called as documented, against float64 numpy."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import conv_reference as ref  # noqa: E402
from conv_cases import CASES, IDS, make, reference  # noqa: E402
from tf_modes import MODES, run  # noqa: E402

from blocksparse import conv as bsconv  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402

DTYPES = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}


def _blocks(conv, rng):
    return [rng.standard_normal(conv.f_shape(b)).astype(np.float32) for b in range(conv.blocks)]


def _split(conv, flat):
    sizes = [int(np.prod(conv.f_shape(b))) for b in range(conv.blocks)]
    return [p.reshape(conv.f_shape(b)) for b, p in enumerate(np.split(flat, np.cumsum(sizes)[:-1]))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_values_and_gradients(case, mode, rng):
    conv = make(case, bsconv)
    x = rng.standard_normal(conv.i_shape(case.N)).astype(np.float32)
    flat = np.concatenate([b.ravel() for b in _blocks(conv, rng)])
    E = conv.edge_bias_shape()[1]
    eb = rng.standard_normal((conv.K, E)).astype(np.float32)
    gy = rng.standard_normal(conv.o_shape(case.N)).astype(np.float32)
    with_eb = case.kwargs.get("edge_bias", False)

    def fn(x, F, eb):
        return conv(F, x, edge_bias=eb if with_eb else None)

    got = run(mode, fn, [x, flat, eb], [tf.float32] * 3, [gy], unknown={0: (0,)})
    x64, flat64, eb64, gy64 = got.inputs[0], got.inputs[1], got.inputs[2], got.grad_ys[0]
    y, dx, dF, deb = reference(case, conv, x64, _split(conv, flat64), eb64 if with_eb else None, gy64)
    tol = tolerance("float32")
    assert got.outputs[0].shape == tuple(conv.o_shape(case.N))
    assert rel_error(got.outputs[0], y) < tol
    assert rel_error(got.grads[0], dx) < tol
    assert rel_error(got.grads[1], np.concatenate([d.ravel() for d in dF])) < tol
    if with_eb and E:
        assert rel_error(got.grads[2], deb) < tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [CASES[0], CASES[6]], ids=[CASES[0].id, CASES[6].id])
def test_conv_dtypes_and_filter_forms(case, dtype, rng):
    conv = make(case, bsconv)
    blocks = _blocks(conv, rng)
    x = rng.standard_normal(conv.i_shape(case.N)).astype(np.float32)
    eb = rng.standard_normal(conv.edge_bias_shape()).astype(np.float32)
    dt = DTYPES[dtype]
    to = lambda a: tf.cast(tf.constant(a), dt)  # noqa: E731
    xr = to(x).numpy().astype(np.float64) if dtype != "bfloat16" else tf.cast(to(x), tf.float64).numpy()
    br = [tf.cast(to(b), tf.float64).numpy() for b in blocks]
    ebr = tf.cast(to(eb), tf.float64).numpy()
    want, *_ = reference(case, conv, xr, br, ebr, np.zeros(conv.o_shape(case.N)))
    assert conv.f_shape() == [conv.blocks, *conv.f_shape(0)]  # uniform blocks: stacked
    forms = {"stacked": to(np.stack(blocks)), "flat": to(np.concatenate([b.ravel() for b in blocks])),
             "list": [to(b) for b in blocks]}
    for form, F in forms.items():
        y = conv(F, to(x), edge_bias=to(eb))
        assert y.dtype == dt, form
        assert rel_error(tf.cast(y, tf.float64).numpy(), want) < tolerance(dtype), form


def test_shape_helpers_and_attributes():
    BCK = [([5, 1], [0, 3, 2]), ([0], [1])]
    conv = bsconv.BlocksparseConv(BCK, (3, 3), (8, 10), strides=(1, 1, 2), padding="SAME", edge_bias=True)
    assert (conv.C, conv.K, conv.blocks) == (6, 4, 2)
    assert conv.i_shape(3) == [3, 6, 8, 10] and conv.o_shape(3) == [3, 4, 8, 5]
    assert conv.i_shape(None) == [None, 6, 8, 10]
    assert conv.f_shape() == [3 * 2 * 9 + 1 * 1 * 9]
    assert conv.f_shape(0) == [3, 2, 3, 3] and conv.f_shape(1) == [1, 1, 3, 3]
    assert tuple(conv.MPQ) == (8, 5)
    assert conv.density == pytest.approx(7 / 24)
    deconv = bsconv.BlocksparseDeconv(BCK, (3, 3), (8, 10), strides=2)
    assert deconv.f_shape(0) == [2, 3, 3, 3]
    assert deconv.o_shape(1) == [1, 4, 16, 20]
    assert deconv.edge_bias_shape() == (4, 0)
    valid = bsconv.BlocksparseConv(BCK, (3, 3), (8, 10), padding="VALID", edge_bias=True)
    assert valid.edge_bias_shape() == (4, 0)


def test_mpq_checked_and_picked():
    BCK = [([0], [0])]
    assert bsconv.BlocksparseConv(BCK, (3,), (9,), MPQ=(9,)).o_shape(1) == [1, 1, 9]
    with pytest.raises(ValueError, match="MPQ"):
        bsconv.BlocksparseConv(BCK, (3,), (9,), MPQ=(8,))
    for M in (9, 10):  # stride 2, SAME: both give 5 back
        assert bsconv.BlocksparseDeconv(BCK, (3,), (5,), MPQ=(M,), strides=2).o_shape(1) == [1, 1, M]
    with pytest.raises(ValueError, match="MPQ"):
        bsconv.BlocksparseDeconv(BCK, (3,), (5,), MPQ=(12,), strides=2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
@pytest.mark.parametrize("with_gain", [False, True], ids=["no-gain", "gain"])
def test_l2_normalize(transposed, with_gain, dtype, rng):
    BCK = [([0, 2], [1, 3, 0]), ([1], [1]), ([3, 1], [2])]
    cls = bsconv.BlocksparseDeconv if transposed else bsconv.BlocksparseConv
    conv = cls(BCK, (2, 3), (5, 5))
    blocks = [rng.standard_normal(conv.f_shape(b)) for b in range(conv.blocks)]
    gain = rng.uniform(0.5, 2.0, conv.K)
    F = [tf.Variable(b, dtype=tf.float32) for b in blocks]
    g = tf.Variable(gain, dtype=tf.float32)
    gys = [rng.standard_normal(b.shape) for b in blocks]
    with tf.GradientTape() as tape:
        out = conv.l2_normalize(F, gain=g if with_gain else None, dtype=getattr(tf, dtype))
        loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32) * gy) for o, gy in zip(out, gys)])
    assert isinstance(out, list) and all(o.dtype == getattr(tf, dtype) for o in out)
    want = ref.l2_normalize(blocks, [k for _, k in BCK], gain if with_gain else None, 1e-6, transposed)
    for o, w in zip(out, want):
        assert list(o.shape) == list(w.shape)
        assert rel_error(tf.cast(o, tf.float64).numpy(), w) < tolerance(dtype)
    # gradient by central differences of the float64 reference (it is smooth away from epsilon)
    dF = tape.gradient(loss, F)
    h = 1e-6
    for b in range(conv.blocks):
        num = np.zeros_like(blocks[b])
        for i in np.ndindex(blocks[b].shape):
            for sign in (1, -1):
                pert = [x.copy() for x in blocks]
                pert[b][i] += sign * h
                val = ref.l2_normalize(pert, [k for _, k in BCK], gain if with_gain else None, 1e-6, transposed)
                num[i] += sign * sum((v * gy).sum() for v, gy in zip(val, gys)) / (2 * h)
        assert rel_error(dF[b].numpy(), num) < 20 * tolerance(dtype)


def test_l2_normalize_stacked_and_flat_forms(rng):
    conv = bsconv.BlocksparseConv([([0, 1], [0, 1]), ([2, 3], [2, 3])], (3,), (6,))
    F = rng.standard_normal(conv.f_shape()).astype(np.float32)
    stacked = conv.l2_normalize(tf.constant(F))
    flat = conv.l2_normalize(tf.constant(F.ravel()))
    assert stacked.shape == tuple(conv.f_shape()) and stacked.dtype == tf.float32
    assert flat.shape == (F.size,)
    want = np.stack(ref.l2_normalize(list(F.astype(np.float64)), [[0, 1], [2, 3]], None, 1e-6, False))
    assert rel_error(stacked.numpy(), want) < 1e-5
    assert rel_error(flat.numpy(), want.ravel()) < 1e-5


@pytest.mark.parametrize("form", ["a-and-b", "a-only", "b-only", "original-4d-shapes"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cwise_linear(form, dtype, rng):
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    a = rng.standard_normal(5).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    xt = tf.cast(tf.constant(x), DTYPES[dtype])
    x64 = tf.cast(xt, tf.float64).numpy()
    A, B = a.reshape(1, 5, 1, 1), b.reshape(1, 5, 1, 1)
    args = {"a-and-b": (a, b), "a-only": (a, None), "b-only": (None, b),
            "original-4d-shapes": (A, B)}[form]
    at = None if args[0] is None else tf.Variable(args[0])
    bt = None if args[1] is None else tf.Variable(args[1])
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = bsconv.cwise_linear(xt, a=at, b=bt)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * x)
    want = x64 * (A if at is not None else 1) + (B if bt is not None else 0)
    assert y.dtype == xt.dtype and y.shape == x.shape
    assert rel_error(tf.cast(y, tf.float64).numpy(), want) < tolerance(dtype)
    grads = tape.gradient(loss, [xt] + [v for v in (at, bt) if v is not None])
    expect = [x * (A if at is not None else 1)]
    if at is not None:
        expect.append((x * x64).sum(axis=(0, 2, 3)).reshape(args[0].shape))
    if bt is not None:
        expect.append(x.sum(axis=(0, 2, 3)).reshape(args[1].shape))
    for g, e in zip(grads, expect):
        assert rel_error(g.numpy(), e) < tolerance(dtype) * 5


def test_unknown_batch_in_tf_function(rng):
    conv = bsconv.BlocksparseConv([([0, 1], [0]), ([2], [1, 2])], (3, 3), (6, 6), edge_bias=True)
    F = tf.constant(rng.standard_normal(conv.f_shape()).astype(np.float32))
    eb = tf.constant(rng.standard_normal(conv.edge_bias_shape()).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 3, 6, 6], tf.float32)])
    def f(x):
        y = conv(F, x, edge_bias=eb)
        assert y.shape.as_list() == [None, 3, 6, 6]
        return y

    for n in (1, 3):
        x = rng.standard_normal((n, 3, 6, 6)).astype(np.float32)
        assert rel_error(f(x).numpy(), conv(F, tf.constant(x), edge_bias=eb).numpy()) < 1e-6


BAD_BCK = {
    "negative-channel": ([([0, -1], [0])], ValueError, r"BCK\[0\]"),
    "empty-input-block": ([([], [0])], ValueError, r"BCK\[0\].*empty"),
    "empty-output-block": ([([0], [0]), ([1], [])], ValueError, r"BCK\[1\].*empty"),
    "duplicate-block": ([([0, 1], [0]), ([0, 1], [0])], ValueError, r"blocks 0 and 1"),
    "overlapping-pair": ([([0, 1], [0, 1]), ([1, 2], [1])], ValueError, r"blocks 0 and 1"),
    "repeated-channel": ([([0, 0], [0])], ValueError, r"twice"),
    "float-channel": ([([0.5], [0])], TypeError, r"BCK\[0\]"),
    "not-pairs": ([([0], [0], [1])], TypeError, r"BCK\[0\]"),
    "empty-BCK": ([], ValueError, r"BCK"),
    "string": ("abc", TypeError, r"BCK"),
}


@pytest.mark.parametrize("name", BAD_BCK)
@pytest.mark.parametrize("cls", ["BlocksparseConv", "BlocksparseDeconv"])
def test_bad_bck(name, cls):
    BCK, error, pattern = BAD_BCK[name]
    with pytest.raises(error, match=pattern):
        getattr(bsconv, cls)(BCK, (3, 3), (8, 8))


BAD_ARGS = {
    "TRS-too-long": (dict(TRS=(1, 1, 1, 1)), ValueError, "TRS"),
    "TRS-zero": (dict(TRS=(0, 3)), ValueError, "TRS"),
    "DHW-rank-mismatch": (dict(DHW=(8,)), ValueError, "DHW"),
    "DHW-float": (dict(DHW=(8.0, 8)), TypeError, "DHW"),
    "stride-zero": (dict(strides=(0, 1)), ValueError, "strides"),
    "dilate-negative": (dict(dilates=-1), ValueError, "dilates"),
    "padding-unknown": (dict(padding="FULL"), ValueError, "padding"),
    "padding-negative": (dict(padding=-1), ValueError, "padding"),
    "filter-larger-than-valid-input": (dict(TRS=(9, 9), padding="VALID"), ValueError, ""),
    "edge-bias-not-bool": (dict(edge_bias="yes"), TypeError, "edge_bias"),
    "MPQ-wrong-rank": (dict(MPQ=(8,)), ValueError, "MPQ"),
}


@pytest.mark.parametrize("name", BAD_ARGS)
def test_bad_constructor_args(name):
    kwargs, error, pattern = BAD_ARGS[name]
    args = dict(BCK=[([0], [0])], TRS=(3, 3), DHW=(8, 8))
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        bsconv.BlocksparseConv(**args)


def test_bad_call_args(rng):
    conv = bsconv.BlocksparseConv([([0, 1], [0]), ([2], [1])], (3, 3), (6, 6), edge_bias=True)
    F = tf.constant(rng.standard_normal(conv.f_shape()).astype(np.float32))
    x = tf.constant(rng.standard_normal(conv.i_shape(2)).astype(np.float32))
    eb = tf.zeros(conv.edge_bias_shape())
    with pytest.raises(ValueError, match="F"):
        conv(tf.zeros([5]), x)
    with pytest.raises(ValueError, match="I"):
        conv(F, tf.zeros([2, 4, 6, 6]))
    with pytest.raises(ValueError, match="I"):
        conv(F, tf.zeros([2, 3, 6, 7]))
    with pytest.raises(TypeError, match="dtype"):
        conv(tf.cast(F, tf.float16), x)
    with pytest.raises(TypeError, match="I"):
        conv(F, tf.zeros([2, 3, 6, 6], tf.int32))
    with pytest.raises(ValueError, match="edge_bias"):
        conv(F, x, edge_bias=tf.zeros([2, 3]))
    with pytest.raises(ValueError, match="F"):
        conv([F], x)
    with pytest.raises(ValueError, match="gain"):
        conv.l2_normalize(F, gain=tf.ones([3]))
    for epsilon in (-1.0, 0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="epsilon must be > 0 and finite"):
            conv.l2_normalize(F, epsilon=epsilon)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        conv.l2_normalize(F, dtype=np.int32)
    with pytest.raises(ValueError, match="a, b"):
        bsconv.cwise_linear(x)
    with pytest.raises(ValueError, match="a"):
        bsconv.cwise_linear(x, a=tf.ones([4]))


def test_graph_mode_runtime_shape_checked(rng):
    conv = bsconv.BlocksparseConv([([0, 1], [0])], (3,), (6,))
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2, None])
        F = tf.compat.v1.placeholder(tf.float32, None)
        y = conv(F, x)
        with tf.compat.v1.Session() as sess:
            good = {x: np.ones((1, 2, 6), np.float32), F: np.ones(conv.f_shape(), np.float32)}
            assert sess.run(y, good).shape == (1, 1, 6)
            with pytest.raises(tf.errors.InvalidArgumentError, match="I"):
                sess.run(y, {x: np.ones((1, 2, 7), np.float32), F: np.ones(conv.f_shape(), np.float32)})


@pytest.mark.parametrize("form", ["stacked", "flat"])
def test_graph_mode_filter_of_unknown_rank(form, rng):
    """A ``tf.compat.v1`` placeholder of unknown shape takes either documented filter form."""
    conv = bsconv.BlocksparseConv([([0, 1], [0]), ([2, 3], [1])], (3,), (6,))
    Fv = rng.standard_normal(conv.f_shape()).astype(np.float32)
    Fv = Fv if form == "stacked" else Fv.ravel()
    xv = rng.standard_normal(conv.i_shape(2)).astype(np.float32)
    want = conv(tf.constant(Fv), tf.constant(xv)).numpy()
    want_norm = conv.l2_normalize(tf.constant(Fv)).numpy()
    with tf.Graph().as_default():
        F = tf.compat.v1.placeholder(tf.float32, None)
        x = tf.compat.v1.placeholder(tf.float32, [None, 4, 6])
        y, n = conv(F, x), conv.l2_normalize(F)
        with tf.compat.v1.Session() as sess:
            got, norm = sess.run([y, n], {F: Fv, x: xv})
            with pytest.raises(tf.errors.InvalidArgumentError, match="F must have shape"):
                sess.run(y, {F: np.ones(5, np.float32), x: xv})
    assert rel_error(got, want) < 1e-6
    assert norm.shape == Fv.shape and rel_error(norm, want_norm) < 1e-6


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4], CASES[6]], ids=lambda c: c.id)
def test_empty_batch(case, rng):
    """N = 0 gives an empty ``o_shape(0)`` (TensorFlow's own convolutions keep the input's shape)."""
    conv = make(case, bsconv)
    F = tf.Variable(rng.standard_normal(conv.f_shape()).astype(np.float32))
    eb = tf.Variable(rng.standard_normal(conv.edge_bias_shape()).astype(np.float32))
    with tf.GradientTape() as tape:
        y = conv(F, tf.zeros(conv.i_shape(0)), edge_bias=eb if case.kwargs.get("edge_bias") else None)
        loss = tf.reduce_sum(y)
    assert y.shape == tuple(conv.o_shape(0))
    dF = tape.gradient(loss, F)
    assert dF.shape == F.shape and not np.any(dF.numpy())


def test_empty_batch_unknown_until_run(rng):
    conv = make(CASES[0], bsconv)
    F = tf.constant(rng.standard_normal(conv.f_shape()).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec(conv.i_shape(None), tf.float32)])
    def f(x):
        return conv(F, x)

    assert f(tf.zeros(conv.i_shape(0))).shape == tuple(conv.o_shape(0))


def test_documented_positional_and_keyword_forms(rng):
    BCK = [([0, 1], [0, 1]), ([2, 3], [2, 3])]
    by_position = bsconv.BlocksparseConv(BCK, (3, 3), (6, 6), None, (1, 1, 1), (1, 1, 1), "SAME", True)
    by_keyword = bsconv.BlocksparseConv(BCK=BCK, TRS=(3, 3), DHW=(6, 6), MPQ=None, strides=(1, 1, 1),
                                        dilates=(1, 1, 1), padding="SAME", edge_bias=True)
    deconv = bsconv.BlocksparseDeconv(BCK, (3, 3), (6, 6), (12, 12), 2, 1, "SAME", False)
    assert deconv.o_shape(1) == [1, 4, 12, 12]
    assert by_position.f_shape(block=1) == by_keyword.f_shape(1) == [2, 2, 3, 3]
    F = tf.constant(rng.standard_normal(by_position.f_shape()).astype(np.float32))
    x = tf.constant(rng.standard_normal(by_position.i_shape(N=2)).astype(np.float32))
    eb = tf.constant(rng.standard_normal(by_position.edge_bias_shape()).astype(np.float32))
    y1 = by_position(F, x, eb)
    y2 = by_keyword(F=F, I=x, edge_bias=eb)
    assert y1.shape == tuple(by_position.o_shape(N=2)) and np.array_equal(y1.numpy(), y2.numpy())
    gain = tf.constant(rng.uniform(1, 2, 4).astype(np.float32))
    n1 = by_position.l2_normalize(F, gain, 1e-6, np.float32)
    n2 = by_keyword.l2_normalize(F=F, gain=gain, epsilon=1e-6, dtype=np.float32)
    assert np.array_equal(n1.numpy(), n2.numpy())
    a = tf.constant(rng.standard_normal(4).astype(np.float32))
    assert np.array_equal(bsconv.cwise_linear(x, a, a).numpy(), bsconv.cwise_linear(x=x, a=a, b=a).numpy())
