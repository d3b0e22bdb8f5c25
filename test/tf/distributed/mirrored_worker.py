"""Train a block-sparse layer under ``tf.distribute.MirroredStrategy`` on two logical CPU devices
and, in the same process, on one device with the whole batch; print both results as JSON.

Run as a script (logical devices must be configured before TensorFlow initialises):
``python mirrored_worker.py LAYOUT.pkl STRATEGY`` with STRATEGY ``mirrored`` or ``single``.
"""
import json
import pickle
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from blocksparse.matmul import BlocksparseMatMul  # noqa: E402

STEPS, BATCH, LR = 3, 8, 0.1


def train(bsmm, strategy):
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal(bsmm.w_shape).astype(np.float32) / 4
    # one batch seen STEPS times: the loss must fall
    data = [(rng.standard_normal((BATCH, bsmm.C)).astype(np.float32),
             rng.standard_normal((BATCH, bsmm.K)).astype(np.float32))] * STEPS
    with strategy.scope():
        w = tf.Variable(w0)
        opt = tf.keras.optimizers.SGD(LR)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            # the dataset splits rows (tokens); feature_axis=0 takes (C, N) activations
            out = bsmm(x, w) if bsmm.axis == 1 else tf.transpose(bsmm(tf.transpose(x), w))
            # sum over the local rows / the global batch: replicas' gradients add up to the mean
            loss = tf.reduce_sum(tf.square(out - y)) / (BATCH * bsmm.K)
        grad = tape.gradient(loss, w)
        opt.apply_gradients([(grad, w)])
        return loss

    @tf.function
    def step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    losses = []
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.concatenate([x for x, _ in data]), np.concatenate([y for _, y in data]))).batch(BATCH)
    for x, y in strategy.experimental_distribute_dataset(dataset):
        losses.append(float(step(x, y)))
    return {"losses": losses, "w": w.numpy().tolist(),
            "replicas": strategy.num_replicas_in_sync}


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        bsmm = pickle.load(f)
    assert isinstance(bsmm, BlocksparseMatMul)
    if sys.argv[2] == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    else:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    print(json.dumps(train(bsmm, strategy)))
