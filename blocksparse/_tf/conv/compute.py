"""The two paths of the TensorFlow convolution, with TensorFlow ops only (autodiff gives the
gradients), and the choice between them.

* dense: one convolution with the dense filter that is zero outside the blocks.  Any layout; the
  CPU path (in float32) and, on a GPU, the path for dense layouts or narrow blocks.
* grouped: the plan of :mod:`blocksparse.ops.conv.grouping` (channel gathers, grouped convolutions,
  one output shuffle).  GPUs, for sparse layouts of wide blocks; TensorFlow has no grouped 3-D
  convolution, so 3-D always takes the dense path.

Activations arrive channels-first (the original API's ``NCDHW``); both paths compute channels-last
(TensorFlow's convolution layout on every device) between two transposes.  Padding is explicit
(``tf.pad`` / slicing) and convolutions ``VALID``, so "SAME" means this package's padding, not
TensorFlow's.  TensorFlow rejects strides and dilations together and dilated transposed
convolutions on some devices: those filters are dilated explicitly (zeros between the taps).
"""
from ... import _env
from .. import device, tf
from . import params

__all__ = ["convolve", "dense", "grouped", "gpu_here", "choose"]


_CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}


def gpu_here():
    """Whether ops built now run on a GPU (and ``BLOCKSPARSE_BACKEND`` is not ``reference``)."""
    return _env.backend() != "reference" and device.no_gpu_here(device.device_arch()) is None


def choose(spec):
    """``"grouped"`` or ``"dense"`` for an op built now."""
    if gpu_here() and spec.prefers_grouped and spec.geometry.ndim < 3:
        return "grouped"
    return "dense"


def _channels_last(x, ndim):
    return tf.transpose(x, [0, *range(2, 2 + ndim), 1])


def _channels_first(y, ndim):
    return tf.transpose(y, [0, 1 + ndim, *range(1, 1 + ndim)])


def _frame(x, pads):
    """Channels-last ``x`` with ``(before, after)`` zeros per spatial axis; negative amounts crop."""
    if any(min(p) < 0 for p in pads):
        x = x[(slice(None),) + tuple(slice(max(-b, 0), a if a < 0 else None) for b, a in pads)]
    grow = [[0, 0]] + [[max(b, 0), max(a, 0)] for b, a in pads] + [[0, 0]]
    return tf.pad(x, grow) if any(map(any, grow)) else x


def _dilate(w, dilates):
    """A filter (taps first) with ``dilate - 1`` zeros between its taps on each spatial axis."""
    for axis, d in enumerate(dilates):
        if d > 1:
            shape = w.shape.as_list()
            w = tf.stack([w] + [tf.zeros_like(w)] * (d - 1), axis=axis + 1)
            shape[axis] = shape[axis] * d
            w = tf.reshape(w, shape)[(slice(None),) * axis + (slice(0, shape[axis] - d + 1),)]
    return w


def _widen_single_channels(geometry):
    """Whether single-channel operands must be widened to two channels: TensorFlow's CPU convolution
    (oneDNN, TF 2.21) reads past its buffers for one input channel, a batch of two or more and a
    stride above 1 on a 2-D / 3-D layer whose output is one position wide there (outputs ~1e35, no
    error; the gradient of a transposed convolution with one output channel alike).  A zero second
    channel costs nothing at one channel and sidesteps it on every device."""
    return geometry.ndim > 1 and max(geometry.strides) > 1


def _widened(t, axis):
    """``t`` with one zero slice appended along ``axis``."""
    pads = [[0, 0]] * len(t.shape)
    pads[axis] = [0, 1]
    return tf.pad(t, pads)


def _convolution(x, w, geometry):
    if x.shape[-1] == 1 and _widen_single_channels(geometry):
        x, w = _widened(x, -1), _widened(w, -2)  # filter: taps + (in, out)
    x = _frame(x, geometry.pads)
    strides, dilates = list(geometry.strides), list(geometry.dilates)
    if max(strides) > 1 and max(dilates) > 1:
        w, dilates = _dilate(w, dilates), [1] * len(dilates)
    # an explicit data_format: TF's 3-D gradient reads the attribute and fails on the default None
    return tf.nn.convolution(x, w, strides=strides, padding="VALID", dilations=dilates,
                             data_format=_CHANNELS_LAST[len(strides)])


def _transposed(x, w, geometry, channels):
    """The transposed convolution's output on the padded frame, cropped to the image."""
    w = _dilate(w, geometry.dilates)
    written = channels
    if _widen_single_channels(geometry):  # filter: taps + (out, in); see _widen_single_channels
        if x.shape[-1] == 1:
            x, w = _widened(x, -1), _widened(w, -1)
        if channels == 1:
            w, written = _widened(w, -2), 2
    spans = [a.span for a in geometry.axes]
    shape = tf.stack([tf.shape(x)[0], *spans, written])
    full = tf.nn.conv_transpose(x, w, shape, strides=list(geometry.strides), padding="VALID",
                                data_format=_CHANNELS_LAST[geometry.ndim])
    full = tf.ensure_shape(full, [None, *spans, written])[..., :channels]
    return _frame(full, [(-a.pad, -a.pad_after) for a in geometry.axes])


def dense(x, flat, spec):
    """Channels-last ``x`` through the dense masked filter."""
    w = params.dense_filter(flat, spec)
    if spec.transposed:
        return _transposed(x, w, spec.geometry, spec.blocks.K)
    return _convolution(x, w, spec.geometry)


def grouped(x, flat, spec):
    """Channels-last ``x`` through the grouped plan."""
    plan, outs = spec.grouped, []
    for bucket in plan.buckets:
        if bucket.input_span == (0, spec.blocks.C):
            xb = x
        elif bucket.input_span is not None:
            xb = x[..., bucket.input_span[0]:bucket.input_span[1]]
        else:
            xb = tf.gather(x, bucket.inputs, axis=-1)
        w = params.bucket_filter(flat, bucket, spec)
        if spec.transposed:
            outs.append(_transposed(xb, w, spec.geometry, bucket.groups * bucket.cout))
        else:
            outs.append(_convolution(xb, w, spec.geometry))
    y = outs[0] if len(outs) == 1 else tf.concat(outs, axis=-1)
    if plan.assemble == "permute":
        return tf.gather(y, plan.order, axis=-1)
    if plan.assemble == "add":
        ndim = spec.geometry.ndim
        y = tf.math.unsorted_segment_sum(tf.transpose(y, [1 + ndim, *range(1 + ndim)]), plan.order, plan.channels)
        return tf.transpose(y, [*range(1, 2 + ndim), 0])
    return y


def _nonempty(I, flat, compute, empty_shape, dtype, i_rest):
    """``compute()``, or for an empty batch zeros of ``empty_shape`` (zero gradients for ``I`` and
    ``flat``): TensorFlow's convolutions and their gradients return an empty batch in their input's
    shape, and in ``tf.function`` the graph optimiser removes a reshape to the output's (the shapes
    agree statically).  ``i_rest``: ``I``'s shape after the batch, from the layer (``I``'s own may be
    unknown when the op is built)."""
    flat_shape = flat.shape.as_list()  # static: known when the op is built

    @tf.custom_gradient
    def empty(I, flat):  # the batch (0) from I: a branch of tf.cond leaves it unknown statically
        zeros = tf.zeros(tf.concat([tf.shape(I)[:1], empty_shape[1:]], axis=0), dtype)

        def grad(dy):  # shapes from dy and constants: a tensor of the branch would not reach a loop's
            # or a second derivative's gradient graph
            return (tf.zeros(tf.concat([tf.shape(dy)[:1], i_rest], axis=0), I.dtype),
                    tf.zeros(flat_shape, flat.dtype))

        return zeros, grad

    n = tf.compat.dimension_value(I.shape[0])  # (TensorFlow 1 shapes: a Dimension, not an int)
    if n is not None:
        return compute() if n else empty(I, flat)
    if device.in_xla():  # XLA's convolutions take an empty batch, and its gradient of this cond breaks (garbage shapes)
        return compute()
    return tf.cond(tf.shape(I)[0] > 0, compute, lambda: empty(I, flat))


def convolve(I, flat, edge_bias, spec, path=None):
    """The op's output for channels-first ``I``, the flat filter and the edge bias (or None).

    ``path``: ``"dense"`` or ``"grouped"``; None chooses (grouped on a GPU where it pays).  GPUs
    compute in the inputs' dtype (accumulating in float32), elsewhere in float32.  ``flat`` has
    ``I``'s dtype; ``edge_bias`` too, or float32 (then added in float32: its gradient is summed in
    float32).
    """
    ndim = spec.geometry.ndim
    native = gpu_here()
    path = path or choose(spec)
    dtype = I.dtype
    work = dtype if native else tf.float32
    product = grouped if path == "grouped" else dense
    y = _nonempty(I, flat, lambda: _channels_first(product(_channels_last(tf.cast(I, work), ndim),
                                                           tf.cast(flat, work), spec), ndim),
                  [0, spec.blocks.K, *spec.geometry.MPQ], work, [spec.blocks.C, *spec.geometry.DHW])
    if edge_bias is not None and spec.edge_count:
        add = tf.float32 if edge_bias.dtype.base_dtype == tf.float32 else work  # float32 bias, 16-bit I
        y = tf.cast(y, add) + params.edge_bias_image(tf.cast(edge_bias, add), spec)[None]
    elif edge_bias is not None:  # no edge positions: an edge bias of shape (K, 0)
        y = _empty_edge_bias_grad(y, edge_bias)
    return tf.cast(y, dtype)


@tf.custom_gradient
def _empty_edge_bias_grad(y, edge_bias):
    """``y`` as it is, with a (zero-size) gradient for an edge bias that has no positions, so that
    training loops see a gradient for every variable rather than None."""
    return tf.identity(y), lambda dy: (dy, tf.zeros_like(edge_bias))
