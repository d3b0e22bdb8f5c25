"""The parameters of a block-sparse convolution as TensorFlow tensors: filters and edge bias."""
import numpy as np

from .. import tf

__all__ = ["flat_filter", "dense_filter", "bucket_filter", "l2_normalize", "edge_bias_image"]


def flat_filter(F, form):
    """``F`` (``"stacked"`` or ``"flat"``, or a list of per-block tensors: ``"blocks"``) as ``(size,)``.

    Always through a reshape: its gradient turns the ``IndexedSlices`` of the grouped path's gathers
    into the dense gradient a filter variable expects.
    """
    if form == "blocks":
        return tf.concat([tf.reshape(f, [-1]) for f in F], axis=0)
    return tf.reshape(F, [-1])


def _taps_first(w, TRS):
    """``(a, b, trs)`` -> ``TRS + (b, a)``: TensorFlow's filter layout (``taps + (in, out)`` of a
    convolution; ``taps + (out, in)`` of a transposed one, which is its forward convolution's)."""
    a, b, _ = w.shape
    ndim = len(TRS)
    return tf.transpose(tf.reshape(w, [a, b, *TRS]), [*range(2, 2 + ndim), 1, 0])


def dense_filter(flat, spec):
    """The dense filter, zero outside the blocks, in TensorFlow's layout: ``TRS + (C, K)`` for a
    convolution, ``TRS + (K, C)`` (``conv_transpose``: output channels first) for a transposed one."""
    blocks = spec.blocks
    dense = tf.scatter_nd(blocks.dense_index[:, None], flat, [int(np.prod(blocks.dense_shape))])
    return _taps_first(tf.reshape(dense, blocks.dense_shape), spec.geometry.TRS)


def bucket_filter(flat, bucket, spec):
    """A bucket's grouped weight (see ``ops.conv.grouping``) in TensorFlow's layout."""
    w = tf.gather(flat, bucket.weight)
    return _taps_first(w, spec.geometry.TRS)


def l2_normalize(flat, gain, spec, epsilon, dtype):
    """Each block's filter scaled to unit norm per output channel, times ``gain[k]`` (float32 math)."""
    segments, channel = spec.blocks.norm_segments
    f32 = tf.cast(flat, tf.float32)
    sum_sq = tf.math.unsorted_segment_sum(tf.square(f32), segments, channel.size)
    scale = tf.math.rsqrt(tf.maximum(sum_sq, epsilon))
    if gain is not None:
        # through a reshape: a dense gradient for the gain, not IndexedSlices
        scale = scale * tf.gather(tf.reshape(tf.cast(gain, tf.float32), [-1]), channel)
    return tf.cast(f32 * tf.gather(scale, segments), dtype)


def edge_bias_image(edge_bias, spec):
    """``(K,) + MPQ``: the edge bias of every output position (zero in the interior)."""
    padded = tf.concat([edge_bias, tf.zeros([spec.blocks.K, 1], edge_bias.dtype)], axis=1)
    return tf.reshape(tf.gather(padded, spec.edges.pattern, axis=1), [spec.blocks.K, *spec.geometry.MPQ])
