"""Acceptance: the original README's example program, run as written (TensorFlow 1 API through
``tf.compat.v1``), checked against a float64 numpy product."""
import numpy as np
import tensorflow as tf

from blocksparse.testing import rel_error, tolerance

#: The original example, with the ``tf.compat.v1`` prefixes TensorFlow 2 needs and nothing else
#: changed (sizes included).
SEED_EXAMPLE = """
from blocksparse.matmul import BlocksparseMatMul
import tensorflow as tf
import numpy as np

hidden_size = 4096
block_size = 32
minibatch_size = 64

# Create a (random) sparsity pattern
sparsity = np.random.randint(2, size=(hidden_size//block_size,hidden_size//block_size))

# Initialize the sparse matrix multiplication object
bsmm = BlocksparseMatMul(sparsity, block_size=block_size)

# Input to graph
x = tf.compat.v1.placeholder(tf.float32, shape=[None, hidden_size])

# Initialize block-sparse weights
w = tf.compat.v1.get_variable("w", bsmm.w_shape, dtype=tf.float32)

# Block-sparse matrix multiplication
y = bsmm(x, w)

# Run
sess = tf.compat.v1.InteractiveSession()
sess.run(tf.compat.v1.global_variables_initializer())
result = sess.run([y], feed_dict = {x: np.ones((minibatch_size,hidden_size), dtype='float32')})
print(result)
"""


def test_seed_example_runs_and_is_right(rng, capsys):
    np.random.seed(int(rng.integers(2**31)))  # the example draws its layout from numpy's global generator
    scope = {}
    with tf.Graph().as_default():
        exec(compile(SEED_EXAMPLE, "seed_example", "exec"), scope)
        sess = scope["sess"]
        try:
            w = sess.run(scope["w"])
        finally:
            sess.close()
    bsmm, result = scope["bsmm"], scope["result"]
    assert "array(" in capsys.readouterr().out
    assert isinstance(result, list) and len(result) == 1
    y = result[0]
    assert y.shape == (64, 4096) and y.dtype == np.float32
    dense = bsmm.layout.dense(w.astype(np.float64))
    assert dense.shape == (4096, 4096)
    ref = np.ones((64, 4096)) @ dense
    assert rel_error(y, ref) < tolerance(np.float32)
    # the layout the example drew is the one the product used: absent blocks are zero in W
    assert np.array_equal(bsmm.layout.mask, scope["sparsity"].astype(bool))
    assert bsmm.w_shape == (int(scope["sparsity"].sum()), 32, 32)
