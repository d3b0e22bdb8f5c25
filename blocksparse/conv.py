"""Block-sparse convolution for TensorFlow (the original ``blocksparse.conv`` API).

>>> import numpy as np, tensorflow as tf
>>> from blocksparse.conv import BlocksparseConv
>>> BCK = [([0, 1], [0, 1, 2]), ([2, 3], [3])]          # blocks of (input, output) channels
>>> conv = BlocksparseConv(BCK, TRS=(3, 3), DHW=(8, 8), edge_bias=True)
>>> conv.f_shape(), conv.f_shape(0), conv.f_shape(1)    # unequal blocks: one flat filter
([72], [3, 2, 3, 3], [1, 2, 3, 3])
>>> F = tf.Variable(tf.random.normal(conv.f_shape()))
>>> y = conv(F, tf.ones(conv.i_shape(2)), edge_bias=tf.zeros(conv.edge_bias_shape()))
>>> y.shape, conv.edge_bias_shape()
(TensorShape([2, 4, 8, 8]), (4, 8))

Activations are channels-first, ``NCDHW`` / ``NCHW`` / ``NCW`` for 3-D / 2-D / 1-D convolutions.
Works in TF2 eager mode, in ``tf.function`` (the minibatch may be unknown) and in ``tf.compat.v1``
graphs; float32, float16 and bfloat16 (a float32 filter and edge bias with 16-bit activations
too); gradients for the input, the filter and the edge bias.
On a GPU sparse layouts of wide blocks run as grouped convolutions, everywhere else one
convolution with the dense filter that is zero outside the blocks does (see
:mod:`blocksparse._tf.conv.compute`).  ``BLOCKSPARSE_BACKEND=reference`` always takes the latter.

``cwise_linear`` -- ``a * x + b`` per channel of an NCHW (or NCDHW) tensor.
"""
import numpy as np

from ._tf import checks, tf
from ._tf.conv import compute, params
from ._tf.ew import args as ewargs
from ._tf.norms import channels
from .ops.conv import ConvShapes

__all__ = ["BlocksparseConv", "BlocksparseDeconv", "cwise_linear"]


_HALF_DTYPES = (tf.float16, tf.bfloat16)


def _check_param_dtype(dtype, I, name):
    """A parameter (the filter ``F`` or the edge bias) goes with ``I`` when it has ``I``'s dtype or is
    float32 beside float16 / bfloat16 ``I`` (mixed precision: float32 master weights); else a
    ``TypeError`` naming it."""
    dtype, i_dtype = dtype.base_dtype, I.dtype.base_dtype  # base: v1 reference tensors too
    if dtype == i_dtype or (dtype == tf.float32 and i_dtype in _HALF_DTYPES):
        return
    raise TypeError(f"{name} and I must have the same dtype (or {name} float32 with float16 / bfloat16 I); "
                    f"got {name} {dtype.name} and I {i_dtype.name}")


class BlocksparseConv(ConvShapes):
    """A convolution whose filter connects blocks of input channels to blocks of output channels.

    Parameters
    ----------
    BCK : sequence of (input channels, output channels) pairs
        One pair per block: ``((c0, c1, ...), (k0, k1, ...))``.  Any channels, in any order; blocks
        may differ in size and share input or output channels, but no (c, k) pair may be in two
        blocks.  ``C = max(c) + 1`` inputs, ``K = max(k) + 1`` outputs.
    TRS : (T, R, S) or (R, S) or (S,)
        Filter size; its length (1 to 3) is the number of spatial dimensions.
    DHW : (D, H, W) or (H, W) or (W,)
        Spatial size of the input.
    MPQ : (M, P, Q) or (P, Q) or (Q,), optional
        Spatial size of the output.  A convolution's is fixed by the other arguments (checked when
        given); a transposed convolution's picks one of the sizes it can produce (see below).
    strides, dilates : int or tuple
        Per spatial dimension (``(1, 1, 1)`` serves fewer dimensions too).
    padding : "SAME", "VALID", int or tuple
        "SAME": ``(S_eff - 1) // 2`` zeros before each axis (``S_eff = (S - 1) * dilate + 1``) and
        ``ceil(size / stride)`` outputs -- the original package's symmetric padding for odd filters
        (TensorFlow's "SAME" differs at strides > 1).  "VALID": none.  Else zeros per axis, ``p``
        on both sides or ``(before, after)``.
    edge_bias : bool
        Whether calls take an edge bias of shape ``edge_bias_shape()``: one bias per output
        channel and *edge pattern* (the set of filter taps that fall on padding), added to every
        output position with that pattern; interior positions get none.

    Attributes
    ----------
    C, K, blocks, TRS, DHW, MPQ, strides, dilates
        As above (sizes without the leading ones of the 3-tuple defaults).
    padding : tuple of (before, after)
        Zeros the windows read around the input per axis (``after < 0``: trailing positions unread).
    density : float
        Fraction of the ``C x K`` channel pairs the blocks connect.
    flops : int
        Multiply-adds times two per image of the minibatch.

    Filter ``F``: block ``b``'s filter has shape ``f_shape(b) = [Kb, Cb] + TRS`` (output channels
    first); ``F`` is all of them stacked, ``f_shape() = [blocks, Kb, Cb] + TRS``, when the blocks
    share one shape, or flattened and concatenated in block order, ``[size]`` (always accepted), or
    a list of the per-block filters.
    """

    def __init__(self, BCK, TRS, DHW, MPQ=None, strides=(1, 1, 1), dilates=(1, 1, 1), padding="SAME",
                 edge_bias=False):
        # the documented signature on the public class (an unknown keyword names this class)
        super().__init__(BCK, TRS, DHW, MPQ, strides, dilates, padding, edge_bias)

    def _filter(self, F):
        """``(flat filter, form, dtype)`` after checking ``F``'s dtypes and shapes."""
        spec = self.spec
        if isinstance(F, (list, tuple)):
            spec.check_block_count(len(F))
            fs = [checks.float_tensor(f, f"F[{b}]") for b, f in enumerate(F)]
            for b, f in enumerate(fs):
                checks.same_dtype(f, fs[0], f"F[{b}]", "F[0]")
            fs = [checks.check_shape(f, tuple(spec.filter_shape(b)), f"F[{b}]", rank_hint=f" = f_shape({b})")
                  for b, f in enumerate(fs)]
            return params.flat_filter(fs, "blocks"), "blocks", fs[0].dtype
        F = checks.float_tensor(F, "F")
        if F.shape.rank is None and spec.blocks.uniform:  # stacked or flat: only the run can tell
            shape = checks.shape_one_of(F, [tuple(spec.filter_shape()), (spec.blocks.size,)],
                                        f"F must have shape {tuple(spec.filter_shape())} or "
                                        f"({spec.blocks.size},) = f_shape()")
            return params.flat_filter(checks.checked(F, [shape]), "flat"), "runtime", F.dtype
        if F.shape.rank is not None and F.shape.is_fully_defined():
            form = spec.filter_form(F.shape.as_list())
        else:  # a graph placeholder of partly unknown shape: checked when the graph runs
            form = "stacked" if spec.blocks.uniform and F.shape.rank not in (None, 1) else "flat"
        want = spec.filter_shape() if form == "stacked" else [spec.blocks.size]
        F = checks.check_shape(F, tuple(want), "F", rank_hint=" = f_shape()")
        return params.flat_filter(F, form), form, F.dtype

    def _edge_bias(self, edge_bias, I):
        """``edge_bias`` checked: ``I``'s dtype, or float32 beside 16-bit ``I`` (added in float32)."""
        if edge_bias is None:
            return None
        edge_bias = checks.float_tensor(edge_bias, "edge_bias")
        _check_param_dtype(edge_bias.dtype, I, "edge_bias")
        return checks.check_shape(edge_bias, self.edge_bias_shape(), "edge_bias",
                                  rank_hint=self.spec.edge_bias_hint)

    def __call__(self, F, I, edge_bias=None):
        """The convolution of ``I`` with the blocks' filters, plus the edge bias.

        Parameters
        ----------
        F : tensor or variable, shape ``f_shape()`` (or ``[size]``), or a list of ``f_shape(b)``
            The filter, in the dtype of ``I``, or float32 with float16 / bfloat16 ``I`` (float32
            master weights, as the original's float32-filter half kernels took them): then cast
            to ``I``'s dtype for the product, its gradient float32.
        I : tensor, shape ``i_shape(N) = [N, C] + DHW``
            Input activations, float32 / float16 / bfloat16; ``N`` may be unknown in graphs.
        edge_bias : tensor, shape ``edge_bias_shape() = (K, E)``, optional
            Same dtype as ``I``, or float32 with float16 / bfloat16 ``I`` (the original's edge bias
            was float32 whatever the activations): then added in float32, its gradient float32
            (``E = 0`` without ``edge_bias=True``: nothing to add).  Any other dtype mismatch of
            ``F`` or ``edge_bias`` with ``I`` is a ``TypeError`` naming the argument.

        Returns
        -------
        tensor, shape ``o_shape(N) = [N, K] + MPQ``, dtype of ``I``
            Accumulated in float32; differentiable in ``I``, ``F`` and ``edge_bias`` (gradients in
            their own dtypes).
        """
        I = checks.float_tensor(I, "I")
        flat, _, dtype = self._filter(F)
        _check_param_dtype(dtype, I, "F")
        with tf.name_scope(type(self).__name__):
            if dtype.base_dtype != I.dtype.base_dtype:  # float32 F, 16-bit I: the product in I's dtype
                flat = tf.cast(flat, I.dtype.base_dtype)  # (its gradient comes back in float32)
            I = checks.check_shape(I, tuple(self.i_shape(None)), "I", rank_hint=" = i_shape(N) = [N, C] + DHW",
                                   static_rank=True)
            return compute.convolve(I, flat, self._edge_bias(edge_bias, I), self.spec)

    def l2_normalize(self, F, gain=None, epsilon=1e-6, dtype=np.float32):
        """Weight normalisation: each block's filter scaled to unit L2 norm per output channel.

        Parameters
        ----------
        F : tensor, shape ``f_shape()`` (or ``[size]``), or a list of ``f_shape(b)``
            The filter.
        gain : tensor, shape ``(K,)``, optional
            Any float dtype (numpy arrays and float64 tensors are converted to float32).  Scale of
            output channel ``k``, applied to every block's normalised filter of ``k``
            (the original indexed it by block row order: the same for blocks listed in channel
            order that do not share output channels).
        epsilon : float
            Lower bound of the squared norm (guards all-zero filters).
        dtype : dtype
            Dtype of the result (float32, float16 or bfloat16).

        Returns
        -------
        tensor (or list of tensors), the form and shape of ``F``
            For each block and each of its output channels ``k``, that channel's slice of the
            block's filter (``Cb x TRS`` values) divided by ``sqrt(max(sum of squares, epsilon))``,
            times ``gain[k]``.  Computed in float32; differentiable in ``F`` and ``gain``.
        """
        flat, form, _ = self._filter(F)
        epsilon = checks.positive_float(epsilon, "epsilon")
        dtype = checks.float_dtype(dtype, "dtype")
        with tf.name_scope(type(self).__name__ + "_l2_normalize"):
            if gain is not None:
                gain = ewargs.channel_vector(gain, self.K, "gain", "K, the output channels")
            out = params.l2_normalize(flat, gain, self.spec, epsilon, dtype)
        if form == "stacked":
            return tf.reshape(out, self.f_shape())
        if form == "runtime":
            return tf.reshape(out, tf.shape(F))
        if form == "blocks":
            return [tf.reshape(p, self.f_shape(b)) for b, p in enumerate(tf.split(out, self.spec.blocks.sizes))]
        return out


class BlocksparseDeconv(BlocksparseConv):
    """The transposed convolution (deconvolution) of the same parameters: ``I`` of shape
    ``[N, C] + DHW`` to ``[N, K] + MPQ``.

    It is the gradient, with respect to its input, of the convolution from ``[N, K] + MPQ`` to
    ``[N, C] + DHW`` with the same blocks, ``TRS``, ``strides``, ``dilates`` and ``padding``.
    Block ``b``'s filter has shape ``f_shape(b) = [Cb, Kb] + TRS`` (input channels first, like
    PyTorch's ``conv_transpose`` weights).  Output sizes: several ``MPQ`` give the same ``DHW``
    when strided; ``MPQ`` picks one (a ``ValueError`` names the range), by default the one nearest
    ``DHW * strides``.  The edge bias has shape ``(K, E)``: an output position's pattern is the set
    of taps that would come from positions outside the input.  ``l2_normalize`` normalises per
    output channel (over ``Cb x TRS``).
    """

    _transposed = True


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
