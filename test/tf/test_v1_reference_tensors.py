"""TF1-style graphs with reference variables (``tf.compat.v1.disable_v2_behavior()`` makes them; the
original package's examples used them): every op takes the ``float32_ref`` tensors such graphs hold
(an assign's output) and reference variables, and gives the values and gradients it gives plain
tensors; the matmul is also checked against float64."""
import numpy as np
import pytest
import tensorflow as tf

import blocksparse.ewops as ew
from blocksparse.conv import BlocksparseConv, cwise_linear
from blocksparse.lstm import fused_lstm_gates
from blocksparse.matmul import BlocksparseMatMul
from blocksparse.norms import batch_norm, layer_norm
from blocksparse.transformer import BlocksparseTransformer

v1 = tf.compat.v1
_BSMM = BlocksparseMatMul(np.array([[1, 0], [1, 1]]), 8)
_CONV = BlocksparseConv([([0, 1], [0, 1]), ([2], [2])], (3,), (6,), edge_bias=True)
_BST = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=8, heads=2)

# name: (shapes of the inputs, the op on them)
CASES = {
    "matmul": ([[4, 16], list(_BSMM.w_shape)], lambda x, w: [_BSMM(x, w)]),
    "matmul-l2": ([list(_BSMM.w_shape), [16]], lambda w, g: [_BSMM.l2_normalize(w, gain=g)]),
    "ew-binary": ([[4, 8], [4, 8]], lambda a, b: [ew.add(a, b), ew.multiply(a, b), ew.maximum(a, b), ew.add_n8([a, b])]),
    "ew-unary": ([[4, 8]], lambda a: [ew.sigmoid(a), ew.gelu(a), ew.float_cast(a, tf.float16)]),
    "lstm-four": ([[4, 8]] * 5, lambda c, i, j, f, o: list(fused_lstm_gates(c, i, j, f, o)) + [ew.concat4(i, j, f, o)]),
    "lstm-merged": ([[4, 8], [4, 32], [32]], lambda c, z, b: list(fused_lstm_gates(c, z, bias=b))),
    "layer_norm": ([[4, 32], [32], [32]], lambda x, g, b: [layer_norm(x, g, b, segments=4, relu=True)]),
    "batch_norm": ([[2, 3, 4], [3], [3]], lambda x, g, b: list(batch_norm(x, g, b)) + [cwise_linear(x, g, b)]),
    "conv": ([list(_CONV.f_shape()), _CONV.i_shape(2), list(_CONV.edge_bias_shape())],
             lambda f, x, eb: [_CONV(f, x, edge_bias=eb), _CONV.l2_normalize(f)]),
    "transformer": ([[2, 16, 8], [2, 16, 8], [2, 16, 8]],
                    lambda q, k, v: [_BST.weight_value_op(_BST.masked_softmax(_BST.query_key_op(q, k), 0.5), v)]),
}


def _run(values, build, as_ref):
    """Outputs and gradients (of sum(outputs * weights)) with the inputs as reference tensors (an
    assign's output) or plain ones (placeholders: constants would let the graph optimiser fold whole
    gradients with other kernels, a last-bit difference that is not the ops')."""
    with tf.Graph().as_default():
        feed = {}
        if as_ref:
            variables = [v1.Variable(x, use_resource=False) for x in values]
            inputs = [v1.assign(v, v) for v in variables]
            assert all(t.dtype == tf.float32._as_ref for t in inputs)
        else:
            inputs = [v1.placeholder(tf.float32, x.shape) for x in values]
            feed = dict(zip(inputs, values))
        outs = build(*inputs)
        loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32) * (k + 1.5)) for k, o in enumerate(outs)])
        grads = [g for g in tf.gradients(loss, inputs) if g is not None]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            return sess.run([outs, grads], feed)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_tensors_match_plain_tensors(rng, name):
    shapes, build = CASES[name]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    (outs_ref, grads_ref), (outs, grads) = _run(values, build, True), _run(values, build, False)
    assert len(grads_ref) == len(grads) > 0
    for got, want in zip(outs_ref + grads_ref, outs + grads):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-6, atol=1e-6)


def test_reference_variables_in_disabled_v2_style_graph(rng):
    """``get_variable`` with ``use_resource=False`` (what ``disable_v2_behavior`` gives), a matmul on
    its value, against float64."""
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.standard_normal(_BSMM.w_shape).astype(np.float32)
    with tf.Graph().as_default():
        wv = v1.get_variable("w", initializer=w, use_resource=False)
        xv = v1.get_variable("x", initializer=x, use_resource=False)
        y = _BSMM(v1.assign_add(xv, tf.zeros_like(xv)), wv)
        dw = tf.gradients(tf.reduce_sum(y), wv)[0]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            got, got_dw = sess.run([y, dw])
    dense = _BSMM.layout.dense(w.astype(np.float64))
    np.testing.assert_allclose(got, x.astype(np.float64) @ dense, rtol=1e-5, atol=1e-5)
    want_dw = _BSMM.layout.pack(x.astype(np.float64).T @ np.ones((4, 16)))
    np.testing.assert_allclose(got_dw, want_dw, rtol=1e-5, atol=1e-5)
