"""Acceptance: ``blocksparse.matmul.BlocksparseMatMul`` called as the original README documents it:
constructor forms, attributes, shape helpers, initializers, ``l2_normalize``, ``__call__`` (values
and gradients against float64 numpy, both feature axes, every dtype, every execution mode) and bad
arguments."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.matmul import BlocksparseMatMul
from blocksparse.testing import rel_error, tolerance
from blocksparse.testing.matmul import dense_products, random_layout
from tf_modes import MODES, assert_raises, run

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}


def layout_of(rng, CB=4, KB=3):
    return random_layout(rng, CB, KB, 0.6)


# -- construction, attributes, shape helpers ---------------------------------------------------

def test_constructor_forms_and_defaults(rng):
    lay = layout_of(rng)
    default = BlocksparseMatMul(lay)
    assert (default.bsize, default.axis) == (32, 1)           # block_size=32, feature_axis=1
    positional = BlocksparseMatMul(lay, 16, 0)
    keyword = BlocksparseMatMul(layout=lay, block_size=16, feature_axis=0)
    for bsmm in (positional, keyword):
        assert (bsmm.bsize, bsmm.axis) == (16, 0)
        assert bsmm.w_shape == (int(lay.sum()), 16, 16)
    # a list of lists and a boolean array are layouts too
    assert BlocksparseMatMul(lay.tolist(), block_size=8).w_shape == BlocksparseMatMul(lay.astype(bool), 8).w_shape


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_attributes(rng, block_size):
    lay = layout_of(rng, 5, 3)
    bsmm = BlocksparseMatMul(lay, block_size=block_size)
    blocks = int(lay.sum())
    assert bsmm.w_shape == (blocks, block_size, block_size)
    assert (bsmm.blocks, bsmm.CB, bsmm.KB) == (blocks, 5, 3)
    assert (bsmm.C, bsmm.K) == (5 * block_size, 3 * block_size)
    assert bsmm.sparsity == pytest.approx(blocks / 15)
    assert bsmm.flops == 2 * blocks * block_size * block_size


@pytest.mark.parametrize("axis", [1, 0], ids=["feature_axis1", "feature_axis0"])
def test_shape_helpers(rng, axis):
    bsmm = BlocksparseMatMul(layout_of(rng, 4, 3), block_size=8, feature_axis=axis)
    for n in (1, 7, None):
        assert tuple(bsmm.i_shape(n)) == ((n, 32) if axis else (32, n))
        assert tuple(bsmm.o_shape(n)) == ((n, 24) if axis else (24, n))


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (2.0, TypeError), ("8", TypeError), (True, TypeError)],
                         ids=["negative", "float", "str", "bool"])
def test_shape_helpers_reject_bad_minibatch(rng, bad, error):
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8)
    for helper in (bsmm.i_shape, bsmm.o_shape):
        with pytest.raises(error, match="N"):
            helper(bad)


def test_block_coord_locates_every_block(rng):
    bsmm = BlocksparseMatMul(layout_of(rng, 5, 4), block_size=8)
    ids = np.arange(1, bsmm.blocks + 1, dtype=np.float64)[:, None, None] * np.ones(bsmm.w_shape)
    dense = bsmm.layout.dense(ids)
    for block in range(bsmm.blocks):
        c, k = bsmm.block_coord(block)
        assert dense[c * 8, k * 8] == block + 1
    with pytest.raises(ValueError, match="block"):
        bsmm.block_coord(bsmm.blocks)
    with pytest.raises(TypeError, match="block"):
        bsmm.block_coord(0.0)


# -- initializers and weight normalisation -----------------------------------------------------

def test_identity_init(rng):
    bsmm = BlocksparseMatMul(np.ones((3, 3), int), block_size=8)
    for init in (bsmm.identity_init(), bsmm.identity_init(gpu=True)):
        w = init(bsmm.w_shape, tf.float32).numpy()
        assert np.array_equal(bsmm.layout.dense(w), np.eye(24))
    lay = layout_of(rng, 4, 2)
    bsmm = BlocksparseMatMul(lay, block_size=8)
    w = bsmm.identity_init()(bsmm.w_shape, tf.float16).numpy()
    assert w.dtype == np.float16
    for block in range(bsmm.blocks):
        c, k = bsmm.block_coord(block)
        assert np.array_equal(w[block], np.eye(8) * (c % 2 == k % 4))


def test_ortho_init_columns_are_orthonormal(rng):
    np.random.seed(int(rng.integers(2**31)))
    bsmm = BlocksparseMatMul(layout_of(rng, 5, 3), block_size=8)
    w = bsmm.ortho_init()(bsmm.w_shape, tf.float32).numpy().astype(np.float64)
    dense = bsmm.layout.dense(w)
    for k in range(bsmm.KB):
        rows = np.repeat(bsmm.layout.mask[:, k], 8)
        col = dense[rows][:, k * 8:(k + 1) * 8]
        if col.size:
            np.testing.assert_allclose(col.T @ col, np.eye(8), atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 2), (2, 3)], ids=["C_gt_K", "C_lt_K"])
def test_ortho_init_dense_layout_is_semi_orthogonal(rng, shape):
    np.random.seed(int(rng.integers(2**31)))
    bsmm = BlocksparseMatMul(np.ones(shape, int), block_size=8)
    dense = bsmm.layout.dense(bsmm.ortho_init()(bsmm.w_shape).numpy().astype(np.float64))
    gram = dense.T @ dense if bsmm.C >= bsmm.K else dense @ dense.T
    np.testing.assert_allclose(gram, np.eye(min(bsmm.C, bsmm.K)), atol=1e-5)


def test_initializers_work_with_get_variable(rng):
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", bsmm.w_shape, initializer=bsmm.identity_init())
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run(w)
    assert np.array_equal(got, bsmm.identity_init()(bsmm.w_shape).numpy())


def l2_normalize_ref(bsmm, w, gain, epsilon, dy):
    """float64 value and gradients (dw, dgain) of the weight normalisation, per dense column."""
    dense = bsmm.layout.dense(w)
    mask = bsmm.layout.dense(np.ones(bsmm.w_shape)) > 0
    norm = np.sqrt(np.maximum((dense ** 2).sum(axis=0), epsilon))
    out = dense / norm * gain
    ddy = bsmm.layout.dense(dy)
    dw = gain / norm * (ddy - dense * (dense * ddy).sum(axis=0) / norm ** 2) * mask
    dgain = (ddy * dense / norm).sum(axis=0)
    return bsmm.layout.pack(out), bsmm.layout.pack(dw), dgain


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_l2_normalize_values_and_gradients(rng, dtype):
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8)
    w = rng.standard_normal(bsmm.w_shape)
    gain = rng.uniform(0.5, 2.0, bsmm.K)
    dy = rng.standard_normal(bsmm.w_shape)
    res = run("eager", lambda w, g: bsmm.l2_normalize(w, gain=g, dtype=dtype), [w, gain], [dtype, tf.float32], [dy])
    assert res.out_dtypes == [dtype.name]
    out, dw, dgain = l2_normalize_ref(bsmm, res.inputs[0], res.inputs[1], 1e-6, res.grad_ys[0])
    tol = tolerance(dtype)
    assert rel_error(res.outputs[0], out) < tol
    assert rel_error(res.grads[0], dw) < tol
    assert rel_error(res.grads[1], dgain) < tol


def test_l2_normalize_without_gain_positional(rng):
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8)
    w = rng.standard_normal(bsmm.w_shape).astype(np.float32)
    out = bsmm.l2_normalize(tf.constant(w), None, 1e-6, np.float16)
    assert out.dtype == tf.float16
    ref = l2_normalize_ref(bsmm, w.astype(np.float64), 1.0, 1e-6, np.zeros(bsmm.w_shape))[0]
    assert rel_error(out.numpy(), ref) < tolerance(tf.float16)
    # a gain given as a numpy array (float64) is a parameter like any other
    gain = rng.uniform(0.5, 2.0, bsmm.K)
    out = bsmm.l2_normalize(tf.constant(w), gain=gain)
    ref = l2_normalize_ref(bsmm, w.astype(np.float64), gain, 1e-6, np.zeros(bsmm.w_shape))[0]
    assert rel_error(out.numpy(), ref) < tolerance(tf.float32)


# -- the product --------------------------------------------------------------------------------

def check_product(bsmm, res, dtype, dw_dtype):
    x, w = res.inputs
    y, dx, dw = dense_products(bsmm.layout, x, w, res.grad_ys[0], bsmm.axis)
    assert res.out_dtypes == [dtype.name]
    assert res.grad_dtypes == [dtype.name, dw_dtype.name]
    tol = max(tolerance(dtype), tolerance(dw_dtype))
    assert rel_error(res.outputs[0], y) < tol, "y"
    assert rel_error(res.grads[0], dx) < tol, "dx"
    assert rel_error(res.grads[1], dw) < tol, "dw"


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("axis", [1, 0], ids=["feature_axis1", "feature_axis0"])
@pytest.mark.parametrize("n", [1, 13], ids=["batch1", "batch13"])
def test_call_eager(rng, axis, dtype, n):
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8, feature_axis=axis)
    x = rng.standard_normal(bsmm.i_shape(n))
    w = rng.standard_normal(bsmm.w_shape)
    dy = rng.standard_normal(bsmm.o_shape(n))
    res = run("eager", lambda x, w: bsmm(x, w), [x, w], [dtype, dtype], [dy])
    check_product(bsmm, res, dtype, tf.float32)   # dw_dtype defaults to float32


@pytest.mark.parametrize("mode", [m for m in MODES if m != "eager"])
@pytest.mark.parametrize("axis", [1, 0], ids=["feature_axis1", "feature_axis0"])
def test_call_unknown_minibatch(rng, mode, axis):
    """The minibatch unknown while the graph is built (a placeholder / tf.function signature)."""
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=16, feature_axis=axis)
    n = 5
    x = rng.standard_normal(bsmm.i_shape(n))
    w = rng.standard_normal(bsmm.w_shape)
    dy = rng.standard_normal(bsmm.o_shape(n))
    res = run(mode, lambda x, w: bsmm(x, w, tf.float16), [x, w], [tf.bfloat16, tf.bfloat16], [dy],
              unknown={0: (1 - axis,)})
    check_product(bsmm, res, tf.bfloat16, tf.float16)


@pytest.mark.parametrize("dw_dtype", DTYPES.values(), ids=DTYPES.keys())
def test_call_dw_dtype(rng, dw_dtype):
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8)
    x, w = rng.standard_normal(bsmm.i_shape(4)), rng.standard_normal(bsmm.w_shape)
    dy = rng.standard_normal(bsmm.o_shape(4))
    res = run("eager", lambda x, w: bsmm(I=x, W=w, dw_dtype=dw_dtype), [x, w], [tf.float16, tf.float16], [dy])
    check_product(bsmm, res, tf.float16, dw_dtype)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense", "reference"])
@pytest.mark.parametrize("axis", [1, 0], ids=["feature_axis1", "feature_axis0"])
def test_call_every_cpu_implementation_with_empty_rows_and_columns(rng, impl, axis):
    """Every path the cost model may pick on a CPU gives the product; layout rows / columns without
    blocks give zero outputs / input gradients (never left unwritten)."""
    lay = random_layout(rng, 5, 4, 0.5, empty_rows=1, empty_cols=1)
    bsmm = BlocksparseMatMul(lay, block_size=16, feature_axis=axis, impl=impl)
    x, w = rng.standard_normal(bsmm.i_shape(6)), rng.standard_normal(bsmm.w_shape)
    dy = rng.standard_normal(bsmm.o_shape(6))
    res = run("eager", bsmm, [x, w], [tf.float16, tf.float16], [dy])
    check_product(bsmm, res, tf.float16, tf.float32)
    empty_k = np.repeat(~lay.any(axis=0), 16)
    empty_c = np.repeat(~lay.any(axis=1), 16)
    y, dx = (res.outputs[0], res.grads[0]) if axis else (res.outputs[0].T, res.grads[0].T)
    assert np.all(y[:, empty_k] == 0) and np.all(dx[:, empty_c] == 0)


def test_weights_share_one_object(rng):
    """The weight is separate from the object: two weights tied to one layout."""
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8)
    x = rng.standard_normal(bsmm.i_shape(3)).astype(np.float32)
    for _ in range(2):
        w = rng.standard_normal(bsmm.w_shape).astype(np.float32)
        y = bsmm(tf.constant(x), tf.Variable(w))
        assert rel_error(y.numpy(), x @ bsmm.layout.dense(w.astype(np.float64))) < tolerance(tf.float32)


def test_call_rejects_wrong_minibatch_at_run_time(rng):
    """feature_axis=0 keeps the features first: a placeholder (C, None) fed (C+8, n) must fail."""
    bsmm = BlocksparseMatMul(layout_of(rng), block_size=8, feature_axis=0)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def step(x):
        return bsmm(x, tf.zeros(bsmm.w_shape))

    assert step(tf.ones([bsmm.C, 3])).shape == (bsmm.K, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="I must have shape"):
        step(tf.ones([bsmm.C + 8, 3]))


@pytest.mark.parametrize("impl", ["auto", "portable", "dense", "reference"])
@pytest.mark.parametrize("blocks", [1, 5], ids=["fewer_blocks", "more_blocks"])
def test_call_rejects_wrong_weight_at_run_time(rng, blocks, impl):
    """A weight of unknown block count must fail when the graph runs, never compute silently."""
    bsmm = BlocksparseMatMul(np.array([[1, 1], [0, 1]]), block_size=8, impl=impl)

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8], tf.float32)])
    def step(w):
        return bsmm(tf.ones(bsmm.i_shape(2)), w)

    assert step(tf.ones(bsmm.w_shape)).shape == (2, 16)
    with pytest.raises(tf.errors.InvalidArgumentError):
        step(tf.ones([blocks, 8, 8]))


def bad_calls(bsmm):
    x = tf.zeros(bsmm.i_shape(2))
    w = tf.zeros(bsmm.w_shape)
    return {
        "x_features": (lambda: bsmm(tf.zeros([2, bsmm.C + 1]), w), ValueError, "I must have shape"),
        "x_rank3": (lambda: bsmm(tf.zeros([2, 2, bsmm.C]), w), ValueError, "I must have rank 2"),
        "x_int": (lambda: bsmm(tf.zeros([2, bsmm.C], tf.int32), w), TypeError, "I must have dtype"),
        "x_float64": (lambda: bsmm(tf.zeros([2, bsmm.C], tf.float64), w), TypeError, "I must have dtype"),
        "w_blocks": (lambda: bsmm(x, tf.zeros([bsmm.blocks + 1, 8, 8])), ValueError, "W must have shape"),
        "w_dtype": (lambda: bsmm(x, tf.zeros(bsmm.w_shape, tf.float16)), TypeError, "I and W must have the same"),
        "w_none": (lambda: bsmm(x, None), TypeError, "W must be a tensor"),
        "dw_dtype_int": (lambda: bsmm(x, w, dw_dtype=tf.int32), TypeError, "dw_dtype"),
        "dw_dtype_str": (lambda: bsmm(x, w, dw_dtype="half-ish"), TypeError, "dw_dtype"),
        "l2_gain": (lambda: bsmm.l2_normalize(w, gain=tf.ones([bsmm.K + 1])), ValueError, "gain must have shape"),
        "l2_epsilon": (lambda: bsmm.l2_normalize(w, epsilon=-1.0), ValueError, "epsilon"),
        "l2_dtype": (lambda: bsmm.l2_normalize(w, dtype=np.int32), TypeError, "dtype"),
        "l2_shape": (lambda: bsmm.l2_normalize(tf.zeros([1, 8, 8])), ValueError, "W must have shape"),
        "init_shape": (lambda: bsmm.identity_init()((1, 8, 8)), ValueError, "shape must be"),
        "init_gpu": (lambda: bsmm.identity_init(gpu="yes"), TypeError, "gpu must be a bool"),
    }


BAD_CALLS = sorted(bad_calls(BlocksparseMatMul(np.eye(2, dtype=int), 8)))


@pytest.mark.parametrize("case", BAD_CALLS)
def test_call_bad_arguments(case):
    bsmm = BlocksparseMatMul(np.array([[1, 1], [0, 1]]), block_size=8)
    assert_raises(bad_calls(bsmm)[case])


BAD_CONSTRUCTORS = {
    "layout_empty": (lambda: BlocksparseMatMul(np.zeros((2, 2))), ValueError, "layout"),
    "layout_1d": (lambda: BlocksparseMatMul(np.ones(4)), ValueError, "layout"),
    "layout_values": (lambda: BlocksparseMatMul(np.full((2, 2), 2)), ValueError, "layout"),
    "layout_str": (lambda: BlocksparseMatMul("ab"), TypeError, "layout"),
    "block_size_12": (lambda: BlocksparseMatMul(np.ones((2, 2)), block_size=12), ValueError, "block_size"),
    "block_size_float": (lambda: BlocksparseMatMul(np.ones((2, 2)), block_size=32.0), TypeError, "block_size"),
    "feature_axis_2": (lambda: BlocksparseMatMul(np.ones((2, 2)), feature_axis=2), ValueError, "feature_axis"),
    "feature_axis_str": (lambda: BlocksparseMatMul(np.ones((2, 2)), feature_axis="1"), TypeError, "feature_axis"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONSTRUCTORS))
def test_constructor_bad_arguments(case):
    assert_raises(BAD_CONSTRUCTORS[case])
