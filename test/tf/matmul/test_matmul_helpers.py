"""The original examples' matmul helpers: largest_block, get_parents, add_control_input."""
import numpy as np
import pytest
import tensorflow as tf

from blocksparse.matmul import BlocksparseMatMul, add_control_input, get_parents, largest_block


@pytest.mark.parametrize("dim, expect", [(96, (32, 3)), (48, (16, 3)), (40, (8, 5)), (32, (32, 1))])
def test_largest_block(dim, expect):
    assert largest_block(dim) == expect


def test_largest_block_with_larger_blocks():
    assert largest_block(256, block_sizes=(128, 64, 32)) == (128, 2)
    assert largest_block(192, block_sizes=(8, 128, 64)) == (64, 3)


@pytest.mark.parametrize("args, error, match", [
    ((12,), ValueError, "multiple of one of the block sizes"),
    ((0,), ValueError, "dim must be >= 1"),
    ((32.0,), TypeError, "dim must be an int"),
], ids=["not-a-multiple", "zero", "float"])
def test_largest_block_bad(args, error, match):
    with pytest.raises(error, match=match):
        largest_block(*args)


def test_largest_block_bad_sizes():
    with pytest.raises(ValueError, match="block_sizes"):
        largest_block(48, block_sizes=(24,))
    with pytest.raises(ValueError, match="block_sizes"):
        largest_block(48, block_sizes=())


def _two_step_graph(rng):
    """h2 = bsmm(bsmm(x, w), w) in a fresh graph: two uses of one weight."""
    bsmm = BlocksparseMatMul(np.ones((2, 2), np.int32), block_size=8)
    x = tf.compat.v1.placeholder(tf.float32, [None, 16])
    w = tf.constant(rng.standard_normal(bsmm.w_shape), tf.float32)
    h = bsmm(bsmm(x, w), w)
    return x, w, h


def test_get_parents_finds_the_gradient_products(rng):
    with tf.Graph().as_default():
        x, w, h = _two_step_graph(rng)
        dx, dw = tf.gradients(tf.reduce_sum(h), [x, w])
        dx_ops = get_parents(dx, "BlocksparseMatmulDX")
        assert len(dx_ops) == 1 and dx_ops[0] is dx.op  # dx of the first use is the last product
        dw_ops = get_parents(dw, "BlocksparseMatmulDW")
        assert len(dw_ops) == 2 and all(op.name.split("/")[-1].startswith("BlocksparseMatmulDW")
                                        for op in dw_ops)
        # the first use's dW is computed from the second use's dx (its output gradient)
        inner = get_parents(dw, "BlocksparseMatmulDX")
        assert len(inner) == 1 and inner[0] is not dx.op
        assert get_parents(h, "Nothing") == []


def test_get_parents_of_plain_ops():
    with tf.Graph().as_default():
        a = tf.compat.v1.placeholder(tf.float32, [3, 3])
        m1, m2 = tf.matmul(a, a), tf.matmul(a, tf.transpose(a))
        total = tf.tanh(m1 + m2) + tf.matmul(m1, m2)
        found = get_parents(total, "MatMul")
        assert len(found) == 3 and len(set(found)) == 3
        assert get_parents(m1.op, "MatMul") == [m1.op]
        assert set(get_parents(tf.tanh(m1 + m2), "MatMul")) == {m1.op, m2.op}


def test_get_parents_in_tf_function(rng):
    bsmm = BlocksparseMatMul(np.eye(2, dtype=np.int32), block_size=8)
    w = tf.constant(rng.standard_normal(bsmm.w_shape), tf.float32)
    found = []

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def f(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = bsmm(x, w)
        dx = tape.gradient(y, x)
        found.extend(get_parents(dx, "BlocksparseMatmulDX"))
        return dx

    f(np.ones((3, 16), np.float32))
    assert len(found) == 1


def test_add_control_input_orders_ops():
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(1.0, use_resource=True)
        read = tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32)  # the read op itself:
        # making an op after the read (read_value() ends in an Identity) wait would still race
        assign = v.assign(5.0)
        add_control_input(read, assign)  # a tensor gives its op
        add_control_input(read.op, assign.op)  # twice is the same as once
        assert list(read.op.control_inputs).count(assign.op) == 1
        with tf.compat.v1.Session() as sess:
            sess.run(v.initializer)
            assert sess.run(read) == 5.0


def test_add_control_input_refuses_a_cycle():
    with tf.Graph().as_default():
        a = tf.constant(1.0)
        b = a * 2.0
        c = b + 1.0
        with pytest.raises(ValueError, match="deadlock"):
            add_control_input(b.op, c.op)


def test_graph_helpers_need_graphs():
    with pytest.raises(TypeError, match="eager"):
        get_parents(tf.ones([2]), "MatMul")
    with pytest.raises(TypeError, match="op_type"):
        get_parents(tf.ones([2]), 3)
    with pytest.raises(TypeError, match="eager"):
        add_control_input(tf.ones([2]), tf.ones([2]))
    with tf.Graph().as_default():
        a = tf.constant(1.0)
    with tf.Graph().as_default():
        b = tf.constant(2.0)
        with pytest.raises(ValueError, match="same graph"):
            add_control_input(b, a)


@pytest.mark.parametrize("sizes", [32, None, "32"])
def test_largest_block_sizes_must_be_a_sequence(sizes):
    with pytest.raises(TypeError, match="block_sizes must be a sequence"):
        largest_block(64, block_sizes=sizes)


def test_top_level_names_of_the_original():
    """``import blocksparse as bs; bs.float_cast(...)``: the original's top-level names that this
    package has are the submodules' objects (imported on first use)."""
    import importlib

    import blocksparse as bs

    for name, module in bs._LAZY.items():
        assert getattr(bs, name) is getattr(importlib.import_module(f"blocksparse.{module}"), name), name
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        bs.not_a_name


def _loops(bsmm, I, W, E, gate):
    """The products block by block from ``block_coord`` (independent of the layout's dense form)."""
    bs, ax = bsmm.block_size, bsmm.axis
    I2, E2 = (I, E) if ax else (I.T, E.T)  # (N, features)
    y, dx, dw = np.zeros((len(I2), bsmm.K)), np.zeros((len(I2), bsmm.C)), np.zeros(bsmm.w_shape)
    for b in range(bsmm.blocks):
        c, k = bsmm.block_coord(b)
        wb = W[b] * gate[b]
        rc, rk = slice(c * bs, (c + 1) * bs), slice(k * bs, (k + 1) * bs)
        y[:, rk] += I2[:, rc] @ wb
        dx[:, rc] += E2[:, rk] @ wb.T
        dw[b] = I2[:, rc].T @ E2[:, rk] * gate[b]
    return (y, dx, dw) if ax else (y.T, dx.T, dw)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("z_order", [False, True])
def test_numpy_test_helpers(rng, axis, z_order):
    """The original's numpy helpers (``fprop_test``, ``bprop_test``, ``updat_test``, ``updat_list``,
    ``l2_normalize_test``): against block-by-block loops and against the op itself."""
    layout = (rng.random((3, 4)) < 0.6).astype(np.int64)
    layout[0, 0] = 1
    bsmm = BlocksparseMatMul(layout, block_size=8, feature_axis=axis, z_order=z_order)
    W = rng.standard_normal(bsmm.w_shape)
    I, E = rng.standard_normal(bsmm.i_shape(5)), rng.standard_normal(bsmm.o_shape(5))
    gate = rng.uniform(0.5, 2.0, bsmm.blocks)
    y, dx, dw = _loops(bsmm, I, W, E, gate)
    np.testing.assert_allclose(bsmm.fprop_test(I, W, gate=gate), y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bsmm.bprop_test(E, W, gate=gate), dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bsmm.updat_test(I, E, gate=gate, dw_gated=True), dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bsmm.updat_test(I, E, gate=gate), dw / gate[:, None, None], rtol=1e-12, atol=1e-12)
    assert bsmm.updat_list == [bsmm.block_coord(b) for b in range(bsmm.blocks)]
    assert sorted(bsmm.updat_list) == [tuple(map(int, ck)) for ck in np.argwhere(layout)]

    Wt, It = tf.Variable(W, dtype=tf.float32), tf.constant(I, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(It)
        out = bsmm(It, Wt)
    got_dx, got_dw = tape.gradient(out, [It, Wt], output_gradients=tf.constant(E, tf.float32))
    for got, want in ((out, bsmm.fprop_test(I, W)), (got_dx, bsmm.bprop_test(E, W)), (got_dw, bsmm.updat_test(I, E)),
                      (bsmm.l2_normalize(Wt), bsmm.l2_normalize_test(W))):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    norms = np.zeros(bsmm.K)
    for b, (c, k) in enumerate(bsmm.updat_list):
        norms[k * 8:(k + 1) * 8] += (W[b] ** 2).sum(0)
    normed = bsmm.l2_normalize_test(W)
    for b, (c, k) in enumerate(bsmm.updat_list):
        np.testing.assert_allclose(normed[b], W[b] / np.sqrt(norms[k * 8:(k + 1) * 8]), rtol=1e-12)
    with pytest.raises(ValueError, match="gate must hold one value per block"):
        bsmm.fprop_test(I, W, gate=gate[:-1])
    # activations of the wrong size or rank, a wrong W, different minibatches: named, never broadcast
    wide = rng.standard_normal(bsmm.i_shape(5)[:axis] + (bsmm.C + 1,) + bsmm.i_shape(5)[axis + 1:])
    for call, name in ((lambda: bsmm.fprop_test(wide, W), "I"), (lambda: bsmm.fprop_test(I[None], W), "I"),
                       (lambda: bsmm.bprop_test(I if bsmm.C != bsmm.K else E[None], W), "E"),
                       (lambda: bsmm.updat_test(wide, E), "I"), (lambda: bsmm.fprop_test(I, W[1:]), "W")):
        with pytest.raises(ValueError, match=f"^{name} must have shape"):
            call()
    with pytest.raises(ValueError, match="I and E must have the same minibatch"):
        bsmm.updat_test(I, rng.standard_normal(bsmm.o_shape(4)))
