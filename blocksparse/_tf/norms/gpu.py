"""The GPU path of ``layer_norm`` and the fused LSTM gates: the compiled op library's ops.

The ops take 2-D activations -- ``(N, C)`` / ``(C, N)`` for layer norm, ``(N, K)`` cells with one
merged ``(N, 4K)`` gate tensor or four ``(N, K)`` ones -- and float32 ``g``, ``b`` and ``bias``;
the functions here reshape (free in TensorFlow) and cast the parameters (their gradients come back
in the parameters' dtypes through the casts).  Each forward op is wrapped with its gradient op in a
``tf.custom_gradient``, so that ``tf.GradientTape`` and ``tf.gradients`` alike reach it (the
gradient ops have no gradient: no second order).
"""
from __future__ import annotations

from .. import tf
from .backend import Implementation

__all__ = ["DTYPES", "served", "layer_norm_implementation", "lstm_gates_implementation"]

DTYPES = {tf.float16: "fp16", tf.bfloat16: "bf16", tf.float32: "fp32"}


def served(library, arch, family, **fields):
    """Whether ``library`` holds a ``family`` kernel with these ``fields`` (both directions) for a
    GPU of compute capability ``arch`` (:meth:`~blocksparse._tf.loader.OpLibrary.serves`)."""
    return all(library.serves(arch, family, product=product, **fields) for product in ("fwd", "bwd"))


def _ln_attrs(axis, segments, epsilon, relu):
    return dict(axis=axis, segments=segments, epsilon=float(epsilon), relu=relu)


def layer_norm_implementation(library, arch, dtype, axis, relu):
    """The :class:`Implementation` whose ``layer_norm`` runs ``library``'s kernels for ``dtype``
    activations with features on ``axis`` (``"first"`` or ``"last"``), or None without kernels."""
    kernel_axis = 1 if axis == "last" else 0
    if not served(library, arch, "norms", dtype=DTYPES[dtype], axis=kernel_axis, relu=relu):
        return None
    module = library.module

    def layer_norm(x, g, b, axis, segments, epsilon, relu):
        attrs = _ln_attrs(kernel_axis, segments, epsilon, relu)

        @tf.custom_gradient
        def blocksparse_layer_norm(x2, g32, b32):
            y, mean, rstd = module.blocksparse_layer_norm(x2, g32, b32, **attrs)

            def grad(dy):
                return list(module.blocksparse_layer_norm_grad(dy, x2, g32, b32, mean, rstd, **attrs))

            return y, grad

        size = x.shape[axis]
        x2 = tf.reshape(x, [-1, size] if kernel_axis == 1 else [size, -1])
        y = tf.reshape(blocksparse_layer_norm(x2, tf.cast(g, tf.float32), tf.cast(b, tf.float32)), tf.shape(x))
        y.set_shape(x.shape)
        return y

    return Implementation(f"tf-gpu-sm{arch}", layer_norm, None)


def lstm_gates_implementation(library, arch, dtype, has_bias):
    """The :class:`Implementation` whose ``lstm_gates`` runs ``library``'s kernels for ``dtype``
    cells with or without a bias, or None without kernels."""
    if not served(library, arch, "lstm", dtype=DTYPES[dtype], has_bias=has_bias):
        return None
    module = library.module

    def lstm_gates(c, gates, bias, forget_bias, merged=None):
        attrs = dict(forget_bias=float(forget_bias), has_bias=bias is not None)
        k = c.shape[-1]
        c2 = tf.reshape(c, [-1, k])
        gates2 = [tf.reshape(merged, [-1, 4 * k])] if merged is not None else [tf.reshape(t, [-1, k]) for t in gates]
        bias32 = tf.zeros([0], tf.float32) if bias is None else tf.cast(bias, tf.float32)

        @tf.custom_gradient
        def blocksparse_lstm_gates(c2, bias32, *gates2):
            c_next, h_next = module.blocksparse_lstm_gates(c2, list(gates2), bias32, **attrs)

            def grad(dc_next, dh_next):
                # an unused output's gradient may be absent
                dc_next = tf.zeros_like(c_next) if dc_next is None else dc_next
                dh_next = tf.zeros_like(h_next) if dh_next is None else dh_next
                dc, dgates, dbias = module.blocksparse_lstm_gates_grad(c2, list(gates2), bias32, dc_next, dh_next,
                                                                       **attrs)
                return [dc, dbias if bias is not None else None, *dgates]

            return (c_next, h_next), grad

        outputs = []
        for t in blocksparse_lstm_gates(c2, bias32, *gates2):
            t = tf.reshape(t, tf.shape(c))
            t.set_shape(c.shape)
            outputs.append(t)
        return tuple(outputs)

    return Implementation(f"tf-gpu-sm{arch}", None, lstm_gates)
