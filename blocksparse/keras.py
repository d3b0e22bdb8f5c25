"""A Keras 3 layer with a block-sparse weight: :class:`BlocksparseDense`.

>>> import numpy as np, keras
>>> from blocksparse.keras import BlocksparseDense
>>> layer = BlocksparseDense(np.eye(4, dtype=int), block_size=8, activation="relu")
>>> tuple(layer(np.ones((2, 32), "float32")).shape)
(2, 32)

Runs on Keras's TensorFlow backend (through :class:`blocksparse.matmul.BlocksparseMatMul`) and
its torch backend (through :class:`blocksparse.torch.BlocksparseMatMul`); the JAX backend is not
supported.  Serialisable (``get_config``, ``.keras`` files), trainable with ``model.fit``.  Saved weights
hold the block structure: loading them into a layer of another layout with as many blocks raises
``ValueError`` (:mod:`blocksparse._blockstate`).
"""
import keras

from ._blockstate import KerasBlockState
from ._checks import check_bool
from ._frontend import LayoutShapes
from .layout import Layout

__all__ = ["BlocksparseDense", "PixelflyDense"]

_BACKENDS = ("tensorflow", "torch")


def _default_kernel_initializer(layout):
    """Glorot uniform over the fans the layout gives a feature on average.

    Output feature ``j`` of layout column ``k`` sums ``bs * blocks_in_column(k)`` inputs: the mean
    fan-in is ``bs * blocks / KB`` and the mean fan-out ``bs * blocks / CB``.  Keras computes the
    fans of a ``(blocks, bs, bs)`` kernel as ``bs * blocks`` each, so the scale corrects for that:
    ``scale = 2 * CB * KB / (CB + KB)`` makes ``Var(w) = 2 / (fan_in + fan_out)`` exactly.
    """
    scale = 2.0 * layout.CB * layout.KB / (layout.CB + layout.KB)
    return keras.initializers.VarianceScaling(scale=scale, mode="fan_avg", distribution="uniform")


@keras.saving.register_keras_serializable(package="blocksparse")
class BlocksparseDense(KerasBlockState, keras.layers.Layer, LayoutShapes):
    """``y = activation(x @ W + bias)`` with ``W`` of shape ``(C, K)`` made of ``bs x bs`` blocks.

    Parameters
    ----------
    layout : array_like, shape (CB, KB)
        0/1 block mask: ``layout[c, k] == 1`` where block ``(c, k)`` exists; ``C = CB * bs``
        input features, ``K = KB * bs`` output features.
    block_size : int
        Block edge ``bs``: 8, 16, 32, 64 or 128.
    use_bias : bool
        Add a bias of shape ``(K,)``.
    activation : str or callable, optional
        A Keras activation applied last.
    kernel_initializer : initializer, optional
        For the packed kernel ``(blocks, bs, bs)``; default: Glorot uniform over the layout's
        mean fan-in and fan-out (see :func:`_default_kernel_initializer`).
    bias_initializer, kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint
        As in ``keras.layers.Dense``.
    z_order : bool
        Number the kernel's blocks in Morton order.
    **kwargs
        Base layer arguments (``name``, ``dtype``, ``trainable``, ...).

    Input ``(..., C)`` -> output ``(..., K)``; features on the last axis, every other axis is a
    batch axis.  Under a mixed precision policy the kernel is cast to the compute dtype.

    Attributes
    ----------
    kernel : variable, shape (blocks, bs, bs)
        Block ``b`` is ``W[c*bs:(c+1)*bs, k*bs:(k+1)*bs]`` with ``(c, k) = block_coord(b)``.
    bias : variable, shape (K,), or None
    layout : blocksparse.layout.Layout
    """

    def __init__(self, layout, block_size=32, use_bias=True, activation=None, kernel_initializer=None,
                 bias_initializer="zeros", kernel_regularizer=None, bias_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, z_order=False, **kwargs):
        super().__init__(**kwargs)
        backend = keras.backend.backend()
        if backend not in _BACKENDS:
            raise NotImplementedError(f"BlocksparseDense runs on Keras's {' and '.join(_BACKENDS)} "
                                      f"backends; this Keras uses {backend!r} (KERAS_BACKEND)")
        if self.compute_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype: BlocksparseDense computes in float32, float16 or bfloat16 (the block-sparse "
                             f"matmul's dtypes); got the dtype policy {self.dtype_policy.name!r}")
        self.supports_masking = True  # as keras.layers.Dense: a mask over the batch axes passes through
        self.layout = Layout(layout, block_size, z_order=check_bool(z_order, "z_order"))
        self.axis = 1
        self.use_bias = check_bool(use_bias, "use_bias")
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = (_default_kernel_initializer(self.layout) if kernel_initializer is None
                                   else keras.initializers.get(kernel_initializer))
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: self.layout.C})

    block_size = property(lambda self: self.layout.block_size)
    C = property(lambda self: self.layout.C)
    K = property(lambda self: self.layout.K)
    blocks = property(lambda self: self.layout.blocks)
    w_shape = property(lambda self: self.layout.w_shape)

    def build(self, input_shape):
        if keras.backend.backend() == "torch":
            from .torch import BlocksparseMatMul

            self._bsmm = BlocksparseMatMul(self.layout, self.block_size)
        else:
            from .matmul import BlocksparseMatMul

            self._bsmm = BlocksparseMatMul(self.layout.mask, self.block_size, z_order=self.layout.z_order,
                                           name=self.name)
        self.kernel = self.add_weight(name="kernel", shape=self.w_shape, initializer=self.kernel_initializer,
                                      regularizer=self.kernel_regularizer, constraint=self.kernel_constraint)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.K,), initializer=self.bias_initializer,
                                        regularizer=self.bias_regularizer, constraint=self.bias_constraint)

    def _product(self, x, w):
        """``x (..., C) @ W -> (..., K)`` with the backend's block-sparse matmul."""
        if keras.backend.backend() == "torch":
            return self._bsmm(x.reshape(-1, self.C), w).reshape(*x.shape[:-1], self.K)
        from ._tf import tf

        # keras's input_spec checks known sizes only
        if tf.compat.dimension_value(x.shape[-1]) is None and not tf.executing_eagerly():
            check = tf.debugging.assert_equal(tf.shape(x)[-1], self.C,
                                              message=f"inputs must have C = {self.C} features on the last axis")
            with tf.control_dependencies([check]):
                x = tf.identity(x)
        y = self._bsmm(tf.reshape(x, [-1, self.C]), w, dw_dtype=w.dtype)
        y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [self.K]], axis=0))
        y.set_shape(x.shape[:-1].concatenate([self.K]))
        return y

    def call(self, inputs):
        x = keras.ops.convert_to_tensor(inputs, dtype=self.compute_dtype)
        y = self._product(x, keras.ops.cast(self.kernel, self.compute_dtype))
        if self.use_bias:
            y = keras.ops.add(y, keras.ops.cast(self.bias, self.compute_dtype))
        return self.activation(y) if self.activation is not None else y

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.K,)

    def get_config(self):
        config = super().get_config()
        config.update(
            layout=self.layout.mask.astype(int).tolist(),
            block_size=self.block_size,
            use_bias=self.use_bias,
            activation=keras.activations.serialize(self.activation),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
            bias_regularizer=keras.regularizers.serialize(self.bias_regularizer),
            kernel_constraint=keras.constraints.serialize(self.kernel_constraint),
            bias_constraint=keras.constraints.serialize(self.bias_constraint),
            z_order=self.layout.z_order,
        )
        return config


if keras.backend.backend() == "tensorflow":
    from .pixelfly import PixelflyDense  # noqa: E402  (the butterfly layer lives with its layouts)
else:  # it runs on TensorFlow alone, which need not be installed here: imported when asked for
    __all__ = ["BlocksparseDense"]

    def __getattr__(name):
        if name == "PixelflyDense":
            from .pixelfly import PixelflyDense
            return PixelflyDense
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
