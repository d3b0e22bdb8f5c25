"""group_param_grads: merged dW products equal the ungrouped gradient and the float64 reference."""
import math

import numpy as np
import pytest
import tensorflow as tf

from blocksparse.matmul import BlocksparseMatMul, get_parents, group_param_grads
from blocksparse.testing import rel_error
from blocksparse.testing.matmul import random_layout


def ancestors(tensor):
    """Every op ``tensor`` depends on (data inputs and control inputs)."""
    seen, todo = set(), [tensor.op]
    while todo:
        op = todo.pop()
        if op in seen:
            continue
        seen.add(op)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return seen


def count_products(tensor):
    """(updat matmuls, original per-use dW ops) that ``tensor`` is computed from."""
    ops = ancestors(tensor)
    matmuls = sum(op.type.startswith("BatchMatMul") for op in ops)
    originals = sum(op.name.split("/")[-1].startswith("BlocksparseMatmulDW") and "group_param_grads" not in op.name
                    for op in ops)  # (merged products are named as dW products too, in the grouping's scope)
    return matmuls, originals


def expected_counts(uses, group_size):
    chunks = [min(group_size, uses - s) for s in range(0, uses, group_size)]
    return len(chunks), chunks.count(1)


def independent_uses(rng, bsmm, T):
    """T uses of one weight with minibatches of different sizes: inputs, output weights, dW ref."""
    ns = rng.integers(1, 20, size=T)
    xs = [rng.standard_normal(bsmm.i_shape(int(n))).astype(np.float32) for n in ns]
    rs = [rng.standard_normal(bsmm.o_shape(int(n))).astype(np.float32) for n in ns]
    if bsmm.axis == 1:
        ref = sum(bsmm.layout.pack(x.T.astype(np.float64) @ r) for x, r in zip(xs, rs))
    else:
        ref = sum(bsmm.layout.pack(x.astype(np.float64) @ r.T) for x, r in zip(xs, rs))
    return xs, rs, ref


def make_bsmm(rng, axis, bs=8):
    # the reference products: the op counts below are theirs (one batched matmul per dW product)
    return BlocksparseMatMul(random_layout(rng, 5, 4, 0.5, empty_rows=1, empty_cols=1),
                             block_size=bs, feature_axis=axis, impl="reference")


@pytest.mark.parametrize("T, group_size, axis", [
    (3, 8, 1), (5, 2, 0), (10, 3, 1), (10, 8, 0), (7, 1, 1), (9, 4, 1),
], ids=lambda v: str(v))
def test_compat_v1_graph(rng, T, group_size, axis):
    bsmm = make_bsmm(rng, axis)
    xs, rs, ref = independent_uses(rng, bsmm, T)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=rng.standard_normal(bsmm.w_shape).astype(np.float32))
        loss = tf.add_n([tf.reduce_sum(bsmm(x, w) * r) for x, r in zip(xs, rs)])
        grad, = tf.gradients(loss, [w])
        assert grad.op.type == "AddN" and count_products(grad) == (T, T)
        grouped = group_param_grads(grad, group_size=group_size)
        assert grouped.dtype == tf.float32
        assert count_products(grouped) == expected_counts(T, group_size)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            plain, merged = sess.run([grad, grouped])
    assert rel_error(merged, plain) < 1e-6
    assert rel_error(merged, ref) < 1e-5


def recurrent_reference(dense, xs, r):
    """h_{t+1} = h_t @ W + x_{t+1}, h_0 = x_0; loss = sum(h_T * r); returns dL/dW (dense)."""
    hs = [xs[0]]
    for x in xs[1:]:
        hs.append(hs[-1] @ dense + x)
    h_last = hs[-1] @ dense
    dh, dw = r, np.zeros_like(dense)
    for h in reversed(hs):
        dw += h.T @ dh
        dh = dh @ dense.T
    return h_last, dw


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_recurrent_use(rng, mode):
    """One weight at every step of an unrolled recurrence (the use case of the original)."""
    T, N, group_size = 6, 4, 4
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 4, 0.6), block_size=16)
    w0 = (0.2 * rng.standard_normal(bsmm.w_shape)).astype(np.float32)
    xs = [rng.standard_normal(bsmm.i_shape(N)).astype(np.float32) for _ in range(T)]
    r = rng.standard_normal(bsmm.o_shape(N)).astype(np.float32)

    def chain(w, xs):
        h = xs[0]
        for x in xs[1:]:
            h = bsmm(h, w) + x
        return tf.reduce_sum(bsmm(h, w) * r)

    if mode == "function":
        w = tf.Variable(w0)

        @tf.function(input_signature=[tf.TensorSpec(bsmm.i_shape(None))] * T)
        def grads(*xs):
            with tf.GradientTape() as tape:
                loss = chain(w, xs)
            grad = tape.gradient(loss, w)
            grouped = group_param_grads(grad, group_size=group_size)
            assert count_products(grouped)[1] == 0  # 6 uses in groups of 4 -> two merged products
            return grad, grouped

        plain, merged = (t.numpy() for t in grads(*xs))
    else:
        with tf.Graph().as_default():
            w = tf.compat.v1.get_variable("w", initializer=w0)
            grad, = tf.gradients(chain(w, xs), [w])
            grouped = group_param_grads(grad, group_size=group_size)
            assert count_products(grouped)[1] == 0
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                plain, merged = sess.run([grad, grouped])
    dense = bsmm.layout.dense(w0.astype(np.float64))
    _, ref = recurrent_reference(dense, [x.astype(np.float64) for x in xs], r.astype(np.float64))
    assert rel_error(merged, plain) < 1e-6
    assert rel_error(merged, bsmm.layout.pack(ref)) < 1e-5


@pytest.mark.parametrize("cast32", [True, False], ids=["cast32", "keep"])
@pytest.mark.parametrize("dw_dtype", [tf.float16, tf.bfloat16], ids=["dw-fp16", "dw-bf16"])
def test_low_precision_dw(rng, dw_dtype, cast32):
    bsmm = make_bsmm(rng, 1)
    xs, rs, ref = independent_uses(rng, bsmm, 5)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=np.zeros(bsmm.w_shape, np.float32))
        loss = tf.add_n([tf.reduce_sum(bsmm(x, w, dw_dtype=dw_dtype) * r) for x, r in zip(xs, rs)])
        grad, = tf.gradients(loss, [w])
        assert grad.dtype == dw_dtype
        grouped = group_param_grads(grad, group_size=3, cast32=cast32)
        assert grouped.dtype == (tf.float32 if cast32 else dw_dtype)
        assert count_products(grouped) == expected_counts(5, 3)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            merged = sess.run(tf.cast(grouped, tf.float64))
    assert rel_error(merged, ref) < (2e-3 if dw_dtype == tf.float16 else 1e-2)


def test_other_terms_and_casts_are_kept(rng):
    """A weight-decay term in the sum and Identity / Cast ops on top survive the rewrite."""
    bsmm = make_bsmm(rng, 0)
    xs, rs, ref = independent_uses(rng, bsmm, 4)
    w0 = rng.standard_normal(bsmm.w_shape).astype(np.float32)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w0)
        loss = tf.add_n([tf.reduce_sum(bsmm(x, w) * r) for x, r in zip(xs, rs)])
        loss += 0.5 * tf.reduce_sum(w ** 2)
        grad, = tf.gradients(loss, [w])
        grad = tf.cast(tf.identity(grad), tf.float16)
        grouped = group_param_grads(grad, group_size=2, cast32=False)
        assert grouped.dtype == tf.float16 and grouped.op.type == "Cast"
        assert count_products(grouped) == expected_counts(4, 2)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            merged = sess.run(grouped)
    assert rel_error(merged, ref + w0) < 2e-3


def test_tree_aggregation_and_two_layouts(rng):
    """Nested sums are flattened; products of different layouts are merged separately."""
    a = BlocksparseMatMul(np.array([[1, 1], [0, 1]]), block_size=8, impl="reference")
    b = BlocksparseMatMul(np.array([[0, 1], [1, 1]]), block_size=8, impl="reference")  # same w_shape
    xa, ra, ref_a = independent_uses(rng, a, 3)
    xb, rb, ref_b = independent_uses(rng, b, 3)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=np.zeros(a.w_shape, np.float32))
        terms = [tf.reduce_sum(m(x, w) * r) for m, xs, rs in ((a, xa, ra), (b, xb, rb))
                 for x, r in zip(xs, rs)]
        grad, = tf.gradients(tf.add_n(terms), [w],
                             aggregation_method=tf.AggregationMethod.EXPERIMENTAL_TREE)
        grouped = group_param_grads(grad, group_size=8)
        assert count_products(grouped) == (2, 0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            merged = sess.run(grouped)
    assert rel_error(merged, ref_a + ref_b) < 1e-5


def test_nothing_to_merge_returns_the_gradient(rng):
    bsmm = make_bsmm(rng, 1)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", bsmm.w_shape)
        grad, = tf.gradients(tf.reduce_sum(bsmm(tf.ones(bsmm.i_shape(3)), w)), [w])
        assert group_param_grads(grad) is grad
        dense_grad, = tf.gradients(tf.reduce_sum(w * w) + tf.reduce_sum(w), [w])
        assert group_param_grads(dense_grad) is dense_grad


@pytest.mark.parametrize("dw_dtype", [tf.float32, tf.float16], ids=["dw-fp32", "dw-fp16"])
def test_eager_returns_the_value(rng, dw_dtype):
    bsmm = make_bsmm(rng, 1)
    xs, rs, ref = independent_uses(rng, bsmm, 3)
    w = tf.Variable(np.zeros(bsmm.w_shape, np.float32))
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(bsmm(x, w, dw_dtype=dw_dtype) * r) for x, r in zip(xs, rs)])
    grad = tape.gradient(loss, w)
    out = group_param_grads(grad)
    assert out.dtype == tf.float32
    np.testing.assert_array_equal(out.numpy(), tf.cast(grad, tf.float32).numpy())
    assert group_param_grads(grad, cast32=False).dtype == dw_dtype
    assert rel_error(out.numpy(), ref) < (1e-5 if dw_dtype == tf.float32 else 2e-3)


@pytest.mark.parametrize("group_size", [0, 9, -1, 2.5, "8", True, None])
def test_bad_group_size(group_size):
    with pytest.raises(ValueError, match="group_size must be an int in 1..8"):
        group_param_grads(tf.ones(3), group_size=group_size)


def test_bad_arguments():
    with pytest.raises(TypeError, match="cast32 must be a bool"):
        group_param_grads(tf.ones(3), cast32="yes")
    with pytest.raises(TypeError, match="param_grad must be a dense tf.Tensor"):
        group_param_grads(None)
    with pytest.raises(TypeError, match="param_grad"):
        group_param_grads(np.ones(3))


def test_merging_is_at_most_group_size(rng):
    """The concatenated minibatch of a merged product spans at most group_size uses."""
    bsmm = make_bsmm(rng, 1)
    T, group_size = 7, 3
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", bsmm.w_shape)
        xs = [tf.ones(bsmm.i_shape(2)) for _ in range(T)]
        grad, = tf.gradients(tf.add_n([tf.reduce_sum(bsmm(x, w)) for x in xs]), [w])
        grouped = group_param_grads(grad, group_size=group_size)
        concats = [op for op in ancestors(grouped) if op.type == "ConcatV2"]
        widths = sorted(len(op.inputs) - 1 for op in concats)  # the last input is the axis
        assert widths == [3, 3, 3, 3]  # x and dy of two merged groups; the seventh use stays alone
        assert math.ceil(T / group_size) == count_products(grouped)[0]


@pytest.mark.parametrize("wrap", ["gate_gradients", "cast_per_use"])
def test_products_under_their_own_identity_or_cast(rng, wrap):
    """Each use's product wrapped on its own: a weight cast before each use gives a Cast per term,
    and those merge; tf.compat.v1 optimizers' gate_gradients give an Identity with control inputs
    per term (later steps' dy wait for each product: it runs anyway), and those stay.  The same
    value either way."""
    bsmm = make_bsmm(rng, 1)
    T, group_size = 4, 4
    xs, rs, _ = independent_uses(rng, bsmm, T)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=rng.standard_normal(bsmm.w_shape).astype(np.float32))
        wf = (lambda: tf.cast(w, tf.float16)) if wrap == "cast_per_use" else (lambda: w)
        dtype = tf.float16 if wrap == "cast_per_use" else tf.float32
        loss = tf.add_n([tf.reduce_sum(tf.cast(bsmm(tf.constant(x, dtype), wf(), dw_dtype=dtype), tf.float32) * r)
                         for x, r in zip(xs, rs)])
        gate = tf.compat.v1.train.Optimizer.GATE_OP if wrap == "gate_gradients" else None
        grad, = tf.gradients(loss, [w], gate_gradients=gate is not None)
        grouped = group_param_grads(grad, group_size=group_size)
        merged = [op for op in ancestors(grouped) if op.type == "ConcatV2"]
        assert (not merged) if gate else count_products(grouped)[0] == 1
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            want, got = sess.run([grad, grouped])
    assert got.dtype == want.dtype == np.float32
    assert rel_error(got, want) < (2e-3 if wrap == "cast_per_use" else 1e-5)


def test_merged_products_are_dw_products_too(rng):
    """``get_parents`` finds the merged products as it found the ones they replace, and grouping
    the grouped gradient again merges them further, to the same sum."""
    graph = tf.Graph()
    with graph.as_default():
        bsmm = BlocksparseMatMul(np.array([[1, 0], [1, 1]]), block_size=8)
        w = tf.constant(rng.standard_normal(bsmm.w_shape).astype(np.float32))
        xs = [tf.constant(rng.standard_normal((3, 16)).astype(np.float32)) for _ in range(4)]
        loss = tf.add_n([tf.reduce_sum(bsmm(x, w) ** 2) for x in xs])
        dw = tf.gradients(loss, w)[0]
        twice = group_param_grads(dw, group_size=2)
        once = group_param_grads(twice, group_size=2)
        found = (len(get_parents(dw, "BlocksparseMatmulDW")), len(get_parents(twice, "BlocksparseMatmulDW")),
                 len(get_parents(once, "BlocksparseMatmulDW")))
        with tf.compat.v1.Session(graph=graph) as sess:
            values = sess.run([dw, twice, once])
    assert found == (4, 2, 1)
    np.testing.assert_allclose(values[1], values[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values[2], values[0], rtol=1e-5, atol=1e-5)
