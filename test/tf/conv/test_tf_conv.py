"""TensorFlow BlocksparseConv / BlocksparseDeconv: values and gradients (input, filter, edge bias)
against the float64 numpy reference, on both paths, in eager mode, ``tf.function`` with an unknown
minibatch and ``tf.compat.v1`` graphs; weight normalisation; bad input."""
import doctest

import numpy as np
import pytest
import tensorflow as tf

import blocksparse.conv
from blocksparse.conv import BlocksparseConv, BlocksparseDeconv
from blocksparse._tf.conv import compute
from blocksparse.testing import rel_error, tolerance
from blocksparse.testing.conv import CASES, case_of, conv_products, l2_normalize_products, make_op, random_inputs

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
KINDS = {"conv": BlocksparseConv, "deconv": BlocksparseDeconv}
CASES_2D = [c for c in CASES if not c.startswith("3d") and c != "original-3tuple-1d"]


@pytest.fixture(params=["dense", "grouped"])
def path(request, monkeypatch):
    """Runs the test on each path: the grouped one is forced (on a CPU it is never chosen)."""
    if request.param == "grouped":
        monkeypatch.setattr(compute, "choose", lambda spec: "grouped")
    return request.param


def build(rng, kind, case, **kwargs):
    return make_op(KINDS[kind], rng, case, **kwargs)


def as_np(t):
    return None if t is None else np.asarray(tf.cast(t, tf.float64))


def _eager(op, F, x, dy, eb, dtype):
    F, x, dy = (tf.cast(v, dtype) for v in (F, x, dy))
    eb = None if eb is None else tf.cast(eb, dtype)
    watched = [x, F] + ([eb] if eb is not None else [])
    with tf.GradientTape() as tape:
        tape.watch(watched)
        y = op(F, x, edge_bias=eb)
    grads = tape.gradient(y, watched, output_gradients=dy)
    return [y, *grads, *([None] if eb is None else [])], (F, x, dy, eb)


def _function(op, F, x, dy, eb, dtype, jit_compile=None):
    spec = [tf.TensorSpec(op.f_shape(), tf.float32), tf.TensorSpec(op.i_shape(None), tf.float32),
            tf.TensorSpec(op.o_shape(None), tf.float32), tf.TensorSpec(op.edge_bias_shape(), tf.float32)]

    @tf.function(input_signature=spec, jit_compile=jit_compile)
    def step(F, x, dy, eb):
        assert x.shape[0] is None  # the minibatch really is unknown here
        return _eager(op, F, x, dy, eb, dtype)

    out = step(F, x, dy, eb)
    step(F, x[:1], dy[:1], eb)  # another minibatch size through the same trace
    assert step.experimental_get_tracing_count() == 1
    return out


def _graph(op, F, x, dy, eb, dtype, x_shape=None):
    with tf.Graph().as_default():
        xp = tf.compat.v1.placeholder(tf.float32, op.i_shape(None) if x_shape is None else x_shape(op))
        dyp = tf.compat.v1.placeholder(tf.float32, op.o_shape(None))
        Fv = tf.compat.v1.get_variable("F", dtype=dtype, initializer=tf.cast(F, dtype))
        ebv = tf.compat.v1.get_variable("eb", dtype=dtype, initializer=tf.cast(eb, dtype))
        xt, dyt = tf.cast(xp, dtype), tf.cast(dyp, dtype)
        y = op(Fv, xt, edge_bias=ebv)
        grads = tf.gradients(y, [xt, Fv, ebv], grad_ys=dyt)
        fetch = [y] + [g if g is not None else tf.constant(np.zeros((op.K, 0))) for g in grads]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return sess.run([fetch, (Fv, xt, dyt, ebv)], {xp: x, dyp: dy})


MODES = {"eager": _eager, "function": _function, "graph": _graph,
         # XLA with an unknown minibatch (its gradient of the empty-batch guard once aborted the process)
         "xla": lambda *a: _function(*a, jit_compile=True),
         # the input's sizes unknown when the graph is built: spatial sizes, then even the rank
         "graph-unknown-sizes": lambda *a: _graph(*a, x_shape=lambda op: [None, op.C] + [None] * (len(op.i_shape(1)) - 2)),
         "graph-unknown-rank": lambda *a: _graph(*a, x_shape=lambda op: None)}


def check(op, case, F, x, dy, eb, dtype=tf.float32, mode="eager"):
    outs, seen = MODES[mode](op, F, x, dy, eb, dtype)
    if mode == "eager":
        assert outs[0].dtype == dtype and outs[0].shape == tuple(op.o_shape(x.shape[0]))
    Fs, xs, dys, ebs = (as_np(v) for v in seen)  # the reference sees the values the op saw
    refs = conv_products(case, Fs, xs, dys, ebs)
    tol = tolerance(dtype.name)
    for name, got, want in zip(("y", "dx", "dF", "d_edge_bias"), outs, refs):
        if want is None or want.size == 0:  # no edge bias, or none to learn (VALID)
            assert got is None or np.size(got) == 0, name
            continue
        err = rel_error(as_np(got), want)
        assert err < tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients(rng, kind, case):
    op, ref = build(rng, kind, case)
    check(op, ref, *random_inputs(rng, op))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES_2D)
def test_grouped_path(rng, monkeypatch, kind, case):
    monkeypatch.setattr(compute, "choose", lambda spec: "grouped")
    op, ref = build(rng, kind, case)
    check(op, ref, *random_inputs(rng, op))


@pytest.mark.parametrize("mode", ["function", "xla", "graph", "graph-unknown-sizes", "graph-unknown-rank"])
@pytest.mark.parametrize("kind", KINDS)
def test_modes(rng, path, kind, mode):
    op, ref = build(rng, kind, "2d-same-stride-dilate", layout="uniform")
    check(op, ref, *random_inputs(rng, op), mode=mode)


@pytest.mark.parametrize("case", ["2d-same-stride-dilate", "2d-explicit-asymmetric", "1d-same-s2"])
@pytest.mark.parametrize("kind", KINDS)
def test_xla_function_differentiated_outside(rng, kind, case):
    """An XLA-compiled call with an unknown minibatch, differentiated by a tape around it (its gradient
    is compiled apart): values and gradients against float64, minibatches 3 and 0.  The empty-batch
    guard's cond once made this gradient abort the process or fail with garbage shapes."""
    op, ref = build(rng, kind, case)
    spec = [tf.TensorSpec(op.f_shape(), tf.float32), tf.TensorSpec(op.i_shape(None), tf.float32)]
    call = tf.function(lambda F, x: op(F, x), jit_compile=True, input_signature=spec)
    for n in (3, 0):
        F, x, dy, _ = random_inputs(rng, op, N=n)
        F, x, dy = (tf.constant(v, tf.float32) for v in (F, x, dy))
        with tf.GradientTape() as tape:
            tape.watch([x, F])
            y = call(F, x)
        dx, dF = tape.gradient(y, [x, F], output_gradients=dy)
        want = conv_products(ref, as_np(F), as_np(x), as_np(dy), None)
        for name, got, w in zip(("y", "dx", "dF"), (y, dx, dF), want):
            assert got.shape == w.shape, name
            if n:
                assert rel_error(as_np(got), w) < tolerance("float32"), name
            else:
                assert not np.any(as_np(got)), name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_empty_minibatch(rng, path, kind, mode):
    """A minibatch of 0 in every mode: the output's shape, an empty input gradient and zero filter
    and edge-bias gradients (TensorFlow's convolutions give an empty batch their input's shape, and
    in ``tf.function`` the graph optimiser removed a reshape that fixed it)."""
    op, _ = build(rng, kind, "2d-same-stride-dilate", layout="uniform")
    outs, _ = MODES[mode](op, *random_inputs(rng, op, N=0), tf.float32)
    y, dx, dF, deb = (np.asarray(v) for v in outs)
    assert y.shape == tuple(op.o_shape(0)) and dx.shape == tuple(op.i_shape(0))
    assert dF.shape == tuple(op.f_shape()) and not dF.any()
    assert deb.shape == tuple(op.edge_bias_shape()) and not deb.any()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_half_dtypes(rng, path, kind, dtype):
    op, ref = build(rng, kind, "2d-explicit-asymmetric", layout="uniform")
    check(op, ref, *random_inputs(rng, op, N=3), dtype=DTYPES[dtype])


@pytest.mark.parametrize("form", ["stacked", "flat", "blocks"])
def test_filter_forms(rng, form):
    op, ref = build(rng, "deconv", "1d-same-s2", layout="uniform")
    F, x, dy, eb = random_inputs(rng, op)
    Fv = tf.Variable(F)
    with tf.GradientTape() as tape:
        given = {"stacked": Fv, "flat": tf.reshape(Fv, [-1]), "blocks": tf.unstack(Fv)}[form]
        y = op(given, x, edge_bias=eb)
    dF = tape.gradient(y, Fv, output_gradients=dy)
    want_y, _, want_dF, _ = conv_products(ref, F, x, dy, eb)
    assert rel_error(y.numpy(), want_y) < 1e-5 and rel_error(dF.numpy(), want_dF) < 1e-5


def test_deconv_mpq(rng):
    op, ref = build(rng, "deconv", "1d-same-s2", MPQ=(17,))
    assert op.o_shape(None) == [None, op.K, 17]
    check(op, ref, *random_inputs(rng, op))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_gain", [False, True], ids=["no-gain", "gain"])
def test_l2_normalize(rng, kind, with_gain):
    op, ref = build(rng, kind, "2d-same-stride-dilate")
    F = rng.standard_normal(op.f_shape()).astype(np.float32)
    dout = rng.standard_normal(op.f_shape())
    gain = rng.standard_normal(op.K).astype(np.float32) if with_gain else None
    Fv = tf.Variable(F)
    gv = None if gain is None else tf.Variable(gain)
    with tf.GradientTape() as tape:
        out = op.l2_normalize(Fv, gain=gv, epsilon=1e-6)
    grads = tape.gradient(out, [Fv] + ([gv] if with_gain else []), output_gradients=tf.cast(dout, tf.float32))
    want, want_dF, want_dg = l2_normalize_products(ref, F, dout, gain, 1e-6)
    assert out.dtype == tf.float32 and out.shape == F.shape
    assert rel_error(out.numpy(), want) < 1e-5 and rel_error(grads[0].numpy(), want_dF) < 1e-5
    if with_gain:
        assert rel_error(grads[1].numpy(), want_dg) < 1e-5


def test_l2_normalize_forms_and_dtype(rng):
    op, ref = build(rng, "conv", "1d-same-s2", layout="uniform")
    F = rng.standard_normal(op.f_shape()).astype(np.float32)
    want = l2_normalize_products(ref, F, np.zeros_like(F))[0]
    stacked = op.l2_normalize(F, dtype=np.float16)
    blocks = op.l2_normalize(list(F))
    flat = op.l2_normalize(F.reshape(-1), dtype=tf.bfloat16)
    assert stacked.dtype == tf.float16 and rel_error(as_np(stacked), want) < tolerance("fp16")
    assert isinstance(blocks, list) and rel_error(np.stack([b.numpy() for b in blocks]), want) < 1e-6
    assert flat.shape == (F.size,) and rel_error(as_np(flat), want.reshape(-1)) < tolerance("bf16")
    with pytest.raises(ValueError, match=r"gain must have shape \(7,\) \(K, the output channels\)"):
        op.l2_normalize(F, gain=tf.ones([op.K + 1]))
    with pytest.raises(TypeError, match="dtype must be one of"):
        op.l2_normalize(F, dtype=tf.int32)
    with pytest.raises(ValueError, match="epsilon must be a positive float32 number"):
        op.l2_normalize(np.zeros_like(F), epsilon=1e-50)  # 0 in float32: a zero filter would be NaN


@pytest.mark.parametrize("kind", KINDS)
def test_l2_normalize_float64_gain(rng, kind):
    """A numpy or float64 gain is a parameter computed in float32 (as the matmul's); its gradient
    comes back in its own dtype."""
    op, ref = build(rng, kind, "1d-same-s2")
    F = rng.standard_normal(op.f_shape()).astype(np.float32)
    dout = rng.standard_normal(op.f_shape())
    gain = rng.standard_normal(op.K)
    want, _, want_dg = l2_normalize_products(ref, F, dout, gain, 1e-6)
    assert rel_error(op.l2_normalize(F, gain=gain).numpy(), want) < 1e-5
    gv = tf.Variable(gain)
    with tf.GradientTape() as tape:
        out = op.l2_normalize(F, gain=gv)
    dg = tape.gradient(out, gv, output_gradients=tf.cast(dout, tf.float32))
    assert out.dtype == tf.float32 and dg.dtype == tf.float64 and rel_error(dg.numpy(), want_dg) < 1e-5


def test_bad_inputs(rng):
    op, _ = build(rng, "conv", "2d-same-stride-dilate", layout="uniform")
    F, x, _, eb = random_inputs(rng, op)
    with pytest.raises(ValueError, match=r"I must have shape \(None, 7, 6, 5\) = i_shape\(N\)"):
        op(F, x[:, :3])
    with pytest.raises(ValueError, match="I must have rank 4"):
        op(F, x[0])
    with pytest.raises(TypeError, match="I must have dtype float32, float16 or bfloat16; got int32"):
        op(F, tf.cast(x, tf.int32))
    with pytest.raises(ValueError, match=r"F must have shape \(4, 2, 3, 3, 3\) or \(216,\)"):
        op(F[:3], x)
    with pytest.raises(ValueError, match="one filter per block"):
        op(list(F)[:3], x)
    with pytest.raises(ValueError, match=r"F\[1\] must have shape \(2, 3, 3, 3\) = f_shape\(1\)"):
        op([F[0], F[1, :1], F[2], F[3]], x)
    with pytest.raises(TypeError, match=r"F and I must have the same dtype \(or F float32 with float16 / bfloat16 I\); "
                                        r"got F float16 and I float32"):
        op(tf.cast(F, tf.float16), x)  # 16-bit filter, float32 input: no (the reverse is mixed precision)
    assert op(F, tf.cast(x, tf.float16), edge_bias=eb).dtype == tf.float16
    assert op.edge_bias_shape() == (7, 5)   # 3 column patterns x (top row or not), less the interior
    with pytest.raises(ValueError, match=r"edge_bias must have shape \(7, 5\) = edge_bias_shape\(\)"):
        op(F, x, edge_bias=eb[:, :2])
    with pytest.raises(TypeError, match=r"edge_bias and I must have the same dtype \(or edge_bias float32 with "
                                        r"float16 / bfloat16 I\); got edge_bias bfloat16 and I float32"):
        op(F, x, edge_bias=tf.cast(eb, tf.bfloat16))
    plain, _ = build(rng, "conv", "2d-same-stride-dilate", layout="uniform", edge_bias=False)
    assert plain.edge_bias_shape() == (plain.K, 0)
    with pytest.raises(ValueError, match=r"shape \(7, 0\) = edge_bias_shape\(\) \(built with edge_bias=False"):
        plain(F, x, edge_bias=eb)
    assert np.array_equal(plain(F, x, edge_bias=np.zeros((plain.K, 0), np.float32)).numpy(), plain(F, x).numpy())


def _mixed_call(op, F, x, dy, eb, dtype, f32):
    """``op`` on ``x`` in ``dtype`` with the parameters named in ``f32`` (``"F"``, ``"edge_bias"``) in
    float32, the others in ``dtype``: ``[y, dx, dF, d_edge_bias]`` and the tensors given."""
    x, dy = tf.cast(x, dtype), tf.cast(dy, dtype)
    F = tf.cast(F, tf.float32 if "F" in f32 else dtype)
    eb = tf.cast(eb, tf.float32 if "edge_bias" in f32 else dtype)
    with tf.GradientTape() as tape:
        tape.watch([x, F, eb])
        y = op(F, x, edge_bias=eb)
    return [y, *tape.gradient(y, [x, F, eb], output_gradients=dy)], (F, x, dy, eb)


MIXED = {"F": ("F",), "edge_bias": ("edge_bias",), "both": ("F", "edge_bias")}


@pytest.mark.parametrize("mode, f32", [(m, p) for m in ("eager", "function") for p in MIXED] + [("graph", "both")])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_float32_parameters_with_16bit_input(rng, path, kind, dtype, mode, f32):
    """Mixed precision as the original took it: a float32 filter (float32 master weights; cast to the
    input's dtype for the product) and a float32 edge bias (added in float32) with float16 / bfloat16
    activations.  The output and the input gradient are in the input's dtype, each parameter's gradient
    in its own; values against float64 (``tf.compat.v1`` graphs: float32 variables, both parameters)."""
    dtype, f32 = DTYPES[dtype], MIXED[f32]
    op, ref = build(rng, kind, "2d-explicit-asymmetric", layout="uniform")
    F, x, dy, eb = random_inputs(rng, op, N=3)
    if mode == "eager":
        outs, seen = _mixed_call(op, F, x, dy, eb, dtype, f32)
    elif mode == "function":
        pdt = {p: tf.float32 if p in f32 else dtype for p in ("F", "edge_bias")}
        spec = [tf.TensorSpec(op.f_shape(), pdt["F"]), tf.TensorSpec(op.i_shape(None), dtype),
                tf.TensorSpec(op.o_shape(None), dtype), tf.TensorSpec(op.edge_bias_shape(), pdt["edge_bias"])]
        step = tf.function(lambda *a: _mixed_call(op, *a, dtype, f32), input_signature=spec)
        args = [tf.cast(F, pdt["F"]), tf.cast(x, dtype), tf.cast(dy, dtype), tf.cast(eb, pdt["edge_bias"])]
        outs, seen = step(*args)
        empty, _ = step(args[0], args[1][:0], args[2][:0], args[3])  # the same trace, an empty minibatch
        assert step.experimental_get_tracing_count() == 1
        assert empty[0].shape == tuple(op.o_shape(0)) and empty[1].shape == tuple(op.i_shape(0))
        assert [g.dtype for g in empty[2:]] == [pdt["F"], pdt["edge_bias"]] and not any(np.any(g) for g in empty[2:])
    else:
        with tf.Graph().as_default():
            xp = tf.compat.v1.placeholder(tf.float32, op.i_shape(None))
            xt = tf.cast(xp, dtype)
            Fv = tf.compat.v1.get_variable("F", initializer=tf.constant(F))
            ebv = tf.compat.v1.get_variable("eb", initializer=tf.constant(eb))
            y = op(Fv, xt, edge_bias=ebv)
            grads = tf.gradients(y, [xt, Fv, ebv], grad_ys=tf.cast(dy, dtype))
            assert [t.dtype.base_dtype for t in [y, *grads]] == [dtype, dtype, tf.float32, tf.float32]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                outs = sess.run([y, *grads], {xp: x})
        seen = (F, tf.cast(x, dtype), tf.cast(dy, dtype), eb)
    if mode != "graph":
        want = [dtype, dtype] + [tf.float32 if p in f32 else dtype for p in ("F", "edge_bias")]
        assert [t.dtype for t in outs] == want
        assert outs[0].shape == tuple(op.o_shape(3))
    Fs, xs, dys, ebs = (as_np(v) for v in seen)
    Fs = as_np(tf.cast(Fs, dtype))  # the product sees the filter in the input's dtype
    refs = conv_products(ref, Fs, xs, dys, ebs)
    tol = tolerance(dtype.name)
    for name, got, want in zip(("y", "dx", "dF", "d_edge_bias"), outs, refs):
        err = rel_error(as_np(got), want)
        assert err < tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_float32_filter_is_cast_to_the_input_dtype(rng, dtype):
    """A float32 filter gives the output of the same filter cast to the 16-bit input's dtype (the product
    runs in that dtype on every device) -- the same bits; a float32 edge bias with it too."""
    dtype = DTYPES[dtype]
    op, _ = build(rng, "conv", "2d-explicit-asymmetric", layout="uniform")
    F, x, _, eb = random_inputs(rng, op)
    x = tf.cast(x, dtype)
    assert np.array_equal(as_np(op(F, x)), as_np(op(tf.cast(F, dtype), x)))
    assert np.array_equal(as_np(op(list(F), x, edge_bias=eb)), as_np(op(tf.cast(F, dtype), x, edge_bias=eb)))


@pytest.mark.parametrize("F_dtype, eb_dtype, x_dtype, bad", [
    ("float16", "float32", "float32", "F"),
    ("bfloat16", "float32", "float32", "F"),
    ("float16", "bfloat16", "bfloat16", "F"),
    ("bfloat16", "float16", "float16", "F"),
    ("float32", "float16", "float32", "edge_bias"),
    ("float32", "bfloat16", "float32", "edge_bias"),
    ("float32", "float16", "bfloat16", "edge_bias"),
    ("float32", "bfloat16", "float16", "edge_bias"),
])
def test_other_dtype_mismatches_raise(rng, F_dtype, eb_dtype, x_dtype, bad):
    """Only float32 parameters go with 16-bit input: any other mismatch is a TypeError naming the argument."""
    op, _ = build(rng, "conv", "2d-explicit-asymmetric", layout="uniform")
    F, x, _, eb = random_inputs(rng, op)
    got = {"F": F_dtype, "edge_bias": eb_dtype}[bad]
    with pytest.raises(TypeError, match=rf"^{bad} and I must have the same dtype \(or {bad} float32 with float16 / "
                                        rf"bfloat16 I\); got {bad} {got} and I {x_dtype}$"):
        op(tf.cast(F, F_dtype), tf.cast(x, x_dtype), edge_bias=tf.cast(eb, eb_dtype))


def test_filter_list_of_mixed_dtypes_raises(rng):
    """A list of block filters has one dtype (float32 filters with 16-bit input are all float32)."""
    op, _ = build(rng, "conv", "2d-explicit-asymmetric", layout="uniform")
    F, x, _, _ = random_inputs(rng, op)
    with pytest.raises(TypeError, match=r"^F\[1\] and F\[0\] must have the same dtype"):
        op([tf.cast(F[0], tf.float16), *F[1:]], tf.cast(x, tf.float16))


@pytest.mark.parametrize("name", ["F", "edge_bias"])
@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_parameters_of_other_dtypes_raise(rng, name, dtype):
    op, _ = build(rng, "conv", "2d-explicit-asymmetric", layout="uniform")
    F, x, _, eb = random_inputs(rng, op)
    args = {"F": F, "edge_bias": eb}
    args[name] = tf.cast(args[name], dtype)
    with pytest.raises(TypeError, match=rf"^{name} must have dtype float32, float16 or bfloat16; got {dtype}$"):
        op(args["F"], tf.cast(x, tf.float16), edge_bias=args["edge_bias"])


def test_unknown_keyword_names_the_public_class():
    """``path=`` is PyTorch's: TensorFlow's classes reject it, naming themselves (not an internal base)."""
    for cls in (BlocksparseConv, BlocksparseDeconv):
        with pytest.raises(TypeError, match=r"BlocksparseConv.__init__\(\) got an unexpected keyword argument 'path'"):
            cls([(range(2), range(2))], (3,), (8,), path="dense")


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_edge_bias_without_edge_positions_has_a_gradient(rng, mode):
    """With no padded positions (VALID) the edge bias is (K, 0): its gradient is that empty tensor,
    not None (training loops warn about or drop variables without a gradient)."""
    BCK = [(range(0, 3), range(0, 2)), (range(3, 6), range(2, 4))]
    op = BlocksparseConv(BCK, TRS=(3,), DHW=(7,), padding="VALID", edge_bias=True)
    assert op.edge_bias_shape() == (4, 0)
    F = rng.standard_normal(op.f_shape()).astype(np.float32)
    x = rng.standard_normal(op.i_shape(2)).astype(np.float32)
    eb = np.zeros(op.edge_bias_shape(), np.float32)

    def grads(F, x, eb):
        with tf.GradientTape() as tape:
            tape.watch([F, x, eb])
            y = op(F, x, edge_bias=eb)
            loss = tf.reduce_sum(y * y)
        return (y, *tape.gradient(loss, [F, x, eb]))

    if mode == "graph":
        with tf.Graph().as_default():
            ins = [tf.compat.v1.placeholder(tf.float32, a.shape) for a in (F, x, eb)]
            y = op(*ins[:2], edge_bias=ins[2])
            outs = [y, *tf.compat.v1.gradients(tf.reduce_sum(y * y), ins)]
            with tf.compat.v1.Session() as sess:
                got = sess.run(outs, dict(zip(ins, (F, x, eb))))
    else:
        fn = tf.function(grads) if mode == "function" else grads
        got = [t.numpy() for t in fn(*(tf.constant(a) for a in (F, x, eb)))]
    y, dF, dx, deb = got
    assert deb.shape == (4, 0) and dF.shape == F.shape and dx.shape == x.shape
    plain = op(F, x).numpy()
    assert np.array_equal(y, plain) and np.abs(plain).max() > 0


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_float32_edge_bias_without_edge_positions(rng, dtype):
    """A float32 edge bias of shape (K, 0) (no padded positions) with 16-bit input: nothing added, an
    empty float32 gradient."""
    dtype = DTYPES[dtype]
    op = BlocksparseConv([(range(0, 3), range(0, 2))], TRS=(3,), DHW=(7,), padding="VALID", edge_bias=True)
    F = tf.constant(rng.standard_normal(op.f_shape()), tf.float32)
    x = tf.cast(rng.standard_normal(op.i_shape(2)), dtype)
    eb = tf.zeros(op.edge_bias_shape(), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([F, eb])
        y = op(F, x, edge_bias=eb)
    dF, deb = tape.gradient(y, [F, eb])
    assert y.dtype == dtype and np.array_equal(as_np(y), as_np(op(F, x)))
    assert dF.dtype == tf.float32 and deb.dtype == tf.float32 and deb.shape == (2, 0)


def test_unknown_sizes_checked_when_the_graph_runs(rng):
    op, _ = build(rng, "conv", "1d-same-s2", layout="uniform")
    F, x, _, _ = random_inputs(rng, op)
    with tf.Graph().as_default():
        xp = tf.compat.v1.placeholder(tf.float32, [None, None, None])
        y = op(F, xp)
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {xp: x}).shape == tuple(op.o_shape(2))
            with pytest.raises(tf.errors.InvalidArgumentError, match="I must have shape"):
                sess.run(y, {xp: x[:, :2]})


def test_input_of_unknown_rank_checked_when_the_graph_runs(rng):
    """A tf.compat.v1 input of unknown rank: the right rank runs, another rank fails naming ``I``
    (not an op inside the convolution)."""
    op, ref = build(rng, "conv", "2d-same-stride-dilate", layout="uniform", edge_bias=False)
    F, x, dy, _ = random_inputs(rng, op)
    with tf.Graph().as_default():
        xp = tf.compat.v1.placeholder(tf.float32, None)
        y = op(F, xp)
        with tf.compat.v1.Session() as sess:
            assert rel_error(sess.run(y, {xp: x}), conv_products(ref, F, x, dy)[0]) < 1e-5
            for wrong in (x[..., None], x[0]):
                with pytest.raises(tf.errors.InvalidArgumentError, match=r"I must have (rank|shape)|I_must_have_rank_4"):
                    sess.run(y, {xp: wrong})


def test_filter_of_unknown_rank_checked_when_the_graph_runs(rng):
    """A filter of unknown rank is taken in either form (stacked or flat) and nothing else of its
    size: a wrongly shaped filter with the right element count fails, naming ``F``."""
    op, ref = build(rng, "conv", "2d-same-stride-dilate", layout="uniform", edge_bias=False)
    F, x, dy, _ = random_inputs(rng, op)
    spec = [tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.float32)]
    conv = tf.function(lambda F, x: op(F, x), input_signature=spec)
    norm = tf.function(lambda F: op.l2_normalize(F), input_signature=spec[:1])
    want = conv_products(ref, F, x, dy)[0]
    for form in (F, F.reshape(-1)):
        assert rel_error(conv(form, x), want) < 1e-5
        assert norm(form).shape == form.shape
    wrong = F.reshape(F.shape[0], -1)  # the right element count, neither form
    for call in (lambda: conv(wrong, x), lambda: norm(wrong)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"F must have shape"):
            call()


def test_module_doctest():
    result = doctest.testmod(blocksparse.conv, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("kind, bck, TRS, DHW, strides, padding", [
    ("conv", [([0], [0, 1])], (3, 4), (6, 4), (1, 3), "VALID"),
    ("conv", [([0], [0, 4, 2])], (2, 4), (6, 3), (1, 3), "SAME"),
    ("conv", [([0], [0])], (2, 3, 4), (1, 4, 1), (2, 1, 3), "SAME"),
    ("deconv", [([0, 1], [0])], (3, 2), (6, 1), (1, 3), "SAME"),
    ("deconv", [([0], [0, 1])], (3, 2), (6, 1), (1, 3), "SAME"),
], ids=["conv-1-in", "conv-1-in-same", "conv3d-1-in", "deconv-1-out", "deconv-1-in"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_single_channels_with_strides(rng, kind, bck, TRS, DHW, strides, padding, mode):
    """One input (or, transposed, output) channel, strides and a one-wide output, a batch of several:
    TensorFlow's CPU convolution read past its buffers there (outputs ~1e35, no error); the layer
    widens such operands to two channels."""
    cls = BlocksparseConv if kind == "conv" else BlocksparseDeconv
    op = cls(bck, TRS, DHW, strides=strides, padding=padding, edge_bias=True)
    F, x, dy, eb = random_inputs(rng, op, N=3)
    check(op, case_of(op, bck, padding, kind == "deconv"), F, x, dy, eb, mode=mode)


def _square(kind):
    """A layer whose output has its input's shape (4 channels, 4 x 4, SAME, unit steps), and its Case."""
    bck = [((0, 1), (0, 1)), ((2, 3), (2, 3)), ((0, 1), (2, 3))]
    op = KINDS[kind](bck, TRS=(3, 3), DHW=(4, 4))
    return op, case_of(op, bck, "SAME", op.spec.transposed)


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_through_a_loop_with_unknown_minibatch(rng, kind):
    """The layer applied twice in ``tf.while_loop`` / ``tf.cond`` / under a second derivative, with the
    minibatch unknown (``input_signature``): the gradient graph builds (the empty-batch branch's gradient
    once captured tensors of its branch) and matches float64."""
    op, case = _square(kind)
    F = rng.standard_normal(op.f_shape()).astype(np.float32)
    x = rng.standard_normal(op.i_shape(3)).astype(np.float32)
    Ft = tf.constant(F)

    @tf.function(input_signature=[tf.TensorSpec(op.i_shape(None), tf.float32)])
    def loop(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            _, y = tf.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, op(Ft, h)), (0, x))
            y = tf.cond(tf.reduce_sum(y) > -1e30, lambda: y, lambda: -y)  # a user's cond around it
            loss = tf.reduce_sum(y * y)
        return loss, tape.gradient(loss, x)

    loss, dx = loop(tf.constant(x))
    y1 = conv_products(case, F, x, np.zeros(op.o_shape(3)))[0]
    y2 = conv_products(case, F, y1, np.zeros(op.o_shape(3)))[0]
    d1 = conv_products(case, F, y1, 2 * y2)[1]
    want = conv_products(case, F, x, d1)[1]
    assert rel_error(as_np(loss), np.sum(y2 * y2)) < 1e-5
    assert rel_error(as_np(dx), want) < 1e-4

    @tf.function(input_signature=[tf.TensorSpec(op.i_shape(None), tf.float32)] * 2)
    def hvp(x, v):  # the layer is linear in x: the Hessian-vector product of sum(y^2) is 2 A^T A v
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = tf.reduce_sum(op(Ft, x) ** 2)
            g = inner.gradient(loss, x)
        return outer.gradient(g, x, output_gradients=v)

    v = rng.standard_normal(op.i_shape(3)).astype(np.float32)
    av = conv_products(case, F, v, np.zeros(op.o_shape(3)))[0]
    assert rel_error(as_np(hvp(tf.constant(x), tf.constant(v))), conv_products(case, F, v, 2 * av)[1]) < 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_tensorflow1_shapes(rng, kind):
    """Under ``tf.compat.v1.disable_v2_tensorshape()`` (code ported from TensorFlow 1) an unknown
    minibatch is a ``Dimension(None)``: the layer computes, it does not take it for an empty batch."""
    op, case = _square(kind)
    F, x, _, _ = random_inputs(rng, op, N=2)
    tf.compat.v1.disable_v2_tensorshape()
    try:
        with tf.Graph().as_default():
            xp = tf.compat.v1.placeholder(tf.float32, op.i_shape(None))
            y = op(tf.constant(F), xp)
            with tf.compat.v1.Session() as sess:
                got = sess.run(y, {xp: x})
    finally:
        tf.compat.v1.enable_v2_tensorshape()
    assert rel_error(got, conv_products(case, F, x, np.zeros(op.o_shape(2)))[0]) < 1e-5
