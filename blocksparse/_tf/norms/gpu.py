"""The GPU path of ``layer_norm`` and the fused LSTM gates: the compiled op library's ops.

The ops take 2-D activations -- ``(N, C)`` / ``(C, N)`` for layer norm, ``(N, K)`` cells with one
merged ``(N, 4K)`` gate tensor or four ``(N, K)`` ones -- and float32 ``g``, ``b`` and ``bias``;
the functions here reshape (free in TensorFlow) and cast the parameters (their gradients come back
in the parameters' dtypes through the casts).  The ops' gradients are registered once per process.
"""
from __future__ import annotations

from .. import tf
from .backend import Implementation

__all__ = ["DTYPES", "served", "layer_norm_implementation", "lstm_gates_implementation", "register_gradients"]

DTYPES = {tf.float16: "fp16", tf.bfloat16: "bf16", tf.float32: "fp32"}


def served(library, arch, family, **fields):
    """Whether ``library`` holds a ``family`` kernel with these ``fields`` (both directions) for a
    GPU of compute capability ``arch``: compiled for its major version, no newer minor one."""
    def matches(spec, product):
        return (spec["family"] == family and spec.get("product") == product and spec["arch"] // 10 == arch // 10
                and spec["arch"] <= arch and all(spec.get(k) == v for k, v in fields.items()))

    return all(any(matches(s, product) for s in library.specs) for product in ("fwd", "bwd"))


def _ln_attrs(axis, segments, epsilon, relu):
    return dict(axis=axis, segments=segments, epsilon=float(epsilon), relu=relu)


def layer_norm_implementation(library, arch, dtype, axis, relu):
    """The :class:`Implementation` whose ``layer_norm`` runs ``library``'s kernels for ``dtype``
    activations with features on ``axis`` (``"first"`` or ``"last"``), or None without kernels."""
    kernel_axis = 1 if axis == "last" else 0
    if not served(library, arch, "norms", dtype=DTYPES[dtype], axis=kernel_axis, relu=relu):
        return None
    module = library.module
    register_gradients(module)

    def layer_norm(x, g, b, axis, segments, epsilon, relu):
        shape = tf.shape(x)
        size = x.shape[axis]
        x2 = tf.reshape(x, [-1, size] if kernel_axis == 1 else [size, -1])
        y, _, _ = module.blocksparse_layer_norm(x2, tf.cast(g, tf.float32), tf.cast(b, tf.float32),
                                                **_ln_attrs(kernel_axis, segments, epsilon, relu))
        y = tf.reshape(y, shape)
        y.set_shape(x.shape)
        return y

    return Implementation(f"tf-gpu-sm{arch}", layer_norm, None)


def lstm_gates_implementation(library, arch, dtype, has_bias):
    """The :class:`Implementation` whose ``lstm_gates`` runs ``library``'s kernels for ``dtype``
    cells with or without a bias, or None without kernels."""
    if not served(library, arch, "lstm", dtype=DTYPES[dtype], has_bias=has_bias):
        return None
    module = library.module
    register_gradients(module)

    def lstm_gates(c, gates, bias, forget_bias, merged=None):
        k = c.shape[-1]
        c2 = tf.reshape(c, [-1, k])
        gates2 = [tf.reshape(merged, [-1, 4 * k])] if merged is not None else [tf.reshape(t, [-1, k]) for t in gates]
        bias32 = tf.zeros([0], tf.float32) if bias is None else tf.cast(bias, tf.float32)
        c_next, h_next = module.blocksparse_lstm_gates(c2, gates2, bias32, forget_bias=float(forget_bias),
                                                       has_bias=bias is not None)
        outputs = []
        for t in (c_next, h_next):
            t = tf.reshape(t, tf.shape(c))
            t.set_shape(c.shape)
            outputs.append(t)
        return tuple(outputs)

    return Implementation(f"tf-gpu-sm{arch}", None, lstm_gates)


_registered = []


def register_gradients(module):
    """Register the gradients of ``BlocksparseLayerNorm`` and ``BlocksparseLstmGates`` (once per
    process); their gradient ops have none (no second order)."""
    if _registered:
        return
    _registered.append(module)

    @tf.RegisterGradient("BlocksparseLayerNorm")
    def _layer_norm_grad(op, dy, dmean, drstd):
        # mean and rstd feed only the gradient op: nothing flows back through them
        x, g, b = op.inputs
        _, mean, rstd = op.outputs
        attrs = {name: op.get_attr(name) for name in ("axis", "segments", "epsilon", "relu")}
        dx, dg, db = module.blocksparse_layer_norm_grad(dy, x, g, b, mean, rstd, **attrs)
        return [dx, dg, db]

    @tf.RegisterGradient("BlocksparseLstmGates")
    def _lstm_gates_grad(op, dc_next, dh_next):
        num_gates = op.get_attr("num_gates")
        c, gates, bias = op.inputs[0], list(op.inputs[1:1 + num_gates]), op.inputs[1 + num_gates]
        c_next, h_next = op.outputs
        dc_next = tf.zeros_like(c_next) if dc_next is None else dc_next
        dh_next = tf.zeros_like(h_next) if dh_next is None else dh_next
        attrs = {name: op.get_attr(name) for name in ("forget_bias", "has_bias")}
        outputs = module.blocksparse_lstm_gates_grad(c, gates, bias, dc_next, dh_next, **attrs)
        dc, dgates, dbias = outputs[0], list(outputs[1:1 + num_gates]), outputs[1 + num_gates]
        return [dc, *dgates, dbias if attrs["has_bias"] else None]
