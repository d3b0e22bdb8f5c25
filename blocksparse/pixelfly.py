"""``PixelflyDense``: a Keras layer with a flat block butterfly weight plus an optional low-rank term.

TensorFlow backend of Keras 3 (TensorFlow >= 2.16).  The products run through the same dispatch as
:class:`blocksparse.matmul.BlocksparseMatMul` (the cost model of :mod:`blocksparse.dispatch` picks
the GPU kernels, the portable path, the dense masked product or the reference path when the layer
is called; any block size >= 1).

>>> import numpy as np
>>> layer = PixelflyDense(64, block_size=8, butterfly_size=4, lowrank_size=2)
>>> layer(np.ones((3, 32), np.float32)).shape
TensorShape([3, 64])
"""
import keras
import numpy as np

from ._blockstate import KerasBlockState
from ._checks import check_bool, check_int
from ._initializers import fan_in_bounds
from ._tf import tf
from ._tf.matmul import autodiff, backend
from .dispatch import check_cost_model, check_impl
from .layout import Layout
from .layouts.butterfly import butterfly_layout, check_butterfly, default_butterfly_size

__all__ = ["PixelflyDense"]


def _count(value, name, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {low}; got {value!r} of type {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    return int(value)


class _FanInUniform(keras.initializers.Initializer):
    """Uniform in +-1/sqrt(fan-in) per block, the fan-in of its layout column (as ``nn.Linear``)."""

    def __init__(self, bound):
        self.bound = np.asarray(bound, dtype=np.float32)

    def __call__(self, shape, dtype=None):
        values = tf.random.uniform(shape, -1.0, 1.0) * self.bound.reshape(-1, *([1] * (len(shape) - 1)))
        return tf.cast(values, dtype or "float32")


@keras.saving.register_keras_serializable(package="blocksparse")
class PixelflyDense(KerasBlockState, keras.layers.Layer):
    """``y = x @ W + (x @ lowrank_in) @ lowrank_out + bias`` with ``W`` a flat block butterfly.

    Parameters
    ----------
    units : int
        Output features, a multiple of ``block_size`` (as are the input features).
    block_size : int
        Any block edge >= 1.
    butterfly_size : int, optional
        Power of two >= 2 (default: pixelfly's, the shorter side in blocks rounded up to one).
    n_factors : int, optional
        Butterfly factors summed, ``1 .. log2(butterfly_size)`` (default: all).
    lowrank_size : int
        Rank of the low-rank term (0: none).
    use_bias : bool
    stretch : bool
        Stretch the butterfly over a rectangular weight instead of repeating the square of the
        shorter side (:func:`blocksparse.layouts.butterfly.butterfly_layout`).
    impl : str
        ``"auto"`` (the cost model chooses), ``"kernels"``, ``"portable"``, ``"dense"`` or
        ``"reference"``.
    cost_model : blocksparse.dispatch.CostModel, optional
        The measured table ``impl="auto"`` chooses from (default: the shipped ones).  Not part of
        :meth:`get_config`: a reloaded layer takes the shipped tables unless given one again.
    **kwargs
        Keras layer arguments (``name``, ``dtype`` policy, ...).

    Weights: ``kernel`` ``(blocks, block_size, block_size)`` (packed blocks, rows along the inputs,
    the order of :attr:`layout`), ``lowrank_in`` ``(in_features, lowrank_size)``, ``lowrank_out``
    ``(lowrank_size, units)``, ``bias`` ``(units,)``.  Inputs ``(..., in_features)``, outputs
    ``(..., units)``.
    """

    def __init__(self, units, block_size, butterfly_size=None, n_factors=None, lowrank_size=0,
                 use_bias=True, *, stretch=False, impl="auto", cost_model=None, **kwargs):
        super().__init__(**kwargs)
        if keras.backend.backend() != "tensorflow":
            raise NotImplementedError(f"PixelflyDense runs on Keras's tensorflow backend; this Keras uses "
                                      f"{keras.backend.backend()!r} (KERAS_BACKEND): with torch, use "
                                      "blocksparse.torch.PixelflyLinear")
        self.supports_masking = True  # as keras.layers.Dense: a mask over the batch axes passes through
        self.units = _count(units, "units", 1)
        self.block_size = _count(block_size, "block_size", 1)
        if self.units % self.block_size:
            raise ValueError(f"units must be a multiple of block_size={self.block_size}; got {self.units}")
        self.butterfly_size = None if butterfly_size is None else _count(butterfly_size, "butterfly_size", 2)
        self.n_factors = None if n_factors is None else _count(n_factors, "n_factors", 1)
        if self.butterfly_size is not None:  # refused now, not when the layer is first called
            check_butterfly(self.butterfly_size, self.n_factors)
        self.lowrank_size = _count(lowrank_size, "lowrank_size", 0)
        self.use_bias = check_bool(use_bias, "use_bias")
        self.stretch = check_bool(stretch, "stretch")
        self.impl = check_impl(impl)
        self.cost_model = check_cost_model(cost_model)
        self.layout = None
        self.last_tokens = None  # the token count of the last call that knew it when traced

    def build(self, input_shape):
        in_features = input_shape[-1]
        if in_features is None:
            raise ValueError("PixelflyDense needs the last input dimension when it is built; got None")
        in_features = int(in_features)
        mask = butterfly_layout(in_features, self.units, self.block_size, self.butterfly_size,
                                self.n_factors, stretch=self.stretch)
        if self.butterfly_size is None:
            self.butterfly_size = default_butterfly_size(in_features, self.units, self.block_size)
        self.layout = lay = Layout(mask, self.block_size, any_block_size=True)
        self.in_features = in_features
        per_block, per_feature = fan_in_bounds(lay)
        self.kernel = self.add_weight(name="kernel", shape=lay.w_shape, initializer=_FanInUniform(per_block))
        if self.lowrank_size:
            self.lowrank_in = self.add_weight(
                name="lowrank_in", shape=(in_features, self.lowrank_size),
                initializer=keras.initializers.RandomUniform(-0.5 / np.sqrt(in_features), 0.5 / np.sqrt(in_features)))
            self.lowrank_out = self.add_weight(
                name="lowrank_out", shape=(self.lowrank_size, self.units),
                initializer=keras.initializers.RandomUniform(-1 / np.sqrt(self.lowrank_size),
                                                             1 / np.sqrt(self.lowrank_size)))
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.units,), initializer=_FanInUniform(per_feature))

    def plan(self, tokens=None, dtype=None):
        """What computes a call on ``tokens`` rows and why: a :class:`blocksparse.dispatch.Plan`.
        Default: the token count of the last call that knew it (a static batch), else the op's
        default (4096).  The layer must be built."""
        if self.layout is None:
            raise ValueError("PixelflyDense.plan() needs a built layer: call it (or build()) first")
        tokens = check_int(tokens, "tokens", allow_none=True)
        dtype = tf.as_dtype(dtype or self.compute_dtype)
        return backend.plan(self.layout, 1, dtype, tokens or self.last_tokens, self.impl, self.cost_model)[0]

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)
        last = tf.compat.dimension_value(x.shape[-1]) if x.shape.rank else None
        if x.shape.rank is None or x.shape.rank == 0 or last not in (None, self.in_features):
            raise ValueError(f"inputs must have shape (..., {self.in_features}); got {x.shape}")
        if last is None:  # checked when the graph runs
            check = tf.debugging.assert_equal(tf.shape(x)[-1], self.in_features,
                                              message=f"inputs must have shape (..., {self.in_features})")
            with tf.control_dependencies([check]):
                x = tf.identity(x)
        dtype = tf.as_dtype(self.compute_dtype)
        x2 = tf.reshape(tf.cast(x, dtype), [-1, self.in_features])
        w = tf.cast(self.kernel, dtype)
        tokens = tf.compat.dimension_value(x2.shape[0])
        if tokens is not None:
            self.last_tokens = tokens
        products = backend.choose(self.layout, 1, dtype, tokens, self.impl, self.cost_model)
        y = autodiff.matmul(x2, w, self.layout, 1, dtype, products)
        if self.lowrank_size:
            # [N, in] @ [in, r] @ [r, units]
            y += tf.matmul(tf.matmul(x2, tf.cast(self.lowrank_in, dtype)), tf.cast(self.lowrank_out, dtype))
        if self.use_bias:
            y = tf.nn.bias_add(y, tf.cast(self.bias, dtype))
        y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [self.units]], axis=0))
        y.set_shape(x.shape[:-1].concatenate([self.units]))
        return y

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, block_size=self.block_size, butterfly_size=self.butterfly_size,
                      n_factors=self.n_factors, lowrank_size=self.lowrank_size, use_bias=self.use_bias,
                      stretch=self.stretch, impl=self.impl)
        return config
