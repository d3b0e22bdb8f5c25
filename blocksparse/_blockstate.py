"""A layer's block structure as a flat int64 array, saved beside its weights so that they load only
into a layer whose blocks sit where theirs did (the PyTorch layers' state-dict metadata,
:mod:`blocksparse.torch._state`; the Keras layers' variable stores, :class:`KerasBlockState`).

A block-sparse weight is a stack of blocks whose places the layout holds, not the weight: loaded into
a layer of another layout with as many blocks, it would run without an error and compute another
function.
"""
from __future__ import annotations

import numpy as np

__all__ = ["KEY", "linear_signature", "conv_signature", "difference", "mismatch_message", "KerasBlockState"]

#: The name of the record (a metadata entry, a store key).
KEY = "blocksparse_blocks"
_VERSION = 1
_LINEAR, _CONV = 1, 2
_HEAD = {_LINEAR: 7, _CONV: 5}


def linear_signature(layout):
    """``[version, kind, block_size, CB, KB, packing, blocks, c0, k0, c1, k1, ...]``: the mask's shape and
    each stored block's coordinate, in weight order."""
    head = [_VERSION, _LINEAR, layout.block_size, layout.CB, layout.KB, layout.packing, layout.blocks]
    return np.concatenate([np.asarray(head, np.int64), np.asarray(layout.coords, np.int64).ravel()])


def conv_signature(blocks):
    """``[version, kind, transposed, taps, blocks, (len(c), len(k), c..., k...) per block]``."""
    parts = [np.asarray([_VERSION, _CONV, int(blocks.transposed), blocks.trs, blocks.blocks], np.int64)]
    for c, k in zip(blocks.cs, blocks.ks):
        parts += [np.asarray([c.size, k.size], np.int64), np.asarray(c, np.int64), np.asarray(k, np.int64)]
    return np.concatenate(parts)


def _describe(sig):
    s = sig.tolist()
    if s[1] == _LINEAR:
        return f"a layout of {s[3]} x {s[4]} blocks of {s[2]}, {s[6]} set"
    return f"{s[4]} blocks, {s[3]} taps{', transposed' if s[2] else ''}"


def difference(mine, saved):
    """None when the record ``saved`` equals the signature ``mine``, else what differs, in words."""
    try:
        saved = np.asarray(saved)
    except (TypeError, ValueError):
        saved = None
    if (saved is None or saved.ndim != 1 or saved.dtype.kind not in "iu" or saved.size < 5
            or int(saved[0]) != _VERSION or saved.size < _HEAD.get(int(saved[1]), saved.size + 1)):
        return "the record is not the block structure of a layer this version reads"
    saved = saved.astype(np.int64)
    if np.array_equal(saved, mine):
        return None
    if int(saved[1]) != int(mine[1]):
        return "saved by another kind of layer"
    head = _HEAD[int(mine[1])]
    if not np.array_equal(saved[:head], mine[:head]):
        return f"saved with {_describe(saved)}; this layer has {_describe(mine)}"
    if int(mine[1]) == _LINEAR and saved.size == mine.size:
        b = int(np.flatnonzero(saved[head:] != mine[head:])[0]) // 2
        there, here = saved[head + 2 * b: head + 2 * b + 2].tolist(), mine[head + 2 * b: head + 2 * b + 2].tolist()
        return f"weight block {b} sits at layout (row, column) {tuple(there)} there and {tuple(here)} here"
    return "the blocks connect other channels there than here"


def _numpy(t):
    """A restored record's value (eager: its numpy value; None where there is none, or in a graph,
    where the check cannot run)."""
    try:
        return None if t is None else t.numpy()
    except (AttributeError, NotImplementedError):
        return None


def mismatch_message(where, problem):
    """The loading error's text for the layer ``where``."""
    return (f"block structure mismatch for {where}: {problem}; "
            "a block-sparse weight loads only into a layer with the same blocks")


class KerasBlockState:
    """Mixin of Keras layers with a ``layout``: the store of their variables (``.keras`` and
    ``.weights.h5`` files) and, on the TensorFlow backend, TensorFlow checkpoints
    (``tf.train.Checkpoint``, ``model.save_weights`` in its format, SavedModels) also hold the block
    structure, and loading checks it (``ValueError`` on a difference; a store or checkpoint without
    it loads as before)."""

    # TensorFlow checkpoints: the record is a saved attribute of the layer itself (not a child
    # object), so that checkpoints written before it existed still match every object.
    def _serialize_to_tensors(self):
        import tensorflow as tf

        if getattr(self, "layout", None) is None:
            return {}
        return {KEY: tf.constant(linear_signature(self.layout))}

    def _restore_from_tensors(self, restored_tensors):
        import tensorflow as tf

        saved = _numpy(restored_tensors.get(KEY))
        if saved is not None and getattr(self, "layout", None) is not None:
            problem = difference(linear_signature(self.layout), saved)
            if problem is not None:
                raise ValueError(mismatch_message(f"layer '{self.name}'", problem))
        return tf.no_op()

    def save_own_variables(self, store):
        super().save_own_variables(store)
        if getattr(self, "layout", None) is not None:
            store[KEY] = linear_signature(self.layout)

    def load_own_variables(self, store):
        keys = list(store.keys())
        if KEY in keys:
            if getattr(self, "layout", None) is not None:
                problem = difference(linear_signature(self.layout), store[KEY])
                if problem is not None:
                    raise ValueError(mismatch_message(f"layer '{self.name}'", problem))
            store = {k: store[k] for k in keys if k != KEY}
        super().load_own_variables(store)
