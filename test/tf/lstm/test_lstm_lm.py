"""Acceptance: a block-sparse LSTM language model written the way the original package's LSTM
example is, trained a few steps in a ``tf.compat.v1`` graph on a tiny synthetic corpus.

As in the example: one block-sparse matmul for the merged gate pre-activations of ``[x, h]``
(feature_axis=1), ``layer_norm`` over the four gates separately (``segments=4``),
``fused_lstm_gates``, weights cast with ``float_cast`` to the compute dtype (bfloat16), an output
projection through ``SparseProj`` and a block-sparse matmul on the (C, N) layout with
``l2_normalize``d weights, logits cast back to float32 with ``float_cast``, and
``group_param_grads`` merging the per-step weight gradients.  The loss must go down clearly.
"""
import numpy as np
import tensorflow as tf

import blocksparse.ewops as ew
from blocksparse.lstm import fused_lstm_gates
from blocksparse.matmul import BlocksparseMatMul, SparseProj, group_param_grads, largest_block
from blocksparse.norms import layer_norm
from blocksparse.testing.matmul import random_layout

NVOCAB, NEMBD, NHIDDEN, NPROJ, BLOCK = 32, 32, 64, 48, 8
NSTEPS, NBATCH, TRAIN_STEPS = 8, 32, 40
DTYPE = tf.bfloat16


def markov_corpus(rng, length):
    """Tokens of a random first-order Markov chain with peaked transitions (learnable)."""
    logits = 3.0 * rng.standard_normal((NVOCAB, NVOCAB))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    tokens = [0]
    for u in rng.random(length - 1):
        tokens.append(int(np.searchsorted(np.cumsum(probs[tokens[-1]]), u)))
    return np.minimum(np.array(tokens, np.int32), NVOCAB - 1)


def batches(rng, corpus):
    starts = rng.integers(0, len(corpus) - NSTEPS - 1, NBATCH)
    windows = np.stack([corpus[s:s + NSTEPS + 1] for s in starts], axis=1)  # (nsteps + 1, nbatch)
    return windows[:-1], windows[1:]


class LanguageModel:
    """Embedding -> block-sparse LSTM -> sparse projection -> block-sparse softmax layer."""

    def __init__(self, rng):
        gate_layout = random_layout(rng, (NEMBD + NHIDDEN) // BLOCK, 4 * NHIDDEN // BLOCK, 0.5, cover=True)
        self.bsmm_gates = BlocksparseMatMul(gate_layout, block_size=BLOCK, feature_axis=1, name="lstm_gates")
        self.sproj = SparseProj(NHIDDEN, nproj=NPROJ)
        blk_out, nproj_blocks = largest_block(NPROJ)
        self.bsmm_out = BlocksparseMatMul(np.ones((nproj_blocks, NVOCAB // blk_out), np.int32),
                                          block_size=blk_out, feature_axis=0, name="lstm_out")

    def variables(self, rng):
        def var(name, value):
            return tf.compat.v1.get_variable(name, initializer=np.asarray(value, np.float32))

        ortho = self.bsmm_gates.ortho_init()
        self.emb_w = var("emb_w", rng.standard_normal((NVOCAB, NEMBD)))
        self.emb_g = var("emb_g", np.ones((NVOCAB, 1)))
        self.gate_w = tf.compat.v1.get_variable("gate_w", self.bsmm_gates.w_shape, initializer=ortho)
        self.gate_g = var("gate_g", np.ones(4 * NHIDDEN))
        self.gate_b = var("gate_b", np.zeros(4 * NHIDDEN))
        self.out_w = var("out_w", rng.standard_normal(self.bsmm_out.w_shape))
        self.out_g = var("out_g", np.ones(NVOCAB))
        self.out_b = var("out_b", np.zeros(NVOCAB))
        return [self.emb_w, self.emb_g, self.gate_w, self.gate_g, self.gate_b, self.out_w, self.out_g, self.out_b]

    def loss(self, x, y):
        emb = tf.nn.l2_normalize(self.emb_w, axis=1) * self.emb_g
        words = ew.float_cast(tf.nn.embedding_lookup(emb, x), dtype=DTYPE)   # (nsteps, nbatch, nembd)
        w = ew.float_cast(self.gate_w, dtype=DTYPE)
        c = h = tf.zeros([NBATCH, NHIDDEN], DTYPE)
        outputs = []
        for t in range(NSTEPS):
            z = self.bsmm_gates(tf.concat([words[t], h], axis=1), w)          # (nbatch, 4 * nhidden)
            z = layer_norm(z, self.gate_g, self.gate_b, axis=1, segments=4)
            c, h = fused_lstm_gates(c, z, forget_bias=1.0)
            outputs.append(tf.transpose(h))                                 # (nhidden, nbatch)
        hs = self.sproj.gather(tf.concat(outputs, axis=1))                    # (nproj, nsteps * nbatch)
        wo = self.bsmm_out.l2_normalize(self.out_w, dtype=DTYPE)
        logits = ew.float_cast(self.bsmm_out(hs, wo), dtype=tf.float32, dx_dtype=DTYPE)
        logits = tf.transpose(logits) * self.out_g + self.out_b                # (nsteps * nbatch, nvocab)
        labels = tf.reshape(y, [-1])                                          # step-major, as hs
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def test_lstm_language_model_learns(rng):
    corpus = markov_corpus(rng, 4096)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(int(rng.integers(1 << 30)))
        # ortho_init and SparseProj draw from numpy's global generator (as the original's did): seeded
        # from the test's, so that BLOCKSPARSE_TEST_SEED replays this test too
        np.random.seed(int(rng.integers(1 << 31)))
        model = LanguageModel(rng)
        x = tf.compat.v1.placeholder(tf.int32, [NSTEPS, NBATCH])
        y = tf.compat.v1.placeholder(tf.int32, [NSTEPS, NBATCH])
        params = model.variables(rng)
        loss = model.loss(x, y)
        grads = tf.gradients(loss, params)
        gate_index = params.index(model.gate_w)
        raw_gate_grad = grads[gate_index]
        grads[gate_index] = group_param_grads(raw_gate_grad)
        assert grads[gate_index] is not raw_gate_grad, "the per-step products were not merged"
        train = tf.compat.v1.train.AdamOptimizer(0.02).apply_gradients(zip(grads, params))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            xs, ys = batches(rng, corpus)
            grouped, raw = sess.run([grads[gate_index], raw_gate_grad], {x: xs, y: ys})
            assert np.linalg.norm(grouped - raw) <= 1e-2 * np.linalg.norm(raw)  # bfloat16 products
            losses = []
            for _ in range(TRAIN_STEPS):
                xs, ys = batches(rng, corpus)
                losses.append(sess.run([loss, train], {x: xs, y: ys})[0])
    # losses[0] is the untrained model's (each step's loss is taken before its update); Adam at 0.02
    # can halve the loss within two steps, so later ones are no baseline
    untrained, last = losses[0], np.mean(losses[-5:])
    assert np.all(np.isfinite(losses))
    assert untrained > 0.8 * np.log(NVOCAB), f"an untrained model should be near uniform: {untrained:.3f}"
    assert last < 0.8 * untrained, f"loss went from {untrained:.3f} to {last:.3f}"
