"""BlocksparseMatMul on TensorFlow: y, dx and dW against float64 numpy on the dense matrix.

Three execution modes share one driver (:func:`run_products`): TF2 eager with GradientTape,
``tf.function`` with an unknown minibatch, and a ``tf.compat.v1`` graph with ``tf.gradients``.
"""
import contextlib
import doctest
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from blocksparse.layout import BLOCK_SIZES, Layout
from blocksparse.matmul import BlocksparseMatMul
from blocksparse.testing import TOLERANCE, rel_error
from blocksparse.testing.matmul import dense_products, l2_normalize_dense
from blocksparse.testing.matmul import random_layout

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
#: layout size per block size, so that C and K stay a few hundred at most
GRID = {8: (6, 5), 16: (5, 6), 32: (4, 5), 64: (4, 3), 128: (3, 2)}


def make_case(rng, bs, axis, N, **kwargs):
    """A bsmm object with empty rows and columns plus random float32 x, w, dy."""
    CB, KB = GRID[bs]
    lay = random_layout(rng, CB, KB, 0.6, empty_rows=1, empty_cols=1)
    bsmm = BlocksparseMatMul(lay, block_size=bs, feature_axis=axis, **kwargs)
    x = rng.standard_normal(bsmm.i_shape(N)).astype(np.float32)
    w = rng.standard_normal(bsmm.w_shape).astype(np.float32)
    dy = rng.standard_normal(bsmm.o_shape(N)).astype(np.float32)
    return bsmm, x, w, dy


def in_mode(mode):
    """A context: a fresh ``tf.compat.v1`` graph for ``"graph"``, nothing (eager) otherwise."""
    return tf.Graph().as_default() if mode == "graph" else contextlib.nullcontext()


def as_np(t):
    return tf.cast(t, tf.float64).numpy()


def _eager(bsmm, x, w, dy, dtype, dw_dtype):
    xt, wt, dyt = (tf.cast(v, dtype) for v in (x, w, dy))
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = bsmm(xt, wt, dw_dtype=dw_dtype)
    dx, dw = tape.gradient(y, [xt, wt], output_gradients=dyt)
    return y, dx, dw, xt, wt, dyt


def _function(bsmm, x, w, dy, dtype, dw_dtype):
    spec = [tf.TensorSpec(bsmm.i_shape(None), tf.float32), tf.TensorSpec(bsmm.w_shape, tf.float32),
            tf.TensorSpec(bsmm.o_shape(None), tf.float32)]

    @tf.function(input_signature=spec)
    def step(x, w, dy):
        xt, wt, dyt = (tf.cast(v, dtype) for v in (x, w, dy))
        assert xt.shape[1 - bsmm.axis] is None  # the minibatch really is unknown here
        with tf.GradientTape() as tape:
            tape.watch([xt, wt])
            y = bsmm(xt, wt, dw_dtype=dw_dtype)
        dx, dw = tape.gradient(y, [xt, wt], output_gradients=dyt)
        return y, dx, dw, xt, wt, dyt

    out = step(x, w, dy)
    # a second minibatch size runs through the same trace
    n2 = 3
    x2 = np.take(x, range(n2), axis=1 - bsmm.axis, mode="wrap")
    dy2 = np.take(dy, range(n2), axis=1 - bsmm.axis, mode="wrap")
    y2 = step(x2, w, dy2)[0]
    assert step.experimental_get_tracing_count() == 1
    ref2 = dense_products(bsmm.layout, as_np(tf.cast(x2, dtype)), as_np(out[4]), as_np(dy2), bsmm.axis)[0]
    assert rel_error(as_np(y2), ref2) < TOLERANCE[dtype.name]
    return out


def _graph(bsmm, x, w, dy, dtype, dw_dtype):
    with tf.Graph().as_default():
        xp = tf.compat.v1.placeholder(tf.float32, bsmm.i_shape(None))
        dyp = tf.compat.v1.placeholder(tf.float32, bsmm.o_shape(None))
        wv = tf.compat.v1.get_variable("w", dtype=dtype, initializer=tf.cast(w, dtype))
        xt, dyt = tf.cast(xp, dtype), tf.cast(dyp, dtype)
        y = bsmm(xt, wv, dw_dtype=dw_dtype)
        dx, dw = tf.gradients(y, [xt, wv], grad_ys=dyt)
        assert dw.op.name.split("/")[-1].startswith("BlocksparseMatmulDW")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return sess.run([y, dx, dw, xt, wv, dyt], {xp: x, dyp: dy})


MODES = {"eager": _eager, "function": _function, "graph": _graph}


def run_products(mode, bsmm, x, w, dy, dtype=tf.float32, dw_dtype=tf.float32):
    """Run y = bsmm(x, w) and its gradients for output gradient dy; check dtypes; return float64."""
    y, dx, dw, xt, wt, dyt = MODES[mode](bsmm, x, w, dy, dtype, dw_dtype)
    if mode != "graph":
        assert (y.dtype, dx.dtype, dw.dtype) == (dtype, dtype, dw_dtype)
        y, dx, dw, xt, wt, dyt = (as_np(t) for t in (y, dx, dw, xt, wt, dyt))
    else:
        assert y.dtype == dtype.as_numpy_dtype and dw.dtype == dw_dtype.as_numpy_dtype
        y, dx, dw, xt, wt, dyt = (np.asarray(t, dtype=np.float64) for t in (y, dx, dw, xt, wt, dyt))
    return (y, dx, dw), (xt, wt, dyt)


def check_products(mode, bsmm, x, w, dy, dtype=tf.float32, dw_dtype=tf.float32):
    outs, (xr, wr, dyr) = run_products(mode, bsmm, x, w, dy, dtype, dw_dtype)
    # the reference uses the values the op saw (rounded to dtype), so only the op's error counts
    refs = dense_products(bsmm.layout, xr, wr, dyr, bsmm.axis)
    tols = (TOLERANCE[dtype.name], TOLERANCE[dtype.name],
            max(TOLERANCE[dtype.name] / 10, TOLERANCE[dw_dtype.name]))
    for what, out, ref, tol in zip(("y", "dx", "dw"), outs, refs, tols):
        err = rel_error(out, ref)
        assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.0e}"
    # empty layout columns give exact zeros
    empty_k = np.flatnonzero(~bsmm.layout.mask.any(axis=0))
    y = outs[0] if bsmm.axis == 1 else outs[0].T
    for k in empty_k:
        assert not y[:, k * bsmm.bsize:(k + 1) * bsmm.bsize].any()


# ------------------------------------------------------------------------- numerics

@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1", "axis0"])
@pytest.mark.parametrize("bs", BLOCK_SIZES, ids=[f"bs{b}" for b in BLOCK_SIZES])
def test_eager_every_block_size(rng, bs, axis, dtype):
    check_products("eager", *make_case(rng, bs, axis, N=64), dtype=dtype)


@pytest.mark.parametrize("N", [1, 7, 64, 257], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1", "axis0"])
def test_eager_minibatch_sizes(rng, axis, N):
    check_products("eager", *make_case(rng, 16, axis, N))


@pytest.mark.parametrize("mode", ["function", "graph"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1", "axis0"])
def test_graph_modes(rng, mode, axis, dtype):
    bs = {tf.float32: 8, tf.float16: 32, tf.bfloat16: 128}[dtype]
    check_products(mode, *make_case(rng, bs, axis, N=257 if dtype == tf.float32 else 7), dtype=dtype)


@pytest.mark.parametrize("dw_dtype", [tf.float16, tf.bfloat16], ids=["dw-fp16", "dw-bf16"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_dw_dtype(rng, mode, dw_dtype):
    check_products(mode, *make_case(rng, 32, 1, N=64), dw_dtype=dw_dtype)


# ------------------------------------------------- dW under persistent, nested and higher-order tapes
# TensorFlow differentiates the gradient computation itself there (for a tf.function: a backward
# that takes gradients for the forward tensors it reads, W included); those gradients come in W's
# dtype and are added to dW, which must still come out in dw_dtype.

#: (weight dtype, dw_dtype): 16-bit weights with the default float32 dW, and the other way round
TAPE_DTYPES = {"w-fp16": (tf.float16, tf.float32), "w-bf16": (tf.bfloat16, tf.float32),
               "w-fp32-dw-fp16": (tf.float32, tf.float16)}


def _persistent_tape_around_function(bsmm, wv, x, dy, v, dw_dtype):
    f = tf.function(lambda x: bsmm(x, wv, dw_dtype=dw_dtype))
    with tf.GradientTape(persistent=True) as tape:
        y = f(x)
    return [(tape.gradient(y, wv, output_gradients=dy), False), (tape.gradient(y, wv, output_gradients=dy), False)]


def _nested_tapes_around_function(bsmm, wv, x, dy, v, dw_dtype):
    f = tf.function(lambda x: bsmm(x, wv, dw_dtype=dw_dtype))
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            y = f(x)
        dw_inner = inner.gradient(y, wv, output_gradients=dy)  # recorded by the outer tape
    return [(dw_inner, False), (outer.gradient(y, wv, output_gradients=dy), False)]


def _tape_inside_function_under_persistent_tape(bsmm, wv, x, dy, v, dw_dtype):
    @tf.function
    def step(x, dy):
        with tf.GradientTape() as tape:
            y = bsmm(x, wv, dw_dtype=dw_dtype)
        return y, tape.gradient(y, wv, output_gradients=dy)

    with tf.GradientTape(persistent=True) as tape:
        y, dw_inside = step(x, dy)
    return [(dw_inside, False), (tape.gradient(y, wv, output_gradients=dy), False)]


def _second_order(bsmm, wv, x, dy, v, dw_dtype):
    """d/dW of <y, dy> + <dx, v>, dx the gradient of <y, dy> wrt x: dW = x^T dy + v^T dy."""
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = bsmm(x, wv, dw_dtype=dw_dtype)
        dx = inner.gradient(y, x, output_gradients=dy)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(dy, tf.float32))
        loss += tf.reduce_sum(tf.cast(dx, tf.float32) * tf.cast(v, tf.float32))
    return [(outer.gradient(loss, wv), True)]


TAPE_CASES = {"persistent-around-function": _persistent_tape_around_function,
              "nested-around-function": _nested_tapes_around_function,
              "tape-in-function-under-persistent": _tape_inside_function_under_persistent_tape,
              "second-order-eager": _second_order,
              "second-order-in-function": lambda *args: tf.function(_second_order)(*args)}


def check_tape_dw(bsmm, dws, x, w, dy, v, dw_dtype):
    """Every ``(dW, second_order)`` in ``dws`` is ``x^T dy`` (``+ v^T dy``) in ``dw_dtype``."""
    xr, wr, dyr, vr = (as_np(t) for t in (x, w, dy, v))
    first = dense_products(bsmm.layout, xr, wr, dyr, bsmm.axis)[2]
    second = dense_products(bsmm.layout, vr, wr, dyr, bsmm.axis)[2]
    # both the first-order dW and the second-order term (an updat too) accumulate in float32 and
    # are rounded once to dw_dtype (as in check_products)
    tol = max(TOLERANCE[w.dtype.name] / 10, TOLERANCE[dw_dtype.name])
    for dw, second_order in dws:
        assert dw.dtype == dw_dtype
        err = rel_error(as_np(dw), first + second if second_order else first)
        assert err < tol, f"relative error {err:.2e}"


@pytest.mark.parametrize("dtypes", TAPE_DTYPES.values(), ids=TAPE_DTYPES.keys())
@pytest.mark.parametrize("case", TAPE_CASES.values(), ids=TAPE_CASES.keys())
@pytest.mark.parametrize("axis", [1, 0], ids=["axis1", "axis0"])
def test_dw_under_higher_order_tapes(rng, axis, case, dtypes):
    dtype, dw_dtype = dtypes
    bsmm, x, w, dy = make_case(rng, 8, axis, N=5)
    v = rng.standard_normal(x.shape)
    x, dy, v = (tf.constant(a, dtype) for a in (x, dy, v))
    wv = tf.Variable(tf.cast(w, dtype))
    check_tape_dw(bsmm, case(bsmm, wv, x, dy, v, dw_dtype), x, wv, dy, v, dw_dtype)


@pytest.mark.parametrize("dtypes", TAPE_DTYPES.values(), ids=TAPE_DTYPES.keys())
def test_dw_of_saved_model_function_under_persistent_tape(rng, tmp_path, dtypes):
    dtype, dw_dtype = dtypes
    bsmm, x, w, dy = make_case(rng, 8, 1, N=5)

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.cast(w, dtype))

        @tf.function(input_signature=[tf.TensorSpec(bsmm.i_shape(None), dtype)])
        def forward(self, x):
            return bsmm(x, self.w, dw_dtype=dw_dtype)

    tf.saved_model.save(Module(), str(tmp_path))
    restored = tf.saved_model.load(str(tmp_path))
    x, dy = tf.constant(x, dtype), tf.constant(dy, dtype)
    with tf.GradientTape(persistent=True) as tape:
        y = restored.forward(x)
    dw = tape.gradient(y, restored.w, output_gradients=dy)
    check_tape_dw(bsmm, [(dw, False)], x, restored.w, dy, tf.zeros_like(x), dw_dtype)


@pytest.mark.parametrize("axis", [1, 0], ids=["axis1", "axis0"])
def test_z_order_matches_row_major(rng, axis):
    lay = random_layout(rng, 8, 8, 0.5, empty_rows=1, empty_cols=1)
    zo = BlocksparseMatMul(lay, block_size=8, feature_axis=axis, z_order=True)
    rm = BlocksparseMatMul(lay, block_size=8, feature_axis=axis, z_order=False)
    assert zo.block_coord(1) == Layout(lay, 8, z_order=True).block_coord(1)
    dense = np.zeros((zo.C, zo.K), np.float32)
    dense[:] = rng.standard_normal(dense.shape)
    x = rng.standard_normal(zo.i_shape(5)).astype(np.float32)
    y_zo = zo(x, zo.layout.pack(dense))
    y_rm = rm(x, rm.layout.pack(dense))
    np.testing.assert_allclose(y_zo.numpy(), y_rm.numpy(), rtol=1e-5, atol=1e-5)
    check_products("eager", zo, x, zo.layout.pack(dense), rng.standard_normal(zo.o_shape(5)))


def test_weights_share_one_layout(rng):
    """Two weights through one object (a 2-layer chain): both gradients are right."""
    lay = random_layout(rng, 6, 6, 0.5, empty_rows=1)
    bsmm = BlocksparseMatMul(lay, block_size=16)
    x = rng.standard_normal(bsmm.i_shape(9)).astype(np.float32)
    w1, w2 = (tf.Variable(rng.standard_normal(bsmm.w_shape).astype(np.float32)) for _ in "12")
    dz = rng.standard_normal(bsmm.o_shape(9))
    with tf.GradientTape() as tape:
        z = bsmm(bsmm(x, w1), w2)
    g1, g2 = tape.gradient(z, [w1, w2], output_gradients=tf.constant(dz, tf.float32))
    d1, d2 = (bsmm.layout.dense(w.numpy().astype(np.float64)) for w in (w1, w2))
    h = x @ d1
    np.testing.assert_allclose(z.numpy(), h @ d2, rtol=1e-4, atol=1e-4)
    assert rel_error(g2.numpy(), bsmm.layout.pack(h.T @ dz)) < 1e-5
    assert rel_error(g1.numpy(), bsmm.layout.pack(x.T @ (dz @ d2.T))) < 1e-5


def test_xla_jit_compile(rng):
    """The reference path compiles with XLA (what TPUs run), gradients included."""
    bsmm, x, w, dy = make_case(rng, 16, 0, N=5)
    wv = tf.Variable(w)

    @tf.function(jit_compile=True)
    def step(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = bsmm(x, wv)
        return (y,) + tuple(tape.gradient(y, [x, wv], output_gradients=dy))

    outs = step(tf.constant(x), tf.constant(dy))
    for out, ref in zip(outs, dense_products(bsmm.layout, x, w, dy, 0)):
        assert rel_error(out.numpy(), ref) < 1e-5


def test_readme_size_runs_eagerly(rng):
    """The README's example size (4096 hidden, 32 blocks, density 0.5) in float32."""
    lay = rng.integers(0, 2, size=(128, 128))
    bsmm = BlocksparseMatMul(lay, block_size=32)
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    w = rng.standard_normal(bsmm.w_shape).astype(np.float32)
    y = bsmm(x, w).numpy()
    assert rel_error(y, x.astype(np.float64) @ bsmm.layout.dense(w.astype(np.float64))) < 1e-5


# ------------------------------------------------------------------ object and API

def test_doctests():
    import blocksparse.matmul
    result = doctest.testmod(blocksparse.matmul)
    assert result.attempted > 0 and result.failed == 0

def test_attributes():
    lay = np.array([[1, 0, 1], [0, 0, 1]])
    bsmm = BlocksparseMatMul(lay, block_size=16, feature_axis=0, name="proj")
    assert isinstance(bsmm.layout, Layout)
    assert (bsmm.blocks, bsmm.bsize, bsmm.block_size, bsmm.axis, bsmm.z_order, bsmm.name) == (3, 16, 16, 0, False, "proj")
    assert (bsmm.CB, bsmm.KB, bsmm.C, bsmm.K) == (2, 3, 32, 48)
    assert bsmm.w_shape == (3, 16, 16)
    assert bsmm.i_shape(5) == (32, 5) and bsmm.o_shape(None) == (48, None)
    assert BlocksparseMatMul(lay, 16).i_shape(5) == (5, 32)
    assert [bsmm.block_coord(b) for b in range(3)] == [(0, 0), (0, 2), (1, 2)]
    assert bsmm.sparsity == pytest.approx(0.5)
    assert bsmm.flops == 2 * 3 * 16 * 16
    with pytest.raises(ValueError, match="block"):
        bsmm.block_coord(3)


def test_pickle_round_trip(rng):
    lay = random_layout(rng, 4, 4, 0.5)
    bsmm = BlocksparseMatMul(lay, block_size=8, feature_axis=0, z_order=True, name="p")
    back = pickle.loads(pickle.dumps(bsmm))
    assert back.layout == bsmm.layout
    assert (back.bsize, back.axis, back.z_order, back.name) == (8, 0, True, "p")
    x = rng.standard_normal(bsmm.i_shape(3)).astype(np.float32)
    w = rng.standard_normal(bsmm.w_shape).astype(np.float32)
    np.testing.assert_array_equal(back(x, w).numpy(), bsmm(x, w).numpy())


def test_identity_init(rng):
    lay = random_layout(rng, 3, 5, 0.7)
    bsmm = BlocksparseMatMul(lay, block_size=8)
    expected = np.zeros((bsmm.C, bsmm.K))
    for c in range(3):
        for k in range(5):
            if lay[c, k] and c % 5 == k % 3:
                expected[c * 8:(c + 1) * 8, k * 8:(k + 1) * 8] = np.eye(8)
    for gpu in (False, True):
        w = bsmm.identity_init(gpu=gpu)(bsmm.w_shape, tf.bfloat16)
        assert isinstance(w, np.ndarray) and w.dtype == tf.bfloat16  # numpy, as the original's
        np.testing.assert_array_equal(bsmm.layout.dense(as_np(w)), expected)
    # a full square layout gives the identity matrix
    full = BlocksparseMatMul(np.ones((4, 4)), block_size=16)
    np.testing.assert_array_equal(full.layout.dense(full.identity_init()(full.w_shape).numpy()),
                                  np.eye(64))


def test_initializers_in_compat_v1_graph():
    bsmm = BlocksparseMatMul(np.array([[1, 1], [0, 1]]), block_size=8)
    with tf.Graph().as_default():
        wi = tf.compat.v1.get_variable("wi", bsmm.w_shape, initializer=bsmm.identity_init())
        wo = tf.compat.v1.get_variable("wo", bsmm.w_shape, dtype=tf.float16,
                                       initializer=bsmm.ortho_init())
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            vi, vo = sess.run([wi, wo])
    assert vo.dtype == np.float16
    np.testing.assert_array_equal(bsmm.layout.dense(vi), np.eye(16))  # (0,0) and (1,1) present
    dense_o = bsmm.layout.dense(vo.astype(np.float64))
    for k in range(2):
        col = dense_o[:, 8 * k:8 * (k + 1)]
        np.testing.assert_allclose(col.T @ col, np.eye(8), atol=2e-3)


def test_initial_values_are_numpy_in_graphs_too():
    """The original's initializers returned numpy arrays: code feeds them to ``tf.constant`` and
    numpy inside ``tf.compat.v1`` graphs."""
    bsmm = BlocksparseMatMul(np.ones((2, 2)), block_size=8)
    with tf.Graph().as_default():
        for init in (bsmm.identity_init(), bsmm.ortho_init()):
            value = init(bsmm.w_shape)
            assert tf.constant(value).shape == bsmm.w_shape and np.asarray(value).shape == bsmm.w_shape


def test_ortho_init_sparse_columns_are_orthonormal(rng):
    lay = random_layout(rng, 6, 5, 0.5, empty_cols=1)
    bsmm = BlocksparseMatMul(lay, block_size=16)
    np.random.seed(3)
    w = bsmm.ortho_init()(bsmm.w_shape, tf.float32).numpy()
    dense = bsmm.layout.dense(w).astype(np.float64)
    for k in range(bsmm.KB):
        col = dense[:, k * 16:(k + 1) * 16]
        expect = np.eye(16) if lay[:, k].any() else np.zeros((16, 16))
        np.testing.assert_allclose(col.T @ col, expect, atol=1e-5)
    np.random.seed(3)
    np.testing.assert_array_equal(bsmm.ortho_init()(bsmm.w_shape).numpy(), w)


@pytest.mark.parametrize("CB, KB", [(3, 2), (2, 3)], ids=["tall", "wide"])
def test_ortho_init_dense_layout_is_semi_orthogonal(CB, KB):
    bsmm = BlocksparseMatMul(np.ones((CB, KB)), block_size=8)
    dense = bsmm.layout.dense(bsmm.ortho_init()(bsmm.w_shape).numpy()).astype(np.float64)
    gram = dense.T @ dense if CB >= KB else dense @ dense.T
    np.testing.assert_allclose(gram, np.eye(8 * min(CB, KB)), atol=1e-5)


def test_initializer_rejects_other_shapes():
    bsmm = BlocksparseMatMul(np.ones((2, 2)), block_size=8)
    with pytest.raises(ValueError, match=r"w_shape \(4, 8, 8\)"):
        bsmm.identity_init()((4, 8, 16))
    with pytest.raises(TypeError, match="dtype"):
        bsmm.ortho_init()(bsmm.w_shape, tf.int32)


@pytest.mark.parametrize("gain", [False, True], ids=["no-gain", "gain"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_l2_normalize(rng, mode, gain):
    lay = random_layout(rng, 5, 4, 0.5, empty_cols=1)
    bsmm = BlocksparseMatMul(lay, block_size=8)
    w = rng.standard_normal(bsmm.w_shape).astype(np.float32)
    g = rng.uniform(0.5, 2.0, bsmm.K).astype(np.float32) if gain else None
    up = rng.standard_normal(bsmm.w_shape).astype(np.float32)  # upstream gradient

    def build(wt, gt):
        return bsmm.l2_normalize(wt, gain=gt, dtype=tf.float16)

    if mode == "eager":
        wt = tf.constant(w)
        gt = None if g is None else tf.constant(g)
        with tf.GradientTape() as tape:
            tape.watch(wt)
            out = build(wt, gt)
        assert out.dtype == tf.float16
        out, dw = out.numpy(), tape.gradient(out, wt, output_gradients=tf.cast(up, tf.float16)).numpy()
    else:
        with tf.Graph().as_default():
            wt = tf.compat.v1.placeholder(tf.float32, bsmm.w_shape)
            out_t = build(wt, g)
            dw_t, = tf.gradients(out_t, [wt], grad_ys=tf.cast(up, tf.float16))
            with tf.compat.v1.Session() as sess:
                out, dw = sess.run([out_t, dw_t], {wt: w})

    dense = bsmm.layout.dense(w.astype(np.float64))
    ref = l2_normalize_dense(dense, g)
    assert rel_error(bsmm.layout.dense(out), ref) < 2e-3
    # d/dW of W_j * g_j / ||W_j|| per dense column j: g_j (u - W_j (W_j . u) / ||W_j||^2) / ||W_j||
    u = bsmm.layout.dense(up.astype(np.float16).astype(np.float64))
    norm2 = (dense ** 2).sum(axis=0, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # empty layout columns: 0 / 0
        ref_dw = (u - dense * (dense * u).sum(axis=0, keepdims=True) / norm2) / np.sqrt(norm2)
    if g is not None:
        ref_dw = ref_dw * g[None, :]
    assert rel_error(bsmm.layout.dense(dw), np.nan_to_num(ref_dw)) < 1e-5


@pytest.mark.parametrize("shape, dtype", [((1, 16), tf.float32), ((16,), tf.float64), ((16, 1), tf.float64)],
                         ids=["1xK", "float64", "Kx1-float64"])
def test_l2_normalize_gain_forms(rng, shape, dtype):
    """"any float dtype" and the original's gain shapes holding K elements: as a float32 (K,) gain,
    with the gain's gradient in the gain's own dtype and shape."""
    bsmm = BlocksparseMatMul(np.ones((2, 2)), block_size=8)
    w = tf.constant(rng.standard_normal(bsmm.w_shape), tf.float32)
    g = rng.standard_normal(16)
    want = bsmm.l2_normalize(w, gain=tf.constant(g, tf.float32))
    gain = tf.constant(g.reshape(shape), dtype)
    with tf.GradientTape() as tape:
        tape.watch(gain)
        got = bsmm.l2_normalize(w, gain=gain)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    dg = tape.gradient(got, gain)
    assert dg.dtype == dtype and tuple(dg.shape) == shape


def test_l2_normalize_errors():
    bsmm = BlocksparseMatMul(np.ones((2, 2)), block_size=8)
    w = tf.ones(bsmm.w_shape)
    with pytest.raises(ValueError, match=r"W must have shape \(4, 8, 8\)"):
        bsmm.l2_normalize(tf.ones((4, 8, 4)))
    with pytest.raises(ValueError, match=r"gain must have shape \(16,\)"):
        bsmm.l2_normalize(w, gain=tf.ones(8))
    with pytest.raises(ValueError, match="epsilon"):
        bsmm.l2_normalize(w, epsilon=0.0)
    for epsilon in (1e-50, 1e39):  # vanish / overflow in float32, where the op adds it
        with pytest.raises(ValueError, match="epsilon must be a positive float32 number"):
            bsmm.l2_normalize(tf.zeros(bsmm.w_shape), epsilon=epsilon)
    with pytest.raises(TypeError, match="dtype"):
        bsmm.l2_normalize(w, dtype=np.int32)


# ----------------------------------------------------------------------- bad input

@pytest.mark.parametrize("layout, bs, err, words", [
    (np.ones(4), 32, ValueError, "layout must be a 2-D"),
    (np.array([[0, 2]]), 32, ValueError, "layout must hold only 0 and 1"),
    (np.zeros((2, 2)), 32, ValueError, "layout must have at least one nonzero"),
    (np.ones((2, 2)), 0, ValueError, "block_size must be one of"),
    (np.ones((2, 2)), -32, ValueError, "block_size must be one of"),
    (np.ones((2, 2)), 24, ValueError, "block_size must be one of"),
    (np.ones((2, 2)), "32", TypeError, "block_size must be an int"),
], ids=["1d", "value-2", "all-zero", "bs0", "bs-neg", "bs24", "bs-str"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_bad_layout_or_block_size(mode, layout, bs, err, words):
    with in_mode(mode), pytest.raises(err, match=words):
        BlocksparseMatMul(layout, block_size=bs)


@pytest.mark.parametrize("kwargs, err, words", [
    ({"feature_axis": 2}, ValueError, r"feature_axis must be 0 \(activations \(C, N\)\) or 1.*got 2"),
    ({"feature_axis": -1}, ValueError, "feature_axis"),
    ({"feature_axis": "1"}, TypeError, "feature_axis must be an int"),
    ({"z_order": "yes"}, TypeError, "z_order must be a bool"),
    ({"name": 3}, TypeError, "name must be"),
], ids=["axis2", "axis-neg", "axis-str", "z_order-str", "name-int"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_bad_constructor_arguments(mode, kwargs, err, words):
    with in_mode(mode), pytest.raises(err, match=words):
        BlocksparseMatMul(np.ones((2, 2)), block_size=8, **kwargs)


def _bad_calls():
    """(id, x shape, x dtype, w shape, w dtype, dw_dtype, error, message) for a bsmm of C=16, K=24."""
    good_w = (4, 8, 8)
    return [
        ("x-rank3", (5, 16, 1), tf.float32, good_w, tf.float32, tf.float32, ValueError,
         r"I must have rank 2, shape \(None, 16\) = \(N, C\)"),
        ("x-rank1", (16,), tf.float32, good_w, tf.float32, tf.float32, ValueError, "I must have rank 2"),
        ("x-features", (5, 24), tf.float32, good_w, tf.float32, tf.float32, ValueError,
         r"I must have shape \(None, 16\).*dimension 1 is 24, expected 16"),
        ("w-shape", (5, 16), tf.float32, (4, 8, 16), tf.float32, tf.float32, ValueError,
         r"W must have shape \(4, 8, 8\)"),
        ("w-blocks", (5, 16), tf.float32, (3, 8, 8), tf.float32, tf.float32, ValueError,
         r"W must have shape \(4, 8, 8\)"),
        ("x-int", (5, 16), tf.int32, good_w, tf.int32, tf.float32, TypeError,
         "I must have dtype float32, float16 or bfloat16; got int32"),
        ("x-float64", (5, 16), tf.float64, good_w, tf.float64, tf.float32, TypeError,
         "I must have dtype .*; got float64"),
        ("w-int", (5, 16), tf.float32, good_w, tf.int32, tf.float32, TypeError, "W must have dtype"),
        ("dtype-mismatch", (5, 16), tf.float16, good_w, tf.float32, tf.float32, TypeError,
         "I and W must have the same dtype; got I float16 and W float32"),
        ("dw-int", (5, 16), tf.float32, good_w, tf.float32, tf.int32, TypeError,
         "dw_dtype must be one of float32, float16 or bfloat16; got int32"),
        ("dw-junk", (5, 16), tf.float32, good_w, tf.float32, "junk", TypeError, "dw_dtype must be a dtype"),
    ]


BAD_CALLS = _bad_calls()
LAYOUT_2x3 = np.array([[1, 1, 0], [0, 1, 1]])


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("case", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_call(mode, case):
    _, x_shape, x_dtype, w_shape, w_dtype, dw_dtype, err, words = case
    bsmm = BlocksparseMatMul(LAYOUT_2x3, block_size=8)
    if mode == "eager":
        with pytest.raises(err, match=words):
            bsmm(tf.zeros(x_shape, x_dtype), tf.zeros(w_shape, w_dtype), dw_dtype=dw_dtype)
    else:
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(x_dtype, (None,) + x_shape[1:])
            w = tf.compat.v1.placeholder(w_dtype, w_shape)
            with pytest.raises(err, match=words):
                bsmm(x, w, dw_dtype=dw_dtype)


def test_unknown_feature_size_is_checked_at_run_time_in_graphs():
    bsmm = BlocksparseMatMul(LAYOUT_2x3, block_size=8)
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, None))
        x_any = tf.compat.v1.placeholder(tf.float32, None)  # unknown rank
        w = tf.compat.v1.placeholder(tf.float32, (None, 8, 8))
        y, y_any = bsmm(x, w), bsmm(x_any, w)
        good_w = np.zeros((4, 8, 8), np.float32)
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {x: np.ones((3, 16)), w: good_w}).shape == (3, 24)
            # 2 x 24 = 3 x 16: a bare reshape would not notice
            with pytest.raises(tf.errors.InvalidArgumentError, match="I must have shape"):
                sess.run(y, {x: np.ones((2, 24)), w: good_w})
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"W must have shape \(4, 8, 8\)"):
                sess.run(y, {x: np.ones((3, 16)), w: np.zeros((6, 8, 8))})
            with pytest.raises(tf.errors.InvalidArgumentError, match="I must have rank 2"):
                sess.run(y_any, {x_any: np.ones((3, 16, 1)), w: good_w})


def test_unknown_feature_size_is_checked_at_run_time_in_tf_function():
    bsmm = BlocksparseMatMul(LAYOUT_2x3, block_size=8, feature_axis=0)
    f = tf.function(lambda x, w: bsmm(x, w), input_signature=[
        tf.TensorSpec((None, None)), tf.TensorSpec(bsmm.w_shape)])
    assert f(tf.ones((16, 3)), tf.zeros(bsmm.w_shape)).shape == (24, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"I must have shape \(16, None\)"):
        f(tf.ones((24, 2)), tf.zeros(bsmm.w_shape))


@pytest.mark.parametrize("impl", ["auto", "reference", "portable", "dense"])
def test_unknown_block_count_is_checked_at_run_time_in_tf_function(impl):
    """A weight traced as (None, bs, bs) with the wrong block count when run: an error about W's
    shape from every path, for the product and l2_normalize (the graph optimiser had folded the
    assertions away, leaving errors from inside TensorFlow's scatters)."""
    bsmm = BlocksparseMatMul(LAYOUT_2x3, block_size=8, impl=impl)
    mm = tf.function(lambda x, w: bsmm(x, w), input_signature=[tf.TensorSpec((None, 16)), tf.TensorSpec((None, 8, 8))])
    l2 = tf.function(lambda w: bsmm.l2_normalize(w), input_signature=[tf.TensorSpec((None, 8, 8))])
    assert mm(tf.ones((3, 16)), tf.ones(bsmm.w_shape)).shape == (3, 24)
    for blocks in (1, 6):
        w = tf.ones((blocks, 8, 8))
        for call in (lambda: mm(tf.ones((3, 16)), w), lambda: l2(w)):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"W must have shape \(4, 8, 8\)|expected shape \[4,8,8\]"):
                call()


# --------------------------------------------------------------- backend selection

@pytest.mark.parametrize("value", ["reference", "auto", "AUTO", ""])
def test_backend_reference_and_auto(monkeypatch, value):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", value)
    bsmm = BlocksparseMatMul(np.ones((1, 1)), block_size=8)
    np.testing.assert_allclose(bsmm(tf.ones((2, 8)), tf.ones(bsmm.w_shape)).numpy(), np.full((2, 8), 8.0))


def test_backend_triton_says_what_to_do(monkeypatch):
    from blocksparse._tf.dispatch import BackendUnavailableError
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bsmm = BlocksparseMatMul(np.ones((1, 1)), block_size=32)  # 8 takes the reference path anyway
    with pytest.raises(BackendUnavailableError, match="compiled TensorFlow op library") as info:
        bsmm(tf.ones((2, 32)), tf.ones(bsmm.w_shape))
    assert "'reference'" in str(info.value) and isinstance(info.value, RuntimeError)


def test_backend_bad_value(monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "cuda")
    bsmm = BlocksparseMatMul(np.ones((1, 1)), block_size=8)
    with pytest.raises(ValueError, match="BLOCKSPARSE_BACKEND must be one of"):
        bsmm(tf.ones((2, 8)), tf.ones(bsmm.w_shape))


# ---------------------------------------------------------------- import behaviour

def _python(code, tmp_path, extra_path=None):
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


def test_import_blocksparse_does_not_import_tensorflow(tmp_path):
    res = _python("""
        import sys, blocksparse, blocksparse.layout
        assert "tensorflow" not in sys.modules, "tensorflow was imported"
    """, tmp_path)
    assert res.returncode == 0, res.stderr


def test_import_without_tensorflow_says_how_to_install(tmp_path):
    res = _python("""
        import sys
        sys.modules["tensorflow"] = None  # as if it were not installed
        try:
            import blocksparse.matmul
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("no ImportError")
    """, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "blocksparse[tensorflow]" in res.stdout and "blocksparse[tensorflow-cpu]" in res.stdout


def test_import_with_old_tensorflow_is_refused(tmp_path):
    fake = tmp_path / "fake" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.15.1"\n')
    res = _python("""
        try:
            import blocksparse.matmul
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("no ImportError")
    """, tmp_path, extra_path=fake.parent)
    assert res.returncode == 0, res.stderr
    assert ">= 2.16" in res.stdout and "found TensorFlow 2.15.1" in res.stdout


def test_autograph_leaves_the_library_alone():
    """Inside a user's tf.function AutoGraph must not convert blocksparse's own code (it is graph
    code already; converting it made tracing a product with its gradient ~20x slower)."""
    from tensorflow.python.autograph.impl import conversion

    import blocksparse.norms

    assert conversion.is_allowlisted(BlocksparseMatMul.__call__)
    assert conversion.is_allowlisted(blocksparse.norms.layer_norm)


def test_wrong_weight_in_tf_function_names_w(rng):
    """A weight whose shape the signature leaves open, fed with another block count: the error
    names W and its expected shape, not the caller's tensor."""
    bsmm = BlocksparseMatMul(LAYOUT_2x3, block_size=8)
    f = tf.function(lambda x, q: bsmm(x, q), input_signature=[tf.TensorSpec([None, 16]), tf.TensorSpec(None)])
    x = tf.constant(rng.standard_normal((3, 16)), tf.float32)
    w = rng.standard_normal(bsmm.w_shape)
    np.testing.assert_allclose(f(x, tf.constant(w, tf.float32)), bsmm.fprop_test(x.numpy(), w), rtol=1e-4, atol=1e-4)
    bad = (bsmm.blocks + 1,) + tuple(bsmm.w_shape[1:])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"W must have|tensor (\S*/)?W \["):
        f(x, tf.zeros(bad))


@pytest.mark.parametrize("axis", [1, 0])
def test_unknown_rank_in_tf_function_names_the_input(axis):
    """A rank-1 or scalar input in a tf.function of unknown rank: the error names I (a shape slice
    once failed first, as Grappler need not run the rank check before it)."""
    bsmm = BlocksparseMatMul(LAYOUT_2x3, block_size=8, feature_axis=axis)
    f = tf.function(lambda x, w: bsmm(x, w), input_signature=[tf.TensorSpec(None), tf.TensorSpec(bsmm.w_shape)])
    good = (3, 16) if axis else (16, 3)
    assert f(tf.ones(good), tf.zeros(bsmm.w_shape)).shape == ((3, 24) if axis else (24, 3))
    for shape in [(48,), (), (3, 16, 1) if axis else (16, 3, 1)]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"I must have|tensor (\S*/)?I \["):
            f(tf.ones(shape), tf.zeros(bsmm.w_shape))
