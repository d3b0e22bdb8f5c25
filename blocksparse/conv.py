"""Convolution-side ops for TensorFlow (the original ``blocksparse.conv`` API).

``cwise_linear`` -- ``a * x + b`` per channel of an NCHW (or NCDHW) tensor.
"""
from ._tf import tf
from ._tf.ew import args as ewargs
from ._tf.norms import channels

__all__ = ["cwise_linear"]


def cwise_linear(x, a=None, b=None, name=None):
    """``y = a * x + b``, ``y = a * x`` or ``y = x + b`` with ``a`` and ``b`` per channel.

    Broadcasting along the middle channel axis of NCHW tensors, e.g. for weight normalisation.

    Parameters
    ----------
    x : tensor, shape (N, C, *spatial)
        float32, float16 or bfloat16 (NCHW, NCDHW, also NC / NCW); computed in float32.
    a, b : tensors, shape (C,), optional
        Scale and shift per channel (at least one of them), any float dtype; the original's
        ``(1, C, 1, 1)`` is accepted too.
    name : str, optional
        Name scope (default ``"CWiseLinear"``).

    Returns
    -------
    tensor, shape and dtype of ``x``
        Differentiable in ``x``, ``a`` and ``b``.
    """
    if a is None and b is None:
        raise ValueError("cwise_linear needs a, b or both; got neither")
    with tf.name_scope(ewargs.op_name(name, "CWiseLinear")):
        x, size = ewargs.channels_first(x)
        what = f"C = {size}, the channels of x"
        a = None if a is None else ewargs.channel_vector(a, size, "a", what)
        b = None if b is None else ewargs.channel_vector(b, size, "b", what)
        return channels.cwise_linear(x, a, b)
