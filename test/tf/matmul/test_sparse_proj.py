"""SparseProj: gather / scatter / scatter_add / scatter_mul and their gradients against numpy."""
import pickle

import numpy as np
import pytest
import tensorflow as tf

from blocksparse.matmul import SparseProj
from blocksparse.testing import TOLERANCE, rel_error

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}


def numpy_ops(lut, nhidden):
    """(forward, gradient) pairs of the four projections, written with numpy fancy indexing."""
    def gather(x):
        return x[lut]

    def scatter(x):
        z = np.zeros((nhidden,) + x.shape[1:])
        z[lut] = x
        return z

    def scatter_add(x, y):
        z = x.copy()
        z[lut] += y
        return z

    def scatter_mul(x, y):
        z = x.copy()
        z[lut] *= y
        return z

    grads = {
        "gather": lambda dz, x: (scatter(dz),),
        "scatter": lambda dz, x: (dz[lut],),
        "scatter_add": lambda dz, x, y: (dz, dz[lut]),
        "scatter_mul": lambda dz, x, y: (scatter_mul(dz, y), dz[lut] * x[lut]),
    }
    forward = {"gather": gather, "scatter": scatter, "scatter_add": scatter_add,
               "scatter_mul": scatter_mul}
    return forward, grads


def inputs(rng, proj, op, trailing):
    """float32 inputs of ``op``: x (and y) with the feature axis first."""
    rows = proj.nproj if op == "scatter" else proj.nhidden
    args = [rng.standard_normal((rows,) + trailing).astype(np.float32)]
    if op in ("scatter_add", "scatter_mul"):
        args.append(rng.standard_normal((proj.nproj,) + trailing).astype(np.float32))
    return args


OPS = ["gather", "scatter", "scatter_add", "scatter_mul"]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op", OPS)
def test_eager_matches_numpy(rng, op, dtype):
    np.random.seed(int(rng.integers(2**31)))
    proj = SparseProj(96, nproj=40)
    args = [tf.cast(a, dtype) for a in inputs(rng, proj, op, (7,))]
    with tf.GradientTape() as tape:
        tape.watch(args)
        z = getattr(proj, op)(*args)
    dz = tf.cast(rng.standard_normal(z.shape), dtype)
    grads = tape.gradient(z, args, output_gradients=dz)
    assert z.dtype == dtype and all(isinstance(g, tf.Tensor) and g.dtype == dtype for g in grads)

    as64 = [tf.cast(a, tf.float64).numpy() for a in args]
    forward, backward = numpy_ops(proj.gather_lut, proj.nhidden)
    tol = TOLERANCE[dtype.name]
    assert rel_error(tf.cast(z, tf.float64).numpy(), forward[op](*as64)) < tol
    for got, ref in zip(grads, backward[op](tf.cast(dz, tf.float64).numpy(), *as64)):
        assert rel_error(tf.cast(got, tf.float64).numpy(), ref) < tol


@pytest.mark.parametrize("op", OPS)
def test_empty_minibatch(rng, op):
    """An empty trailing axis, eager and in tf.function with it unknown: empty results and gradients
    of the right shapes (TensorFlow's scatters refuse empty outputs)."""
    proj = SparseProj(64, nproj=8)
    args = [tf.constant(a) for a in inputs(rng, proj, op, (0,))]

    def run(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            z = getattr(proj, op)(*args)
        return z, tape.gradient(z, args, output_gradients=tf.zeros_like(z))

    traced = tf.function(run, input_signature=[tf.TensorSpec((a.shape[0], None)) for a in args])
    for z, grads in (run(*args), traced(*args)):
        assert z.shape == ((proj.nproj if op == "gather" else proj.nhidden), 0)
        assert [tuple(g.shape) for g in grads] == [tuple(a.shape) for a in args]


@pytest.mark.parametrize("op", OPS)
def test_compat_v1_graph_with_unknown_trailing_size(rng, op):
    proj = SparseProj(64, proj_stride=4, block_size=8)
    arrays = inputs(rng, proj, op, (5, 3))
    with tf.Graph().as_default():
        phs = [tf.compat.v1.placeholder(tf.float32, (a.shape[0], None, 3)) for a in arrays]
        z = getattr(proj, op)(*phs)
        dz = tf.compat.v1.placeholder(tf.float32, z.shape)
        grads = tf.gradients(z, phs, grad_ys=dz)
        dz_val = rng.standard_normal((z.shape[0], 5, 3)).astype(np.float32)
        with tf.compat.v1.Session() as sess:
            out = sess.run([z] + grads, dict(zip(phs + [dz], arrays + [dz_val])))
    forward, backward = numpy_ops(proj.gather_lut, proj.nhidden)
    assert rel_error(out[0], forward[op](*arrays)) < 1e-6
    for got, ref in zip(out[1:], backward[op](dz_val, *arrays)):
        assert rel_error(got, ref) < 1e-6


def test_selections():
    np.random.seed(0)
    by_count = SparseProj(100, nproj=30)
    assert by_count.nproj == 30 and by_count.gather_lut.shape == (30,)
    assert np.all(np.diff(by_count.gather_lut) > 0) and by_count.gather_lut.max() < 100
    np.random.seed(0)
    np.testing.assert_array_equal(SparseProj(100, nproj=30).gather_lut, by_count.gather_lut)

    by_stride = SparseProj(100, proj_stride=3, block_size=8)  # 33 features, trimmed to 32
    np.testing.assert_array_equal(by_stride.gather_lut, np.arange(32) * 3)

    explicit = SparseProj(10, gather_lut=[7, 2, 5])
    assert explicit.nproj == 3
    np.testing.assert_array_equal(explicit.scatter_lut, [-1, -1, 1, -1, -1, 2, -1, 0, -1, -1])
    x = tf.reshape(tf.range(10, dtype=tf.float32), (10, 1))
    assert explicit.gather(x).numpy().ravel().tolist() == [7, 2, 5]


def test_pickle_round_trip():
    proj = SparseProj(20, gather_lut=[3, 1, 4], name="p")
    back = pickle.loads(pickle.dumps(proj))
    np.testing.assert_array_equal(back.gather_lut, proj.gather_lut)
    assert (back.nhidden, back.nproj, back.name) == (20, 3, "p")


@pytest.mark.parametrize("kwargs, err, words", [
    ({}, ValueError, "needs one of nproj, proj_stride or gather_lut"),
    ({"nproj": 0}, ValueError, r"nproj must be in 1..16; got 0"),
    ({"nproj": 17}, ValueError, "nproj must be in 1..16; got 17"),
    ({"nproj": 2.0}, TypeError, "nproj must be an int"),
    ({"proj_stride": 17}, ValueError, "proj_stride must be in 1..16"),
    ({"proj_stride": 4, "block_size": 8}, ValueError, "selects no feature"),
    ({"nproj": 4, "proj_stride": 2}, ValueError, "give one of"),
    ({"gather_lut": [1, 1, 2]}, ValueError, "must not repeat"),
    ({"gather_lut": [0, 16]}, ValueError, r"gather_lut values must be in \[0, 16\)"),
    ({"gather_lut": [[0, 1]]}, ValueError, "1-D"),
    ({"gather_lut": [0.5, 1.0]}, TypeError, "gather_lut must hold ints"),
    ({"gather_lut": [0, 1], "nproj": 3}, ValueError, "nproj must equal len"),
    ({"gather_lut": [1, 2], "nproj": 2.0}, TypeError, "nproj must be an int"),
    ({"gather_lut": [1], "nproj": True}, TypeError, "nproj must be an int"),
    ({"gather_lut": [1, 2], "nproj": "2"}, TypeError, "nproj must be an int"),
], ids=["none", "nproj0", "nproj-big", "nproj-float", "stride-big", "stride-empty", "two-ways",
        "lut-repeat", "lut-range", "lut-2d", "lut-float", "lut-nproj", "lut-nproj-float", "lut-nproj-bool",
        "lut-nproj-str"])
def test_bad_construction(kwargs, err, words):
    with pytest.raises(err, match=words):
        SparseProj(16, **kwargs)


@pytest.mark.parametrize("nhidden", [0, -3, 4.0])
def test_bad_nhidden(nhidden):
    with pytest.raises((ValueError, TypeError), match="nhidden"):
        SparseProj(nhidden, nproj=1)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_bad_inputs(mode):
    proj = SparseProj(16, gather_lut=[0, 5, 9])
    cases = [
        (lambda: proj.gather(tf.zeros((15, 2))), ValueError, r"x must have 16 rows on axis 0; got shape \(15, 2\)"),
        (lambda: proj.scatter(tf.zeros((16, 2))), ValueError, "x must have 3 rows"),
        (lambda: proj.scatter_add(tf.zeros((16, 2)), tf.zeros((4, 2))), ValueError, "y must have 3 rows"),
        (lambda: proj.scatter_mul(tf.zeros((16, 2)), tf.zeros((3, 5))), ValueError,
         "x and y must have the same shape after axis 0"),
        (lambda: proj.gather(tf.zeros((16, 2), tf.int32)), TypeError, "x must have dtype float32"),
        (lambda: proj.scatter_add(tf.zeros((16, 2)), tf.zeros((3, 2), tf.float16)), TypeError,
         "x and y must have the same dtype"),
        (lambda: proj.gather(tf.zeros(())), ValueError, "rank >= 1"),
    ]
    for build, err, words in cases:
        if mode == "eager":
            with pytest.raises(err, match=words):
                build()
        else:
            with tf.Graph().as_default(), pytest.raises(err, match=words):
                build()


def test_unknown_rows_are_checked_at_run_time():
    proj = SparseProj(16, gather_lut=[0, 5, 9])
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 2))
        z = proj.gather(x)
        with tf.compat.v1.Session() as sess:
            assert sess.run(z, {x: np.ones((16, 2))}).shape == (3, 2)
            with pytest.raises(tf.errors.InvalidArgumentError, match="x must have 16 rows"):
                sess.run(z, {x: np.ones((12, 2))})


@pytest.mark.parametrize("mode", ["graph", "function"])
def test_unknown_rank_scalar_is_refused_naming_x(mode):
    """A scalar where the rank is unknown until run time fails on the row check, not inside."""
    proj = SparseProj(16, gather_lut=[0, 5, 9])
    if mode == "function":
        gather = tf.function(proj.gather, input_signature=[tf.TensorSpec(None, tf.float32)])
        assert gather(tf.ones((16, 2))).shape == (3, 2)
        with pytest.raises(tf.errors.InvalidArgumentError, match="x must have 16 rows"):
            gather(tf.constant(1.0))
        return
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, None)
        z = proj.gather(x)
        with tf.compat.v1.Session() as sess:
            assert sess.run(z, {x: np.ones((16, 2))}).shape == (3, 2)
            with pytest.raises(tf.errors.InvalidArgumentError, match="x must have 16 rows"):
                sess.run(z, {x: np.float32(1.0)})


@pytest.mark.parametrize("jit", [False, True], ids=["function", "xla"])
@pytest.mark.parametrize("rank", [2, None], ids=["rank2", "unknown_rank"])
def test_graph_shapes_are_checked_where_assertions_are_dropped(jit, rank):
    """Inside tf.function (and under XLA, which drops assertions) a wrong row count or a trailing
    shape that would broadcast must fail, never give a silently wrong result."""
    proj = SparseProj(6, gather_lut=[0, 2, 4])
    sig = tf.TensorSpec([None] * rank if rank else None, tf.float32)
    gather = tf.function(proj.gather, input_signature=[sig], jit_compile=jit)
    ops = {op: tf.function(getattr(proj, op), input_signature=[sig, sig], jit_compile=jit)
           for op in ("scatter_add", "scatter_mul")}
    assert gather(tf.ones((6, 2))).shape == (3, 2)
    with pytest.raises(tf.errors.InvalidArgumentError):
        gather(tf.ones((5, 2)))
    for op, fn in ops.items():
        assert fn(tf.ones((6, 2)), tf.ones((3, 2))).shape == (6, 2)
        for xs, ys in [((6, 2), (3, 1)), ((6, 1), (3, 2)), ((1, 2), (3, 2)), ((6, 2), (1, 2))]:
            with pytest.raises(tf.errors.InvalidArgumentError):
                fn(tf.ones(xs), tf.ones(ys))
