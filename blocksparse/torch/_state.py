"""The block structure in a layer's saved state: a checkpoint loads only into a layer whose blocks sit
where the checkpoint's did.

A block-sparse weight is a stack of blocks whose places the layout holds, not the weight: loaded into a
layer of another layout with as many blocks, it would run without an error and compute another
function.  The layers therefore record their block structure in the state dict's metadata (beside the
module's ``version``, so the keys stay ``weight`` / ``bias`` / ..., as ``nn.Linear``'s; ``torch.save``
keeps it, ``torch.load(weights_only=True)`` reads it), and loading a state dict whose recorded
structure differs fails as a shape mismatch does: ``load_state_dict`` raises ``RuntimeError`` naming
the module and the first difference.  A state dict without the record (a plain ``dict``, safetensors,
a checkpoint saved before the layers kept it) loads as before.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["BlockState", "LayoutState", "linear_signature", "conv_signature"]

_VERSION = 1
_LINEAR, _CONV = 1, 2
_KEY = "blocksparse_blocks"


def linear_signature(layout):
    """``[version, kind, block_size, CB, KB, packing, blocks, c0, k0, c1, k1, ...]``: the mask's shape and
    each stored block's coordinate, in weight order."""
    head = [_VERSION, _LINEAR, layout.block_size, layout.CB, layout.KB, layout.packing, layout.blocks]
    return torch.from_numpy(np.concatenate([np.asarray(head, np.int64), np.asarray(layout.coords, np.int64).ravel()]))


def conv_signature(blocks):
    """``[version, kind, transposed, taps, blocks, (len(c), len(k), c..., k...) per block]``."""
    parts = [np.asarray([_VERSION, _CONV, int(blocks.transposed), blocks.trs, blocks.blocks], np.int64)]
    for c, k in zip(blocks.cs, blocks.ks):
        parts += [np.asarray([c.size, k.size], np.int64), np.asarray(c, np.int64), np.asarray(k, np.int64)]
    return torch.from_numpy(np.concatenate(parts))


def _describe(sig):
    """Readable summary of a signature's header."""
    s = sig.tolist()
    if s[1] == _LINEAR:
        return f"a layout of {s[3]} x {s[4]} blocks of {s[2]}, {s[6]} set"
    return f"{s[4]} blocks, {s[3]} taps{', transposed' if s[2] else ''}"


def _difference(mine, saved):
    """None when ``saved`` equals ``mine``, else what differs, in words."""
    if not (isinstance(saved, torch.Tensor) and saved.dtype == torch.int64 and saved.dim() == 1
            and saved.numel() >= 5 and int(saved[0]) == _VERSION
            and saved.numel() >= {_LINEAR: 7, _CONV: 5}.get(int(saved[1]), saved.numel() + 1)):
        return "not the block structure of a blocksparse layer this version reads"
    if saved.shape == mine.shape and torch.equal(saved, mine):
        return None
    if int(saved[1]) != int(mine[1]):
        return "saved by another kind of layer"
    head = 7 if int(mine[1]) == _LINEAR else 5
    if not torch.equal(saved[:head], mine[:head]):
        return f"the checkpoint has {_describe(saved)}; this layer {_describe(mine)}"
    if int(mine[1]) == _LINEAR and saved.numel() == mine.numel():
        b = int(torch.nonzero(saved[7:] != mine[7:])[0]) // 2
        here, there = mine[7 + 2 * b: 9 + 2 * b].tolist(), saved[7 + 2 * b: 9 + 2 * b].tolist()
        return (f"weight block {b} sits at layout (row, column) {tuple(there)} in the checkpoint and "
                f"{tuple(here)} in this layer")
    return "the blocks connect other channels in the checkpoint than in this layer"


class BlockState:
    """Mixin of ``nn.Module`` layers: ``_block_signature()`` (an int64 CPU tensor) is recorded in the
    state dict's metadata and checked on load (see the module)."""

    def _block_signature(self):
        raise NotImplementedError

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        metadata = getattr(destination, "_metadata", None)
        if metadata is not None:
            metadata.setdefault(prefix[:-1], {})[_KEY] = self._block_signature().tolist()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        saved = (local_metadata or {}).get(_KEY)
        if saved is not None:
            try:
                saved = torch.as_tensor(saved, dtype=torch.int64)
            except (TypeError, ValueError, RuntimeError):
                saved = None
            problem = _difference(self._block_signature(), saved)
            if problem is not None:
                where = prefix[:-1] or type(self).__name__
                error_msgs.append(f"block structure mismatch for {where}: {problem}; a block-sparse weight loads "
                                  f"only into a layer with the same blocks")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class LayoutState(BlockState):
    """:class:`BlockState` of the linear layers: their ``layout``'s blocks, in weight order."""

    def _block_signature(self):
        return linear_signature(self.layout)
