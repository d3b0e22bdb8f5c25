"""Fused LSTM gates for TensorFlow (the original ``blocksparse.lstm`` API, also in
:mod:`blocksparse.ew`).

>>> import numpy as np, tensorflow as tf
>>> from blocksparse.lstm import fused_lstm_gates
>>> c = tf.zeros([2, 3])
>>> h = tf.constant(np.full([2, 12], 10.0, np.float32))      # i, j, f, o: all open
>>> c_next, h_next = fused_lstm_gates(c, h, forget_bias=1.0)
>>> np.round(c_next.numpy()[0], 3).tolist()
[1.0, 1.0, 1.0]

Gate layout: the merged tensor holds the gates ``i, j, f, o`` (input, candidate, forget, output)
one after the other along its last axis, each ``K`` wide, as ``tf.nn.rnn_cell.BasicLSTMCell``
and the original's final kernels lay them out; the four-tensor form takes them in that order.
"""
from ._tf import tf
from ._tf.checks import float_tensor, same_dtype, shape_guard
from ._tf.ew import args as ewargs
from ._tf.norms import backend
from ._tf.norms import gpu as gpu_ops

__all__ = ["fused_lstm_gates", "split4", "concat4"]


_H = "h (the merged gates i, j, f, o)"
_SHAPE = "the shape of c with a last dimension 4K (each of the 4 gates of h has the shape of c)"


def _merged_shape(h, c):
    """``h`` after checking it has the shape of ``c`` with a last dimension ``4K`` (at run time for
    sizes unknown now: the GPU kernels read ``h`` whole, not its checked split)."""
    if h.shape.rank is not None and c.shape.rank is not None:
        k = c.shape[-1]
        want = c.shape[:-1].concatenate([None if k is None else 4 * k])
        if not h.shape.is_compatible_with(want):
            raise ValueError(f"h must have {_SHAPE}: expected {tuple(want.as_list())}; got {tuple(h.shape.as_list())}")
    if tf.executing_eagerly() or (h.shape.is_fully_defined() and c.shape.is_fully_defined()):
        return h
    want = tf.concat([tf.shape(c)[:-1], 4 * tf.shape(c)[-1:]], axis=0)
    return shape_guard(h, want, f"h must have {_SHAPE}")


def _gates(c, gate_args):
    """The gates ``(i, j, f, o)`` (checked) and the merged tensor they were split from (None for
    four tensors)."""
    if len(gate_args) == 1:
        h = float_tensor(gate_args[0], "h")
        same_dtype(c, h, "c", "h")
        rank = ewargs.known_rank(h, "h")
        if c.shape.rank is not None and c.shape.rank != rank:
            raise ValueError(f"c must have the rank of h ({rank}); got shape {tuple(c.shape.as_list())}")
        h = _merged_shape(ewargs.divisible_by_4(h, _H), c)
        return tf.split(h, 4, axis=-1), h
    if len(gate_args) != 4:
        raise TypeError(f"fused_lstm_gates takes the gates as one merged tensor h (..., 4K) or four "
                        f"tensors i, j, f, o (..., K) after c; got {len(gate_args)} gate arguments")
    gates = [float_tensor(t, name) for t, name in zip(gate_args, "ijfo")]
    for gate, name in zip(gates, "ijfo"):
        same_dtype(c, gate, "c", name)
    return [ewargs.same_shape(g, c, name, "c") for g, name in zip(gates, "ijfo")], None


def fused_lstm_gates(c, *args, bias=None, forget_bias=1.0, name=None):
    """The LSTM cell update, fused: ``(c_next, h_next)`` from the cell state and the gates.

    ``i = sigmoid(i)``, ``j = tanh(j)``, ``f = sigmoid(f + forget_bias)``, ``o = sigmoid(o)``,
    ``c_next = f * c + i * j``, ``h_next = o * tanh(c_next)``, computed in float32.

    Parameters
    ----------
    c : tensor, shape (..., K)
        Cell state, float32, float16 or bfloat16.
    *args : one tensor (..., 4K), or four tensors (..., K)
        The gate pre-activations: merged, ``i, j, f, o`` one after the other along the last axis
        (``(N, 4K)`` for activations ``(N, C)``), or as four tensors ``i, j, f, o`` of the shape of
        ``c`` (any layout: the four-tensor form is elementwise, e.g. ``(K, N)`` activations of a
        feature_axis=0 model).  Same dtype as ``c``.  (The original's first release took the
        four tensors as ``i, f, o, j``; its final one, and this, as ``i, j, f, o``.)
    bias : tensor, shape (4K,), optional
        Added to the gates (``i, j, f, o`` biases one after the other) before the nonlinearities,
        along the last axis (``K = c.shape[-1]``); any float dtype.  Four gates in another layout
        (``(K, N)``) take their biases added beforehand: here they would run along the tokens.
    forget_bias : float
        Added to the forget gate before its sigmoid.
    name : str, optional
        Name scope (default ``"LSTMGates"``).

    Returns
    -------
    c_next, h_next : tensors, shape and dtype of ``c``
        Differentiable in ``c``, the gates and ``bias``.
    """
    forget_bias = ewargs.real(forget_bias, "forget_bias")
    with tf.name_scope(ewargs.op_name(name, "LSTMGates")):
        c = float_tensor(c, "c")
        gates, merged = _gates(c, args)
        if c.shape.rank == 0:
            raise ValueError("c must have rank >= 1, shape (..., K); got a scalar")
        if bias is not None:
            k = tf.compat.dimension_value(c.shape[-1]) if c.shape.rank is not None else None
            if k is None:
                raise ValueError("c must have a known last dimension K when a bias (4K,) is given; "
                                 f"got shape {c.shape}")
            bias = ewargs.channel_vector(bias, 4 * k, "bias", f"4K = 4 * {k}: the biases of i, j, f, o")
        k = c.shape[-1] if c.shape.rank else None

        def gpu(library, arch):
            return gpu_ops.lstm_gates_implementation(library, arch, c.dtype, bias is not None)

        impl = backend.select(backend.lstm_gates_eligible(c.dtype, k), f"LSTM gates of {c.dtype.name}", gpu)
        return impl.lstm_gates(c, tuple(gates), bias, forget_bias, merged=merged)


def split4(x, name=None):
    """Split the last axis of ``x`` (..., 4K) into four tensors (..., K): the gates i, j, f, o."""
    with tf.name_scope(ewargs.op_name(name, "Split4")):
        x = float_tensor(x, "x")
        ewargs.known_rank(x, "x")
        return tuple(tf.split(ewargs.divisible_by_4(x, "x"), 4, axis=-1))


def concat4(x0, x1, x2, x3, name=None):
    """Concatenate four tensors (..., K) of one shape and dtype along the last axis: (..., 4K)."""
    with tf.name_scope(ewargs.op_name(name, "Concat4")):
        xs = [float_tensor(x, f"x{i}") for i, x in enumerate((x0, x1, x2, x3))]
        ewargs.known_rank(xs[0], "x0")
        for i, x in enumerate(xs[1:], 1):
            same_dtype(xs[0], x, "x0", f"x{i}")
            xs[i] = ewargs.same_shape(x, xs[0], f"x{i}", "x0")
        return tf.concat(xs, axis=-1)
