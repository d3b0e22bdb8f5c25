"""TensorFlow: the portable and dense-masked products against float64 for block sizes 1, 3, 48 and
256 on both feature axes (values and gradients, eager, graphs with an unknown minibatch, XLA), and
BlocksparseMatMul's dispatch on the CPU: every implementation gives the same answer, plan() says
which runs, the override and BLOCKSPARSE_BACKEND win."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from blocksparse._tf.matmul import autodiff, backend  # noqa: E402
from blocksparse.dispatch import CostModel, Plan, Table  # noqa: E402
from blocksparse.layout import Layout  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout  # noqa: E402
from blocksparse.matmul import BlocksparseMatMul, group_param_grads  # noqa: E402
from blocksparse.testing import rel_error, rounded_once_bound, tolerance  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402

PRODUCTS = {"portable": backend.PORTABLE, "dense": backend.DENSE, "reference": backend.REFERENCE}


def _case(rng, lay, axis, n):
    x = rng.standard_normal((n, lay.C) if axis else (lay.C, n)).astype(np.float32)
    w = (rng.standard_normal(lay.w_shape) / np.sqrt(lay.block_size)).astype(np.float32)
    dy = rng.standard_normal((n, lay.K) if axis else (lay.K, n)).astype(np.float32)
    return x, w, dy


def _eager(products, lay, axis, x, w, dy, dtype, dw_dtype):
    x, w, dy = (tf.cast(a, dtype) for a in (x, w, dy))
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = autodiff.matmul(x, w, lay, axis, dw_dtype, products)
    dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
    return (y, dx, dw), (x, w, dy)


def check(products, lay, axis, x, w, dy, dtype=tf.float32, dw_dtype=tf.float32):
    (y, dx, dw), seen = _eager(products, lay, axis, x, w, dy, dtype, dw_dtype)
    assert (y.dtype, dx.dtype, dw.dtype) == (dtype, dtype, dw_dtype)
    refs = dense_products(lay, *(tf.cast(a, tf.float64).numpy() for a in seen), axis)
    tol = tolerance(dtype.name)
    tols = (tol, tol, max(tol / 10, tolerance(dw_dtype.name)))
    for name, got, ref, t in zip(("y", "dx", "dw"), (y, dx, dw), refs, tols):
        assert rel_error(tf.cast(got, tf.float64).numpy(), ref) < t, f"{products.name} {name}"


@pytest.mark.parametrize("impl", list(PRODUCTS))
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1", "axis0"])
@pytest.mark.parametrize("bs, cb, kb", [(1, 20, 30), (3, 8, 6), (48, 3, 4), (256, 2, 2)],
                         ids=["bs1", "bs3", "bs48", "bs256"])
def test_any_block_size(rng, impl, axis, bs, cb, kb):
    lay = Layout(random_layout(rng, cb, kb, 0.5, empty_rows=1, empty_cols=1), bs, any_block_size=True)
    check(PRODUCTS[impl], lay, axis, *_case(rng, lay, axis, 5))


def test_layers_take_a_cost_model(rng, monkeypatch):
    """``cost_model=``: BlocksparseMatMul and PixelflyDense decide from the given table, plan and
    call alike (what runs is the planned implementation); pickles keep it; a wrong type is refused."""
    import pickle

    from blocksparse.pixelfly import PixelflyDense

    monkeypatch.delenv("BLOCKSPARSE_BACKEND", raising=False)
    ran = []
    real = autodiff.matmul
    monkeypatch.setattr(autodiff, "matmul", lambda *a: ran.append(a[-1]) or real(*a))
    lay = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]])
    for fast, products in (("portable", backend.PORTABLE), ("dense", backend.DENSE)):
        times = {"portable": 1.0, "dense": 3.0, "reference": 2.0} if fast == "portable" else \
            {"portable": 3.0, "dense": 1.0, "reference": 2.0}
        model = _model(**times)
        bsmm = BlocksparseMatMul(lay, 32, cost_model=model)
        assert bsmm.plan(64).impl == fast and pickle.loads(pickle.dumps(bsmm)).plan(64).impl == fast
        x, w = rng.standard_normal(bsmm.i_shape(64)), rng.standard_normal(bsmm.w_shape)
        y = bsmm(tf.constant(x, tf.float32), tf.constant(w, tf.float32))
        want = dense_products(bsmm.layout, x, w, np.zeros(bsmm.o_shape(64)), 1)[0]
        assert ran[-1] is products and rel_error(y, want) < tolerance(tf.float32)
        layer = PixelflyDense(128, 32, 2, cost_model=model)
        layer(tf.zeros((64, 96)))
        assert layer.plan(64).impl == fast and ran[-1] is products
        assert "cost_model" not in layer.get_config()
    # eager calls plan once per problem, a given model as the shipped one
    planned = []
    real_choose = CostModel._choose
    monkeypatch.setattr(CostModel, "_choose", lambda self, p, c: planned.append(p) or real_choose(self, p, c))
    bsmm = BlocksparseMatMul(lay, 32, cost_model=_model(portable=1.0, dense=3.0))
    for _ in range(3):
        bsmm(tf.constant(x, tf.float32), tf.constant(w, tf.float32))
    assert len(planned) == 1
    with pytest.raises(TypeError, match="cost_model must be a blocksparse.dispatch.CostModel"):
        BlocksparseMatMul(lay, 32, cost_model={"dense": 1.0})
    with pytest.raises(TypeError, match="cost_model must be a blocksparse.dispatch.CostModel"):
        PixelflyDense(128, 32, 2, cost_model="table.json")


@pytest.mark.parametrize("impl", ["portable", "dense"])
@pytest.mark.parametrize("bs", [1, 3, 48, 256], ids=["bs1", "bs3", "bs48", "bs256"])
def test_butterflies(rng, impl, bs):
    lay = Layout(butterfly_layout(4 * bs, 8 * bs, bs, 4), bs, any_block_size=True, z_order=True)
    check(PRODUCTS[impl], lay, 1, *_case(rng, lay, 1, 3))


@pytest.mark.parametrize("dtype, dw_dtype", [(tf.float16, tf.float32), (tf.bfloat16, tf.float32),
                                             (tf.bfloat16, tf.bfloat16)],
                         ids=["fp16-dw32", "bf16-dw32", "bf16-dw16"])
@pytest.mark.parametrize("impl", ["portable", "dense"])
def test_low_precision(rng, impl, dtype, dw_dtype):
    lay = Layout(random_layout(rng, 4, 5, 0.5), 16)
    check(PRODUCTS[impl], lay, 1, *_case(rng, lay, 1, 33), dtype=dtype, dw_dtype=dw_dtype)


@pytest.mark.parametrize("dtype, dw_dtype", [(tf.bfloat16, tf.float16), (tf.float16, tf.bfloat16)],
                         ids=["bf16-dw16", "fp16-dwbf16"])
@pytest.mark.parametrize("impl", list(PRODUCTS))
def test_dw_in_the_other_16_bit_type(rng, impl, dtype, dw_dtype):
    """dW asked in the other 16-bit type is the float32 sum rounded once to ``dw_dtype``: float16's
    precision from bf16 inputs, bfloat16's range from float16 inputs (sums past 65504 stay finite)."""
    lay = Layout(random_layout(rng, 3, 4, 0.5), 16)
    x, w, dy = _case(rng, lay, 1, 48)
    if dtype == tf.float16:
        x, dy = x * 60, dy * 60              # products of ~3600 summed over 48 tokens: past float16's range
    (_, _, dw), seen = _eager(PRODUCTS[impl], lay, 1, x, w, dy, dtype, dw_dtype)
    exact = dense_products(lay, *(tf.cast(a, tf.float64).numpy() for a in seen), 1)[2]
    once = tf.cast(tf.cast(exact, tf.float32), dw_dtype)
    got = tf.cast(dw, tf.float64).numpy()
    assert np.isfinite(got).all()
    assert rel_error(got, exact) < tolerance(dw_dtype.name)
    # rounded once: got is within one ulp of dw_dtype of the float32 rounding of the exact sum, give or take
    # what a float32 sum of 48 terms in another order may lose (cancelling sums lose more than their last bit)
    once = tf.cast(once, tf.float64).numpy()
    magnitude = dense_products(lay, *(np.abs(tf.cast(a, tf.float64).numpy()) for a in seen), 1)[2]
    order = 48 * 2.0 ** -24 * magnitude
    ulp = np.maximum(np.abs(once), np.abs(got)) * (2.0 ** -10 if dw_dtype == tf.float16 else 2.0 ** -7)
    assert (np.abs(got - once) <= ulp + order + 1e-30).all()


@pytest.mark.parametrize("impl", ["portable", "dense"])
@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_unknown_minibatch_and_xla(rng, impl, jit):
    bsmm = BlocksparseMatMul(random_layout(rng, 3, 4, 0.5, empty_cols=1), 16, impl=impl)
    x, w, dy = _case(rng, bsmm.layout, 1, 7)

    @tf.function(jit_compile=jit, input_signature=[tf.TensorSpec((None, bsmm.C)), tf.TensorSpec(bsmm.w_shape),
                                                   tf.TensorSpec((None, bsmm.K))])
    def step(x, w, dy):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = bsmm(x, w)
        return (y, *tape.gradient(y, [x, w], output_gradients=dy))

    outs = step(x, w, dy)
    refs = dense_products(bsmm.layout, x, w, dy, 1)
    for got, ref in zip(outs, refs):
        assert rel_error(got.numpy(), ref) < 1e-5


def test_every_impl_gives_the_same_answer(rng):
    """BlocksparseMatMul on the CPU: auto and each forced implementation agree."""
    mask = random_layout(rng, 6, 5, 0.4, empty_rows=1)
    x, w, dy = _case(rng, Layout(mask, 32), 0, 9)
    outs = {}
    for impl in ("auto", "portable", "dense", "reference"):
        bsmm = BlocksparseMatMul(mask, 32, feature_axis=0, impl=impl)
        (y, dx, dw), _ = _eager(backend.choose(bsmm.layout, 0, tf.float32, 9, impl), bsmm.layout, 0, x, w, dy,
                                tf.float32, tf.float32)
        np.testing.assert_allclose(bsmm(x, w).numpy(), y.numpy(), rtol=1e-6, atol=1e-6)
        outs[impl] = [t.numpy() for t in (y, dx, dw)]
    for impl, vals in outs.items():
        for a, b in zip(vals, outs["reference"]):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=impl)


def _model(**times):
    rows = [{"tokens": 64, "in_features": 96, "out_features": 128, "block_size": 32, "density": 0.5,
             "dtype": "float32", "fwd_ms": times, "fwdbwd_ms": times}]
    return CostModel(Table.from_dict({"format": 1, "framework": "tensorflow", "device": "cpu", "rows": rows}))


def test_plan_and_choice_from_a_table(monkeypatch):
    lay = Layout(np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]), 32)
    assert lay.density == 0.5
    plan, products = backend.plan(lay, 1, tf.float32, 64, cost_model=_model(dense=3.0, portable=1.0, reference=2.0))
    assert isinstance(plan, Plan) and plan.impl == "portable" and products is backend.PORTABLE
    plan, products = backend.plan(lay, 1, tf.float32, 64, cost_model=_model(dense=1.03, portable=1.0))
    assert plan.impl == "dense" and products is backend.DENSE and "within 5%" in plan.why
    plan, products = backend.plan(lay, 1, tf.float32, 64, impl="reference", cost_model=_model(dense=1.0))
    assert (plan.impl, plan.source, products) == ("reference", "override", backend.REFERENCE)
    with pytest.raises(backend.BackendUnavailableError, match="impl='kernels' asks for the GPU kernels"):
        backend.plan(lay, 1, tf.float32, 64, impl="kernels")
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    plan, products = backend.plan(lay, 1, tf.float32, 64, impl="dense")
    assert products is backend.REFERENCE and "BLOCKSPARSE_BACKEND=reference" in plan.why


def test_blocksparse_matmul_plan_on_the_cpu():
    bsmm = BlocksparseMatMul(np.eye(4, dtype=int), 32)
    plan = bsmm.plan(1024)
    assert plan.impl in ("portable", "dense", "reference") and plan.why
    assert BlocksparseMatMul(np.eye(4, dtype=int), 32, impl="dense").plan().impl == "dense"
    with pytest.raises(ValueError, match="impl must be one of"):
        BlocksparseMatMul(np.eye(4, dtype=int), 32, impl="fast")
    with pytest.raises(ValueError, match="N must be >= 1"):
        bsmm.plan(0)
    assert "impl='auto'" in repr(bsmm)


def test_pickle_keeps_impl():
    import pickle

    bsmm = BlocksparseMatMul(np.eye(2, dtype=int), 16, impl="portable")
    assert pickle.loads(pickle.dumps(bsmm)).impl == "portable"
    old = BlocksparseMatMul.__new__(BlocksparseMatMul)
    old.__setstate__((np.eye(2, dtype=bool), 16, 1, False, "old"))    # a pickle from before impl=
    assert old.impl == "auto" and old.name == "old"


@pytest.mark.parametrize("impl", ["portable", "dense"])
def test_group_param_grads_merges_any_products(rng, impl):
    """group_param_grads works on the dW products of every implementation (values)."""
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 3, 0.6), 8, impl=impl)
    xs = [rng.standard_normal((n, bsmm.C)).astype(np.float32) for n in (3, 5, 2)]
    rs = [rng.standard_normal((n, bsmm.K)).astype(np.float32) for n in (3, 5, 2)]
    ref = sum(bsmm.layout.pack(x.T.astype(np.float64) @ r) for x, r in zip(xs, rs))
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=rng.standard_normal(bsmm.w_shape).astype(np.float32))
        loss = tf.add_n([tf.reduce_sum(bsmm(x, w) * r) for x, r in zip(xs, rs)])
        grad, = tf.gradients(loss, [w])
        grouped = group_param_grads(grad, group_size=2)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            merged = sess.run(grouped)
    assert rel_error(merged, ref) < 1e-5


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1", "axis0"])
def test_16bit_products_round_once(rng, dtype, axis):
    """A column fed by two nearly cancelling blocks: every path rounds the float32 sum once (the
    portable path once rounded each block's product to 16 bits: 40-200x the bound)."""
    lay = Layout(np.ones((2, 1), dtype=int), 16)
    x, w, dy = _case(rng, lay, axis, 8)
    w[1] = -w[0] * 1.001
    x = np.concatenate([x[:, :16], x[:, :16]], 1) if axis else np.concatenate([x[:16], x[:16]], 0)
    tdt = tf.as_dtype(dtype)
    xq, wq = (tf.cast(tf.cast(a, tdt), tf.float64).numpy() for a in (x, w))
    exact = dense_products(lay, xq, wq, dy.astype(np.float64), axis)[0]
    magnitude = dense_products(lay, np.abs(xq), np.abs(wq), dy.astype(np.float64), axis)[0]
    for impl, products in PRODUCTS.items():
        (y, _, _), _ = _eager(products, lay, axis, x, w, dy, tdt, tf.float32)
        got = tf.cast(y, tf.float64).numpy()
        bound = rounded_once_bound(exact, got, magnitude, 32, dtype)
        assert (np.abs(got - exact) <= bound).all(), f"{impl}: {(np.abs(got - exact) / bound).max():.3g}x the bound"
