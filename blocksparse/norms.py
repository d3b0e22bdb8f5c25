"""Layer norm and batch norm for TensorFlow (the original ``blocksparse.norms`` API).

>>> import numpy as np, tensorflow as tf
>>> from blocksparse.norms import layer_norm
>>> x = tf.constant([[1.0, 2.0, 3.0, 4.0]])
>>> y = layer_norm(x, g=tf.ones([4]), b=tf.zeros([4]), axis=1)
>>> [round(float(v), 3) for v in y.numpy()[0]]
[-1.342, -0.447, 0.447, 1.342]

Statistics and gradients are computed in float32 for float16 / bfloat16 inputs, outputs come in
the input's dtype.  Works in eager mode, inside ``tf.function`` (unknown minibatch) and in
``tf.compat.v1`` graphs, on any device and under XLA.
"""
import numpy as np

from ._checks import check_bool, check_epsilon, check_int
from ._tf import tf
from ._tf.checks import FLOAT32_TINY, float_tensor
from ._tf.ew import args as ewargs
from ._tf.norms import backend, channels
from ._tf.norms import gpu as gpu_ops

__all__ = ["layer_norm", "batch_norm", "batch_norm_inference", "layer_norm_test", "layer_norm_grad_test",
           "batch_norm_test", "batch_norm_grad_test", "batch_norm_inf_test"]


def _epsilon(value):
    """``epsilon`` as a finite float > 0 in float32, where the ops add it (an infinite one would
    silently give ``y = b``, one that rounds to 0 divide by zero; a subnormal one counts as float32's
    smallest normal number, as TensorFlow's CPU kernels flush subnormals to zero)."""
    return max(check_epsilon(ewargs.real(value, "epsilon", low=0.0, low_open=True)), FLOAT32_TINY)


def layer_norm(x, g, b, axis=1, epsilon=1e-6, relu=False, *, segments=1, name=None):
    """Normalise every feature vector of ``x`` to zero mean and unit variance, then scale,
    shift and (optionally) apply a relu.

    ``y = relu?(g * (x - mean) / sqrt(var + epsilon) + b)`` with ``mean`` and ``var`` (biased)
    over the ``C`` features on ``axis``, for every position of the other axes.

    Parameters
    ----------
    x : tensor
        float32, float16 or bfloat16, of known rank.  The two activation layouts of
        ``BlocksparseMatMul``: ``(N, C)`` with ``axis=1`` (feature_axis=1) and ``(C, N)`` with
        ``axis=0`` (feature_axis=0).  Any rank works: features on ``axis``, every other axis
        (e.g. batch and time of ``(N, T, C)`` with ``axis=-1``) is a separate position.
    g, b : tensors, shape (C,)
        Gain and bias per feature, any float dtype (float32 parameters with float16
        activations is the usual mix).  ``(C, 1)`` / ``(1, C)`` are accepted too.
    axis : int
        The feature axis.
    epsilon : float
        Added to the variance.
    relu : bool
        Apply ``max(., 0)`` after the gain and bias.
    segments : int, keyword-only
        Split the features into this many equal consecutive slices and normalise each on its own
        (``segments=4`` normalises the four gates of a merged LSTM pre-activation separately).
    name : str, optional
        Name scope (default ``"LayerNorm"``).

    Returns
    -------
    tensor, shape and dtype of ``x``
        Differentiable in ``x``, ``g`` and ``b`` (gradients in their dtypes).
    """
    epsilon = _epsilon(epsilon)
    relu = check_bool(relu, "relu")
    segments = check_int(segments, "segments")
    with tf.name_scope(ewargs.op_name(name, "LayerNorm")):
        x = float_tensor(x, "x")
        rank = ewargs.known_rank(x, "x")
        axis = ewargs.feature_axis(axis, rank)
        size = ewargs.feature_size(x, axis, "x")
        if size % segments:
            raise ValueError(f"segments must divide the {size} features of x on axis {axis}; got "
                             f"segments={segments}")
        what = f"C = {size}, the size of x on axis {axis}"
        g = ewargs.channel_vector(g, size, "g", what)
        b = ewargs.channel_vector(b, size, "b", what)
        features = "last" if axis == rank - 1 else "first"

        def gpu(library, arch):
            return gpu_ops.layer_norm_implementation(library, arch, x.dtype, features, relu)

        eligible = backend.layer_norm_eligible(x.dtype, axis, rank, size)
        impl = backend.select(eligible, f"layer_norm of {x.dtype.name} features {features}", gpu)
        return impl.layer_norm(x, g, b, axis, segments, epsilon, relu)


def batch_norm(x, g, b, epsilon=1e-6, name=None):
    """Batch norm in training mode on channels-first tensors (NCHW, NCDHW, also NC / NCW).

    Parameters
    ----------
    x : tensor, shape (N, C, *spatial)
        float32, float16 or bfloat16.
    g, b : tensors, shape (C,)
        Gain and bias per channel, any float dtype (``(1, C, 1, 1)`` accepted too).
    epsilon : float
        Added to the variance.
    name : str, optional
        Name scope (default ``"BatchNorm"``).

    Returns
    -------
    y : tensor, shape and dtype of ``x``
        ``g * (x - mean) / sqrt(var + epsilon) + b``.
    mean, var : float32 tensors, shape (C,)
        The statistics over N and the spatial axes; ``var`` is the biased variance (divided by
        ``N * prod(spatial)``), as the original's op returned them (e.g. to update moving
        averages for :func:`batch_norm_inference`).  NaN for an empty batch or spatial size 0
        (the mean of nothing; ``y`` is then empty).

    All three are differentiable in ``x``, ``g`` and ``b``.
    """
    epsilon = _epsilon(epsilon)
    with tf.name_scope(ewargs.op_name(name, "BatchNorm")):
        x, size = ewargs.channels_first(x)
        what = f"C = {size}, the channels of x"
        g = ewargs.channel_vector(g, size, "g", what)
        b = ewargs.channel_vector(b, size, "b", what)
        return channels.batch_norm(x, g, b, epsilon)


def batch_norm_inference(x, g, b, m, v, epsilon=1e-6, name=None):
    """Batch norm with given statistics on channels-first tensors (NCHW, NCDHW, also NC / NCW).

    Parameters
    ----------
    x : tensor, shape (N, C, *spatial)
        float32, float16 or bfloat16.
    g, b, m, v : tensors, shape (C,)
        Gain, bias, mean and variance per channel, any float dtype.
    epsilon : float
        Added to the variance.
    name : str, optional
        Name scope (default ``"BatchNormInference"``).

    Returns
    -------
    tensor, shape and dtype of ``x``
        ``g * (x - m) / sqrt(v + epsilon) + b``, computed in float32; differentiable in every
        input.
    """
    epsilon = _epsilon(epsilon)
    with tf.name_scope(ewargs.op_name(name, "BatchNormInference")):
        x, size = ewargs.channels_first(x)
        what = f"C = {size}, the channels of x"
        g, b, m, v = (ewargs.channel_vector(t, size, n, what) for t, n in zip((g, b, m, v), "gbmv"))
        return channels.batch_norm_inference(x, g, b, m, v, epsilon)


# numpy float64 references under the original's names (its tests imported them from here)
def layer_norm_test(x, g, b, axis=1, segments=1, epsilon=1e-6, relu=False):
    """:func:`layer_norm` in numpy float64 (``g`` / ``b``: ``(C,)``, ``(1, C)``, ``(C, 1)`` or None)."""
    from .testing import norms as ref

    return ref.layer_norm(x, _flat(g), _flat(b), axis, segments, epsilon, relu)


def layer_norm_grad_test(dy, x, g, b, axis=1, segments=1, epsilon=1e-6, relu=False):
    """``(dx, dg, db)`` of :func:`layer_norm_test` for the output gradient ``dy``."""
    from .testing import norms as ref

    return ref.layer_norm_grad(dy, x, _flat(g), _flat(b), axis, segments, epsilon, relu)


def batch_norm_test(x, g, b, epsilon=1e-6):
    """``(y, mean, var)`` of :func:`batch_norm` in numpy float64."""
    from .testing import norms as ref

    return ref.batch_norm(x, _flat(g), _flat(b), epsilon)


def batch_norm_grad_test(dy, x, g, m, v, epsilon=1e-6):
    """``(dx, dg, db)`` of :func:`batch_norm_test` for the gradient ``dy`` of ``y`` (``m`` / ``v``:
    the forward's mean and variance, as the original took them; they are those of ``x``)."""
    from .testing import norms as ref

    return ref.batch_norm_grad(dy, None, None, x, _flat(g), None, epsilon)


def batch_norm_inf_test(x, g, b, m, v, epsilon=1e-6):
    """:func:`batch_norm_inference` in numpy float64."""
    from .testing import norms as ref

    return ref.batch_norm_inference(x, *(_flat(t) for t in (g, b, m, v)), epsilon)


def _flat(t):
    return None if t is None else np.asarray(t, dtype=np.float64).reshape(-1)

