"""Merging the dW products of a weight used several times (``group_param_grads``).

When a weight feeds several block-sparse matmuls (an unrolled RNN uses it once per time step),
its gradient is a sum of dW products, one per use.  The products of one layout can be merged:
``sum_t x_t.T @ dy_t`` equals ``concat(x_t).T @ concat(dy_t)`` with the minibatch axes
concatenated, so ``g`` products become ``ceil(g / group_size)`` larger ones.

The rewrite builds new ops beside the old ones and returns the new gradient; it never edits
existing ops.  It looks at the sum that *is* the gradient (through ``Identity`` / ``Cast`` ops
on top of it and on top of each product, and nested sums inside it).  Products gated by control
inputs (``gate_gradients``) stay: they run anyway.  A sum buried deeper -- e.g. under the gradient of
``l2_normalize`` -- is left as it is, which is still the correct gradient.
"""
from dataclasses import replace

from .. import tf
from .autodiff import mark_updat, updat_record

__all__ = ["group_param_grads"]

_SUM_OPS = ("AddN", "AddV2", "Add")
_PASS_OPS = ("Identity", "Cast")


def _cast32(grad, cast32):
    if cast32 and grad.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(grad, tf.float32)
    return grad


def _peel(grad):
    """Split ``grad`` into the ``Identity``/``Cast`` ops on top (outermost first) and the tensor below."""
    chain = []
    while grad.op.type in _PASS_OPS and updat_record(grad.op) is None:
        chain.append(grad.op)
        grad = grad.op.inputs[0]
    return chain, grad


def _terms(total):
    """The addends of ``total``, nested sums flattened (dW products are never opened)."""
    if updat_record(total.op) is not None or total.op.type not in _SUM_OPS:
        return [total]
    return [term for t in total.op.inputs for term in _terms(t)]


def _merged(dws, group_size):
    """Sum of the dW tensors ``dws`` (same group key), merged ``group_size`` at a time."""
    parts = []
    for start in range(0, len(dws), group_size):
        chunk = dws[start:start + group_size]
        if len(chunk) == 1:
            parts.append(chunk[0])
            continue
        records = [updat_record(dw.op) for dw in chunk]
        first = records[0]
        n_axis = 1 - first.axis  # the minibatch axis
        x = tf.concat([r.x for r in records], axis=n_axis)
        dy = tf.concat([r.dy for r in records], axis=n_axis)
        merged = first.products.updat(x, dy, first.layout, first.axis, first.dw_dtype)
        # named and recorded as any dW product: get_parents finds it, a later grouping merges it again
        parts.append(mark_updat(merged, replace(first, x=x, dy=dy)))
    return parts


def group_param_grads(param_grad, group_size, cast32):
    """See :func:`blocksparse.matmul.group_param_grads` (arguments already checked)."""
    if not tf.is_symbolic_tensor(param_grad):  # eager: a value, nothing to rewrite
        return _cast32(param_grad, cast32)
    chain, total = _peel(param_grad)
    terms = _terms(total)
    groups, others = {}, []
    for term in terms:
        # a product under its own Cast (the weight cast before each use) merges too, the merged sum
        # cast to the term's dtype; not one gated by control inputs (tf.compat.v1's gate_gradients:
        # the later steps' dy wait for it, so it runs anyway and a merged product would add work)
        wrappers, product = _peel(term)
        record = updat_record(product.op)
        if record is None or any(op.control_inputs for op in wrappers):
            others.append(term)
        else:
            groups.setdefault((record.group_key(), term.dtype), []).append(product)
    if not any(len(dws) > 1 for dws in groups.values()):
        return _cast32(param_grad, cast32)

    with param_grad.graph.as_default(), tf.name_scope("group_param_grads"):
        parts = [tf.cast(part, dtype) for (_, dtype), dws in groups.items() for part in _merged(dws, group_size)]
        grad = tf.math.add_n(parts + others)
        for op in reversed(chain):
            grad = tf.cast(grad, op.outputs[0].dtype) if op.type == "Cast" else tf.identity(grad)
        return _cast32(grad, cast32)
