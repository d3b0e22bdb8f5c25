"""The transformer ops as differentiable TensorFlow ops (``tf.custom_gradient``).

The three products are closed under differentiation -- ``d(nt) = (nn, tn)``, ``d(nn) = (nt, tn)``,
``d(tn) = (nt, nn)`` -- so each gradient is built from these differentiable ops again (second order
works).  The softmax gradient is ``(dy - sum_row(dy * y)) * y * scale``; a tensor ``scale`` also gets
its gradient.  The softmax gradient's own gradient (second order) is that of its reference formula.
"""
from .. import tf
from . import reference

__all__ = ["nt", "softmax", "softmax_grad", "xn"]


def nt(a, b, layout, products):
    """Packed ``a_h b_hᵀ`` on the layout's blocks, with gradients."""
    @tf.custom_gradient
    def blocksparse_transformer_nt(a, b):
        def grad(dc):
            return xn(dc, b, layout, products, trans=False), xn(dc, a, layout, products, trans=True)
        return products.nt(a, b, layout), grad

    return blocksparse_transformer_nt(a, b)


def xn(w, x, layout, products, trans):
    """``nn`` (``w_h x_h``) or, with ``trans``, ``tn`` (``w_hᵀ x_h``), with gradients."""
    @tf.custom_gradient
    def blocksparse_transformer_xn(w, x):
        def grad(dy):
            dw = nt(x, dy, layout, products) if trans else nt(dy, x, layout, products)
            return dw, xn(w, dy, layout, products, trans=not trans)
        return products.xn(w, x, layout, trans), grad

    return blocksparse_transformer_xn(w, x)


def softmax(x, scale, masks, autoregress_at_key, layout, products, dtype, scale_grad):
    """Masked softmax of ``scale * x`` (``scale``: float32 scalar tensor) in ``dtype``, dropping what
    the in-block ``masks`` (or None) and ``autoregress_at_key`` (None or an int32 scalar) drop; the
    gradient of ``scale`` is computed only when ``scale_grad``."""
    @tf.custom_gradient
    def blocksparse_masked_softmax(x, scale):
        y = products.softmax(x, scale, masks, autoregress_at_key, layout, dtype)

        def grad(dy):
            dx = softmax_grad(dy, y, scale, layout, products, x.dtype)
            if not scale_grad:
                return dx, None
            ds = softmax_grad(dy, y, 1.0, layout, products, tf.float32)
            # 0 where dropped (ds = 0 there), whatever x holds there: inf or NaN padding adds nothing
            return dx, tf.reduce_sum(tf.math.multiply_no_nan(tf.cast(x, tf.float32), ds))

        return y, grad

    return blocksparse_masked_softmax(x, scale)


def softmax_grad(dy, y, scale, layout, products, dtype):
    """``(dy - sum_row(dy * y)) * y * scale`` in ``dtype``, with gradients: those of
    :func:`.reference.softmax_grad` (the ops of the GPU path have none of their own)."""
    @tf.custom_gradient
    def blocksparse_masked_softmax_grad(dy, y, scale):
        def grad(g):
            with tf.GradientTape() as tape:
                tape.watch([dy, y, scale])
                dx = reference.softmax_grad(dy, y, scale, layout, dtype)
            return tape.gradient(dx, [dy, y, scale], output_gradients=g)

        return products.softmax_grad(dy, y, scale, layout, dtype), grad

    return blocksparse_masked_softmax_grad(dy, y, tf.convert_to_tensor(scale, tf.float32))
