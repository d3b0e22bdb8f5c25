"""Second acceptance audit of the TensorFlow side: ``blocksparse.pixelfly.PixelflyDense`` (block sizes
1 and 256 against float64, the documented positional form, an unknown batch in ``tf.function``,
``tf.compat.v1`` graphs, XLA, an empty batch, bad arguments, ``plan``) and ``BlocksparseMatMul``
planning with the same cost model on the CPU (fully dense and one-block layouts on every impl)."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from blocksparse.dispatch import PREFERENCE, Plan  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout  # noqa: E402
from blocksparse.matmul import BlocksparseMatMul  # noqa: E402
from blocksparse.pixelfly import PixelflyDense  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import dense_products  # noqa: E402


def _values(layer):
    """The layer's weights as float64 numpy arrays by name (``kernel``, ``lowrank_in``, ``lowrank_out``, ``bias``)."""
    return {w.name.split("/")[-1].split(":")[0]: w.numpy().astype(np.float64) for w in layer.weights}


def _dense(values, mask, bs):
    """float64 ``(in, units)`` matrix: the packed ``kernel`` blocks where ``mask`` (row-major), plus the
    low-rank term."""
    dense = np.zeros((mask.shape[0] * bs, mask.shape[1] * bs))
    for b, (c, k) in enumerate(np.argwhere(mask)):
        dense[c * bs:(c + 1) * bs, k * bs:(k + 1) * bs] = values["kernel"][b]
    if "lowrank_in" in values:
        dense += values["lowrank_in"] @ values["lowrank_out"]
    return dense


def _check(values, mask, bs, x, dy, y, dx, dkernel, dtype=tf.float32):
    """``y``, ``dx`` and the kernel's gradient against float64 (``dy``: the output's cotangent)."""
    dense = _dense(values, mask, bs)
    xn = np.asarray(x, np.float64).reshape(-1, dense.shape[0])
    dyn = np.asarray(dy, np.float64).reshape(-1, dense.shape[1])
    tol = tolerance(dtype)
    assert y.shape == (*x.shape[:-1], dense.shape[1])
    assert rel_error(np.reshape(y, dyn.shape), xn @ dense + values.get("bias", 0)) < tol
    assert rel_error(np.reshape(dx, xn.shape), dyn @ dense.T) < tol
    ref_dw = np.stack([xn[:, c * bs:(c + 1) * bs].T @ dyn[:, k * bs:(k + 1) * bs] for c, k in np.argwhere(mask)])
    assert rel_error(dkernel, ref_dw) < tol


def _eager(layer, x, dy):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(y * tf.cast(dy, y.dtype))
    dx, dkernel = tape.gradient(loss, [x, layer.kernel])
    return y.numpy(), dx.numpy(), dkernel.numpy()


CASES = {  # id: (units, in, block size, butterfly size, n_factors, lowrank)
    "bs1": (16, 8, 1, 4, None, 2),
    "bs256": (512, 256, 256, 2, 1, 0),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("impl", ["auto", "portable", "dense", "reference"])
@pytest.mark.parametrize("name", list(CASES))
def test_any_block_size_against_float64(rng, name, impl, dtype):
    units, fin, bs, n, f, r = CASES[name]
    layer = PixelflyDense(units, bs, n, f, r, True, impl=impl, dtype=dtype)   # the documented positional form
    x = rng.standard_normal((2, 3, fin)).astype(dtype)
    dy = rng.standard_normal((2, 3, units)).astype(dtype)
    y, dx, dkernel = _eager(layer, x, dy)
    mask = butterfly_layout(fin, units, bs, n, f)
    np.testing.assert_array_equal(layer.layout.mask, mask)
    _check(_values(layer), mask, bs, x, dy, y, dx, dkernel, dtype)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_unknown_batch_in_tf_function(rng, impl):
    """One trace for every batch size (rank 3, both leading sizes unknown), gradients included."""
    layer = PixelflyDense(24, 3, butterfly_size=4, lowrank_size=2, impl=impl)
    layer.build((None, 12))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 12], tf.float32),
                                  tf.TensorSpec([None, None, 24], tf.float32)])
    def step(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * dy)
        return (y, *tape.gradient(loss, [x, layer.kernel]))

    mask = butterfly_layout(12, 24, 3, 4)
    for lead in [(2, 5), (1, 1), (3, 2)]:
        x = rng.standard_normal((*lead, 12)).astype(np.float32)
        dy = rng.standard_normal((*lead, 24)).astype(np.float32)
        y, dx, dkernel = step(x, dy)
        _check(_values(layer), mask, 3, x, dy, y.numpy(), dx.numpy(), dkernel.numpy())
    assert step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_compat_v1_graph(rng, impl):
    x = rng.standard_normal((5, 12)).astype(np.float32)
    dy = rng.standard_normal((5, 24)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        ph = tf.compat.v1.placeholder(tf.float32, [None, 12])
        layer = PixelflyDense(24, 3, butterfly_size=4, lowrank_size=2, impl=impl)
        y = layer(ph)
        dx, dkernel = tf.gradients(y, [ph, layer.kernel], grad_ys=tf.constant(dy))
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out = sess.run([y, dx, dkernel], {ph: x})
            values = {w.name.split("/")[-1].split(":")[0]: v.astype(np.float64)
                      for w, v in zip(layer.weights, sess.run([w.value for w in layer.weights]))}
    _check(values, butterfly_layout(12, 24, 3, 4), 3, x, dy, *out)


@pytest.mark.parametrize("impl", ["portable", "dense"])
def test_xla_compiled(rng, impl):
    """The portable and dense paths run under XLA (``jit_compile=True``), as README says."""
    layer = PixelflyDense(24, 3, butterfly_size=4, lowrank_size=2, impl=impl)
    x = rng.standard_normal((4, 12)).astype(np.float32)
    y = tf.function(layer, jit_compile=True)(tf.constant(x))
    values = _values(layer)
    ref = x @ _dense(values, butterfly_layout(12, 24, 3, 4), 3) + values["bias"]
    assert rel_error(y.numpy(), ref) < tolerance(tf.float32)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense", "reference"])
def test_empty_batch(rng, impl):
    layer = PixelflyDense(24, 3, butterfly_size=4, lowrank_size=2, impl=impl)
    x = np.zeros((0, 12), np.float32)
    y, dx, dkernel = _eager(layer, x, np.zeros((0, 24), np.float32))
    assert y.shape == (0, 24) and dx.shape == (0, 12)
    np.testing.assert_array_equal(dkernel, np.zeros(layer.layout.w_shape))


@pytest.mark.parametrize("kwargs, err, words", [
    ({"units": "64", "block_size": 16}, TypeError, "units must be an int"),
    ({"units": 64.0, "block_size": 16}, TypeError, "units must be an int"),
    ({"units": 64, "block_size": None}, TypeError, "block_size must be an int"),
    ({"units": 64, "block_size": 16, "lowrank_size": 1.5}, TypeError, "lowrank_size must be an int"),
    ({"units": 64, "block_size": 16, "butterfly_size": 3}, ValueError, "butterfly_size must be a power of two"),
    ({"units": 64, "block_size": 16, "butterfly_size": 4, "n_factors": 3}, ValueError, "n_factors must be in 1..log2"),
], ids=["units-str", "units-float", "block-None", "lowrank-float", "butterfly-3", "factors-too-many"])
def test_bad_arguments_are_refused_when_made(kwargs, err, words):
    with pytest.raises(err, match=words):
        PixelflyDense(**kwargs)


@pytest.mark.parametrize("tokens, err, words", [("8", TypeError, "tokens must be an int"),
                                                (2.5, TypeError, "tokens must be an int"),
                                                (0, ValueError, "tokens must be >= 1"),
                                                (-3, ValueError, "tokens must be >= 1")],
                         ids=["str", "float", "zero", "negative"])
def test_plan_refuses_bad_tokens(tokens, err, words):
    layer = PixelflyDense(32, 16)
    layer.build((None, 32))
    with pytest.raises(err, match=words):
        layer.plan(tokens)


def test_plan_uses_the_same_model_as_blocksparse_matmul():
    """``PixelflyDense.plan`` and ``BlocksparseMatMul.plan`` answer one problem with one model (the
    shipped CPU table), and the answer is the margin rule's choice among the expected times."""
    layer = PixelflyDense(128, 16, butterfly_size=4, n_factors=1)
    layer.build((None, 64))
    bsmm = BlocksparseMatMul(layer.layout.mask, block_size=16)
    for tokens in (1, 64, 4096):
        plan = layer.plan(tokens)
        assert isinstance(plan, Plan) and plan == bsmm.plan(tokens)
        times = dict(plan.times_ms)
        assert plan.source.endswith("cpu.json") and set(times) == {"dense", "portable", "reference"}
        best = min(times.values())
        assert plan.impl == next(i for i in PREFERENCE if i in times and times[i] <= 1.05 * best)
    assert layer.plan() == bsmm.plan()          # both default to the model's token count


LAYOUTS = {"dense": np.ones((2, 3), int), "one-block": np.array([[0, 0], [0, 1], [0, 0]]), "1x1": np.ones((1, 1), int)}


@pytest.mark.parametrize("impl", ["auto", "portable", "dense", "reference"])
@pytest.mark.parametrize("axis", [1, 0], ids=["feature_axis1", "feature_axis0"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_matmul_dense_and_one_block_layouts(rng, name, axis, impl):
    bsmm = BlocksparseMatMul(LAYOUTS[name], block_size=8, feature_axis=axis, impl=impl)
    x = tf.constant(rng.standard_normal(bsmm.i_shape(3)).astype(np.float32))
    w = tf.constant(rng.standard_normal(bsmm.w_shape).astype(np.float32))
    dy = rng.standard_normal(bsmm.o_shape(3)).astype(np.float32)
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = bsmm(x, w)
    dx, dw = tape.gradient(y, [x, w], output_gradients=tf.constant(dy))
    ref_y, ref_dx, ref_dw = dense_products(bsmm.layout, x.numpy(), w.numpy(), dy, axis)
    for got, ref in ((y, ref_y), (dx, ref_dx), (dw, ref_dw)):
        assert rel_error(got.numpy(), ref) < tolerance(tf.float32)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense", "reference"])
@pytest.mark.parametrize("policy", ["float16", "bfloat16", "mixed_float16", "float64"])
def test_dtype_policies(rng, policy, impl):
    """Keras dtype policies: outputs in the compute dtype within its tolerance of float64; weights in the
    variable dtype, and so are their gradients."""
    layer = PixelflyDense(24, 3, butterfly_size=4, lowrank_size=2, impl=impl, dtype=policy)
    x = rng.standard_normal((4, 12)).astype(np.float32)
    with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32))
    grads = tape.gradient(loss, layer.trainable_weights)
    compute = keras.DTypePolicy(policy).compute_dtype
    assert y.dtype == compute and all(g.dtype == w.dtype for g, w in zip(grads, layer.trainable_weights))
    values = _values(layer)
    xc = tf.cast(tf.cast(x, compute), tf.float64).numpy()    # the input as the layer sees it
    ref = xc @ _dense(values, butterfly_layout(12, 24, 3, 4), 3) + values["bias"]
    assert rel_error(tf.cast(y, tf.float64).numpy(), ref) < tolerance(compute)
