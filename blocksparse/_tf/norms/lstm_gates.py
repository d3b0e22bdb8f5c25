"""Reference fused LSTM gates with TensorFlow ops: float32 math and one fused gradient.

``c_next = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(j)``,
``h_next = sigmoid(o) * tanh(c_next)``; the bias, when given, is added to the gates first.
"""
from .. import tf
from ..ew.args import to_compute

__all__ = ["lstm_gates"]


def _bias_grad(d, k):
    """Sum of ``d`` over every axis but the last, ``(..., K) -> (K,)``."""
    return tf.reduce_sum(tf.reshape(d, tf.stack([-1, k])), axis=0)


def lstm_gates(c, gates, bias, forget_bias):
    """``(c_next, h_next)`` of the cell state ``c`` and the gates ``(i, j, f, o)``.

    All of the same shape ``(..., K)`` and dtype (checked); ``bias``: None or a ``(4K,)`` float
    tensor of any float dtype, the four gates' biases one after the other.  Outputs in the dtype of
    ``c``; gradients in the dtype of each input.
    """
    inputs = (c, *gates) + (() if bias is None else (bias,))

    @tf.custom_gradient
    def blocksparse_lstm_gates(*inputs):
        c32, i, j, f, o = (to_compute(t) for t in inputs[:5])
        if bias is not None:
            bi, bj, bf, bo = tf.split(to_compute(inputs[5]), 4)
            i, j, f, o = i + bi, j + bj, f + bf, o + bo
        si, tj, sf, so = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f + forget_bias), tf.sigmoid(o)
        c_next = sf * c32 + si * tj
        tc = tf.tanh(c_next)
        h_next = so * tc

        def grad(dc_next, dh_next):
            dh = tf.zeros_like(h_next) if dh_next is None else to_compute(dh_next)
            dc = dh * so * (1.0 - tc * tc)
            if dc_next is not None:  # c_next unused: its gradient may be absent
                dc += to_compute(dc_next)
            d_gates = (dc * tj * si * (1.0 - si),
                       dc * si * (1.0 - tj * tj),
                       dc * c32 * sf * (1.0 - sf),
                       dh * tc * so * (1.0 - so))
            grads = [tf.cast(dc * sf, c.dtype)] + [tf.cast(d, t.dtype) for d, t in zip(d_gates, gates)]
            if bias is not None:
                k = tf.shape(c)[-1]
                grads.append(tf.cast(tf.concat([_bias_grad(d, k) for d in d_gates], 0), bias.dtype))
            return grads

        return (tf.cast(c_next, c.dtype), tf.cast(h_next, c.dtype)), grad

    c_next, h_next = blocksparse_lstm_gates(*inputs)
    c_next.set_shape(c.shape)
    h_next.set_shape(c.shape)
    return c_next, h_next
