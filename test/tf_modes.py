"""Run a TensorFlow op and its gradients in each execution mode, for tests that compare with
float64 references (imported by the TensorFlow test folders).

``eager``: TF2 eager with ``GradientTape``; ``function``: ``tf.function`` whose input signature
leaves the chosen axes unknown; ``graph``: a ``tf.compat.v1`` graph with placeholders of the same
shapes and ``tf.gradients``.  Inputs are fed as float32 and cast to the dtypes under test inside,
so every mode sees the same rounded values; those values come back with the results (the
references use them, so only the op's own error is measured).
"""
from dataclasses import dataclass

import numpy as np
import pytest
import tensorflow as tf

from blocksparse.testing import rel_error, tolerance

MODES = ("eager", "function", "graph")


@dataclass
class Run:
    """float64 results of one run: ``outputs``, ``grads`` (one per input, None where TensorFlow
    gave none), the ``inputs`` and ``grad_ys`` as the op saw them, and the ``dtypes`` (names) of
    the outputs and gradients."""

    outputs: list
    grads: list
    inputs: list
    grad_ys: list
    out_dtypes: list
    grad_dtypes: list


def _f64(values):
    return [None if v is None else np.asarray(v, dtype=np.float64) for v in values]


def _cast_all(tensors, dtypes):
    return [tf.cast(t, d) for t, d in zip(tensors, dtypes)]


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _dtype_names(tensors):
    return [None if t is None else tf.as_dtype(t.dtype).name for t in tensors]


def _symbolic(fn, xs, gys):
    """Outputs and gradients of ``fn`` on the tensors ``xs``; ``gys`` (None: that output gets no
    gradient) are cast to the outputs' dtypes."""
    outs = _as_list(fn(*xs))
    pairs = [(o, tf.cast(g, o.dtype)) for o, g in zip(outs, gys) if g is not None]
    return outs, pairs


def _eager(fn, xs, dtypes, gys, unknown):
    del unknown
    xt = _cast_all([tf.constant(x) for x in xs], dtypes)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        outs, pairs = _symbolic(fn, xt, gys)
    grads = tape.gradient([o for o, _ in pairs], xt, output_gradients=[g for _, g in pairs])
    return outs, grads, xt, [g for _, g in pairs]


def _signature(xs, unknown):
    return [tf.TensorSpec([None if axis in unknown.get(i, ()) else n for axis, n in enumerate(x.shape)],
                          tf.float32) for i, x in enumerate(xs)]


def _function(fn, xs, dtypes, gys, unknown):
    gy_list = [g for g in gys if g is not None]

    @tf.function(input_signature=_signature(xs, unknown) + [tf.TensorSpec(g.shape, tf.float32) for g in gy_list])
    def step(*feeds):
        xt = _cast_all(feeds[:len(xs)], dtypes)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            outs = _as_list(fn(*xt))
        used = [o for o, g in zip(outs, gys) if g is not None]
        gyt = [tf.cast(g, o.dtype) for o, g in zip(used, feeds[len(xs):])]
        grads = tape.gradient(used, xt, output_gradients=gyt)
        # tf.function cannot return None: a missing gradient comes back as an empty marker
        return outs, [tf.zeros([0]) if g is None else g for g in grads], xt, gyt

    outs, grads, xt, gyt = step(*xs, *gy_list)
    return outs, [None if g.shape == (0,) else g for g in grads], xt, gyt


def _graph(fn, xs, dtypes, gys, unknown):
    with tf.Graph().as_default():
        feeds = [tf.compat.v1.placeholder(tf.float32, spec.shape) for spec in _signature(xs, unknown)]
        xt = _cast_all(feeds, dtypes)
        outs, pairs = _symbolic(fn, xt, gys)
        grads = tf.gradients([o for o, _ in pairs], xt, grad_ys=[g for _, g in pairs])
        fetch = {"outs": outs, "grads": [g for g in grads if g is not None], "xt": xt,
                 "gys": [g for _, g in pairs]}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run(fetch, dict(zip(feeds, xs)))
        it = iter(got["grads"])
        values = [None if g is None else next(it) for g in grads]
        for v, t in zip(values, grads):  # numpy values carry the dtypes the tensors had
            assert t is None or v.dtype == t.dtype.as_numpy_dtype
        return got["outs"], values, got["xt"], got["gys"], _dtype_names(outs), _dtype_names(grads)


def run(mode, fn, xs, dtypes, grad_ys, *, unknown=None):
    """Run ``fn(*inputs)`` and its gradients in ``mode``.

    Parameters
    ----------
    fn : callable
        Builds the op from tensors of the ``dtypes``; returns a tensor or a tuple of them.
    xs : list of float32 arrays
        Input values (fed as float32, cast to ``dtypes`` inside).
    dtypes : list of tf.DType
        Dtype of each input under test.
    grad_ys : list of float32 arrays or None
        Gradient of each output (cast to its dtype); None leaves that output without one.
    unknown : dict, optional
        ``{input index: axes}`` left unknown in the ``function`` and ``graph`` modes.
    """
    unknown = unknown or {}
    xs = [np.asarray(x, dtype=np.float32) for x in xs]
    gys = [None if g is None else np.asarray(g, dtype=np.float32) for g in grad_ys]
    if mode == "graph":
        outs, grads, xt, gyt, out_dtypes, grad_dtypes = _graph(fn, xs, dtypes, gys, unknown)
    else:
        outs, grads, xt, gyt = (_eager if mode == "eager" else _function)(fn, xs, dtypes, gys, unknown)
        out_dtypes, grad_dtypes = _dtype_names(outs), _dtype_names(grads)
        outs, grads, xt, gyt = ([None if t is None else tf.cast(t, tf.float64).numpy() for t in ts]
                                for ts in (outs, grads, xt, gyt))
    it = iter(gyt)
    full_gys = [None if g is None else next(it) for g in gys]
    return Run(_f64(outs), _f64(grads), _f64(xt), _f64(full_gys), out_dtypes, grad_dtypes)


def check_run(res, values, grads, dtype, scale=1.0):
    """Every output and gradient of the :class:`Run` ``res`` within ``scale`` times ``dtype``'s
    tolerance of the float64 ``values`` / ``grads`` (in order; extra references are ignored)."""
    tol = scale * tolerance(dtype)
    for got, want in zip(res.outputs, values):
        assert rel_error(got, want) < tol
    for got, want in zip(res.grads, grads):
        assert rel_error(got, want) < tol


def assert_raises(case):
    """``case = (call, error, pattern)``: ``call()`` raises ``error`` with a message matching
    ``pattern`` (the bad-argument tables of the TensorFlow tests)."""
    call, error, pattern = case
    with pytest.raises(error, match=pattern):
        call()
