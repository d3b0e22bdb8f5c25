"""Acceptance: ``SparseProj`` (gather, scatter, scatter_add, scatter_mul), ``group_param_grads``
and the helpers of the original's examples (``largest_block``, ``get_parents``,
``add_control_input``), called as documented, against float64 numpy."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.matmul import BlocksparseMatMul, SparseProj, add_control_input, get_parents, group_param_grads
from blocksparse.matmul import largest_block
from blocksparse.testing import rel_error, tolerance
from blocksparse.testing.matmul import random_layout
from tf_modes import assert_raises, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}


# -- SparseProj ---------------------------------------------------------------------------------

def test_constructor_forms(rng):
    np.random.seed(int(rng.integers(2**31)))
    by_count = SparseProj(64, nproj=20)
    assert by_count.nproj == 20 and by_count.gather_lut.shape == (20,)
    assert np.all(np.diff(by_count.gather_lut) > 0) and by_count.gather_lut.max() < 64
    by_stride = SparseProj(256, proj_stride=3, block_size=8)     # every 3rd, a multiple of 8 of them
    assert np.array_equal(by_stride.gather_lut, np.arange(80) * 3)
    lut = rng.choice(50, 7, replace=False)
    by_lut = SparseProj(50, gather_lut=lut)
    assert np.array_equal(by_lut.gather_lut, lut) and by_lut.nproj == 7
    positional = SparseProj(50, None, None, 32, lut)
    assert np.array_equal(positional.gather_lut, lut)
    scatter = np.full(50, -1)
    scatter[lut] = np.arange(7)
    assert np.array_equal(by_lut.scatter_lut, scatter)


def projection(rng, nhidden=40, nproj=9):
    return SparseProj(nhidden, gather_lut=rng.choice(nhidden, nproj, replace=False))


def proj_ref(op, sp, x, y, dz):
    """float64 value and gradients of each op (written from the original's docstring)."""
    lut = sp.gather_lut
    if op == "gather":
        dx = np.zeros_like(x)
        dx[lut] = dz
        return x[lut], [dx]
    if op == "scatter":
        z = np.zeros((sp.nhidden,) + x.shape[1:])
        z[lut] = x
        return z, [dz[lut]]
    z = x.copy()
    if op == "scatter_add":
        z[lut] += y
        return z, [dz, dz[lut]]
    z[lut] *= y
    dx = dz.copy()
    dx[lut] *= y
    return z, [dx, dz[lut] * x[lut]]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
@pytest.mark.parametrize("op", ["gather", "scatter", "scatter_add", "scatter_mul"])
def test_projection_values_and_gradients(rng, op, mode, dtype):
    sp = projection(rng)
    n = 3
    rows = {"gather": sp.nhidden, "scatter": sp.nproj}.get(op, sp.nhidden)
    xs = [rng.standard_normal((rows, n))]
    if op in ("scatter_add", "scatter_mul"):
        xs.append(rng.standard_normal((sp.nproj, n)))
    out_rows = sp.nproj if op == "gather" else sp.nhidden
    dz = rng.standard_normal((out_rows, n))
    res = run(mode, getattr(sp, op), xs, [dtype] * len(xs), [dz], unknown={i: (1,) for i in range(len(xs))})
    assert res.out_dtypes == [dtype.name] and res.grad_dtypes == [dtype.name] * len(xs)
    value, grads = proj_ref(op, sp, *res.inputs, *([None] * (2 - len(xs))), res.grad_ys[0])
    tol = tolerance(dtype)
    assert rel_error(res.outputs[0], value) < tol
    for got, want in zip(res.grads, grads):
        assert rel_error(got, want) < tol


def test_projection_any_trailing_shape(rng):
    sp = projection(rng)
    x = rng.standard_normal((sp.nhidden,)).astype(np.float32)
    assert np.array_equal(sp.gather(x).numpy(), x[sp.gather_lut])
    x3 = rng.standard_normal((sp.nproj, 2, 3)).astype(np.float32)
    z = sp.scatter(x3).numpy()
    assert z.shape == (sp.nhidden, 2, 3) and np.array_equal(z[sp.gather_lut], x3)


BAD_PROJ = {
    "none_chosen": (lambda sp: SparseProj(64), ValueError, "one of nproj, proj_stride or gather_lut"),
    "nproj_too_big": (lambda sp: SparseProj(64, nproj=65), ValueError, "nproj"),
    "nproj_float": (lambda sp: SparseProj(64, nproj=3.0), TypeError, "nproj"),
    "nhidden_zero": (lambda sp: SparseProj(0, nproj=1), ValueError, "nhidden"),
    "stride_too_big": (lambda sp: SparseProj(64, proj_stride=4, block_size=32), ValueError, "proj_stride"),
    "lut_repeat": (lambda sp: SparseProj(8, gather_lut=[1, 1]), ValueError, "gather_lut"),
    "lut_range": (lambda sp: SparseProj(8, gather_lut=[1, 8]), ValueError, "gather_lut"),
    "lut_float": (lambda sp: SparseProj(8, gather_lut=[1.0, 2.0]), TypeError, "gather_lut"),
    "gather_rows": (lambda sp: sp.gather(tf.zeros([sp.nhidden - 1, 2])), ValueError, "x must have 40 rows"),
    "scatter_rows": (lambda sp: sp.scatter(tf.zeros([sp.nhidden, 2])), ValueError, "x must have 9 rows"),
    "scatter_scalar": (lambda sp: sp.scatter(tf.constant(1.0)), ValueError, "x must have rank"),
    "add_y_rows": (lambda sp: sp.scatter_add(tf.zeros([40, 2]), tf.zeros([40, 2])), ValueError, "y must have 9"),
    "add_trailing": (lambda sp: sp.scatter_add(tf.zeros([40, 2]), tf.zeros([9, 3])), ValueError, "same shape"),
    "mul_dtypes": (lambda sp: sp.scatter_mul(tf.zeros([40, 2]), tf.zeros([9, 2], tf.float16)), TypeError, "dtype"),
    "gather_int": (lambda sp: sp.gather(tf.zeros([40, 2], tf.int32)), TypeError, "x must have dtype"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROJ))
def test_projection_bad_arguments(rng, case):
    sp = SparseProj(40, gather_lut=np.arange(9) * 4)
    call, error, pattern = BAD_PROJ[case]
    assert_raises((lambda: call(sp), error, pattern))


def test_projection_rows_checked_at_run_time():
    sp = SparseProj(40, gather_lut=np.arange(9) * 4)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def gather(x):
        return sp.gather(x)

    assert gather(tf.ones([40, 2])).shape == (9, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="x must have 40 rows"):
        gather(tf.ones([39, 2]))


# -- group_param_grads ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("group_size", [1, 3, 8])
def test_group_param_grads_unrolled_rnn(rng, group_size, dtype):
    """A weight used at every step of an unrolled recurrence (tf.compat.v1 graph, tf.gradients)."""
    steps, n = 5, 3
    bsmm = BlocksparseMatMul(random_layout(rng, 3, 3, 0.7), block_size=8)
    h0 = rng.standard_normal(bsmm.i_shape(n)).astype(np.float32)
    w0 = (rng.standard_normal(bsmm.w_shape) * 0.3).astype(np.float32)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w0)
        wc = tf.cast(w, dtype)
        h = tf.cast(tf.constant(h0), dtype)
        for _ in range(steps):
            h = bsmm(h, wc, dw_dtype=dtype)
        loss = tf.reduce_sum(tf.square(tf.cast(h, tf.float32)))
        dw, = tf.gradients(loss, [w])
        grouped = group_param_grads(dw, group_size=group_size)
        grouped16 = group_param_grads(dw, group_size, False)
        assert grouped.dtype == tf.float32
        assert grouped16.dtype == tf.float32   # the cast to float32 of w happened before the products
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got, got16 = sess.run([grouped, grouped16])
    # float64 reference: forward through the dense matrix, backward by hand
    dense = bsmm.layout.dense(w0.astype(np.float64))
    hs = [h0.astype(np.float64)]
    for _ in range(steps):
        hs.append(hs[-1] @ dense)
    dh = 2 * hs[-1]
    ddense = np.zeros_like(dense)
    for t in reversed(range(steps)):
        ddense += hs[t].T @ dh
        dh = dh @ dense.T
    ref = bsmm.layout.pack(ddense)
    tol = 4 * tolerance(dtype)   # five chained products rounded in dtype
    assert rel_error(got, ref) < tol and rel_error(got16, ref) < tol


@pytest.mark.parametrize("cast32", [True, False])
def test_group_param_grads_cast32(rng, cast32):
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 2, 0.9), block_size=8)
    x0 = rng.standard_normal(bsmm.i_shape(4)).astype(np.float32)
    with tf.Graph().as_default():
        w = tf.compat.v1.placeholder(tf.float16, bsmm.w_shape)
        x = tf.constant(x0, tf.float16)
        loss = tf.reduce_sum(tf.cast(bsmm(bsmm(x, w, tf.float16), w, tf.float16), tf.float32))
        dw, = tf.gradients(loss, [w])
        grouped = group_param_grads(dw, cast32=cast32)
        assert grouped.dtype == (tf.float32 if cast32 else tf.float16)
        w0 = rng.standard_normal(bsmm.w_shape).astype(np.float16)
        with tf.compat.v1.Session() as sess:
            got, plain = sess.run([grouped, dw], {w: w0})
    assert rel_error(got, plain.astype(np.float64)) < tolerance(tf.float16)


def test_group_param_grads_eager_returns_value(rng):
    g = tf.constant(rng.standard_normal((2, 8, 8)), tf.float32)
    assert group_param_grads(g) is g


BAD_GROUP = {
    "group_size_0": (lambda g: group_param_grads(g, group_size=0), ValueError, "group_size"),
    "group_size_9": (lambda g: group_param_grads(g, group_size=9), ValueError, "group_size"),
    "group_size_float": (lambda g: group_param_grads(g, group_size=2.0), ValueError, "group_size"),
    "cast32_int": (lambda g: group_param_grads(g, cast32=1), TypeError, "cast32"),
    "numpy": (lambda g: group_param_grads(np.ones(3)), TypeError, "param_grad"),
    "none": (lambda g: group_param_grads(None), TypeError, "param_grad"),
}


@pytest.mark.parametrize("case", sorted(BAD_GROUP))
def test_group_param_grads_bad_arguments(case):
    call, error, pattern = BAD_GROUP[case]
    assert_raises((lambda: call(tf.ones([1, 8, 8])), error, pattern))


# -- helpers of the original's examples -----------------------------------------------------------

@pytest.mark.parametrize("dim, expected", [(96, (32, 3)), (48, (16, 3)), (40, (8, 5)), (8, (8, 1)), (4096, (32, 128))])
def test_largest_block(dim, expected):
    assert largest_block(dim) == expected


def test_largest_block_sizes_and_errors():
    assert largest_block(256, block_sizes=(128, 64)) == (128, 2)
    with pytest.raises(ValueError, match="dim"):
        largest_block(12)
    with pytest.raises(ValueError, match="dim"):
        largest_block(0)
    with pytest.raises(TypeError, match="dim"):
        largest_block(32.0)
    with pytest.raises(ValueError, match="block_sizes"):
        largest_block(96, block_sizes=(24,))
    with pytest.raises(TypeError):
        largest_block(96, (32,))   # block_sizes is keyword-only


def test_get_parents_and_add_control_input(rng):
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 2, 0.9), block_size=8)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, bsmm.i_shape(None))
        w = tf.compat.v1.get_variable("w", bsmm.w_shape)
        h = bsmm(x, w)
        y = bsmm(tf.tanh(h), w)
        loss = tf.reduce_sum(y)
        dx, dw = tf.gradients(loss, [x, w])
        dx_ops = get_parents(dx, "BlocksparseMatmulDX")
        assert len(dx_ops) == 1                     # nearest first, and the search stops there
        assert len(get_parents(dw, "BlocksparseMatmulDW")) == 2
        assert get_parents(dx, "NoSuchOp") == []
        assert get_parents(loss.op, "Sum") == [loss.op]
        other = tf.constant(1.0, name="other")
        add_control_input(dx_ops[0], other.op)
        assert other.op in dx_ops[0].control_inputs
        add_control_input(dx_ops[0], other)         # a tensor stands for its op; adding twice is harmless
        assert list(dx_ops[0].control_inputs).count(other.op) == 1
        with pytest.raises(ValueError, match="deadlock"):
            add_control_input(x.op, loss.op)        # loss depends on x
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(dx, {x: np.ones(bsmm.i_shape(2), np.float32)})
    with pytest.raises(TypeError, match="grad must be a graph tensor"):
        get_parents(tf.ones([2]), "MatMul")
    with pytest.raises(TypeError, match="op_type"):
        get_parents(dx, 3)
    with tf.Graph().as_default():
        a = tf.constant(1.0)
    with tf.Graph().as_default():
        b = tf.constant(2.0)
    with pytest.raises(ValueError, match="same graph"):
        add_control_input(a, b)
