"""The block structure in a PyTorch layer's state dict (see :mod:`blocksparse._blockstate`).

The layers record it in the state dict's metadata, beside the module's ``version``, so the keys stay
``weight`` / ``bias`` / ..., as ``nn.Linear``'s; ``torch.save`` keeps it and
``torch.load(weights_only=True)`` reads it.  Loading a state dict whose record differs fails as a
shape mismatch does: ``load_state_dict`` raises ``RuntimeError`` naming the module and the first
difference.  A state dict without the record (a plain ``dict``, safetensors, one saved before the
layers kept it) loads as before.
"""
from __future__ import annotations

from .._blockstate import KEY, conv_signature, difference, linear_signature, mismatch_message

__all__ = ["BlockState", "LayoutState", "ConvState"]


class BlockState:
    """Mixin of ``nn.Module`` layers: ``_block_signature()`` (an int64 numpy array) is recorded in the
    state dict's metadata and checked on load."""

    def _block_signature(self):
        raise NotImplementedError

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        metadata = getattr(destination, "_metadata", None)
        if metadata is not None:
            metadata.setdefault(prefix[:-1], {})[KEY] = self._block_signature().tolist()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        saved = (local_metadata or {}).get(KEY)
        if saved is not None:
            problem = difference(self._block_signature(), saved)
            if problem is not None:
                error_msgs.append(mismatch_message(prefix[:-1] or type(self).__name__, problem))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class LayoutState(BlockState):
    """:class:`BlockState` of the linear layers: their ``layout``'s blocks, in weight order."""

    def _block_signature(self):
        return linear_signature(self.layout)


class ConvState(BlockState):
    """:class:`BlockState` of the convolution layer: which channels each block connects."""

    def _block_signature(self):
        return conv_signature(self.conv.spec.blocks)
