"""Layouts of the ``BlocksparseTransformer`` acceptance tests, shared by both frameworks."""
from dataclasses import dataclass

import numpy as np

from attention_reference import Ref

BS = 8


def tril_callback(blk_shape, head, q_blk, k_blk, blk_id):
    return np.tril(np.ones(blk_shape, bool)) if q_blk == k_blk else np.ones(blk_shape, bool)


def patterned_callback(blk_shape, head, q_blk, k_blk, blk_id):
    """A different, irregular mask per (head, q, k); row 2 of block (0, 0) of head 0 keeps nothing."""
    r = np.random.default_rng([head, q_blk, k_blk]).random(blk_shape) < 0.6
    if (head, q_blk, k_blk) == (0, 0, 0):
        r[2] = False
    return r


@dataclass
class Case:
    id: str
    layout: np.ndarray
    heads: int
    callback: object = None

    def make(self, cls):
        return cls(self.layout, block_size=BS, heads=self.heads, mask_callback=self.callback)

    def ref(self):
        lay = np.asarray(self.layout, bool)
        lay = np.broadcast_to(lay if lay.ndim == 3 else lay[None], (self.heads,) + lay.shape[-2:])
        masks = None
        if self.callback is not None:
            masks = [[[None] * lay.shape[2] for _ in range(lay.shape[1])] for _ in range(self.heads)]
            shared = np.asarray(self.layout).ndim == 2 or np.asarray(self.layout).shape[0] == 1
            for h in range(self.heads):
                for b, (q, k) in enumerate(np.argwhere(lay[h])):
                    masks[h][q][k] = self.callback((BS, BS), 0 if shared else h, q, k, b)
        return Ref(lay, BS, masks)


CAUSAL = np.tril(np.ones((3, 3), int))
PER_HEAD = np.array([[[1, 0, 1], [0, 1, 1]], [[1, 1, 0], [1, 0, 1]]])   # 2 heads, 2 x 3 blocks, 4 each
CASES = [
    Case("causal-shared-2heads-tril", CAUSAL, 2, tril_callback),
    Case("per-head-nonsquare", PER_HEAD, 2, None),
    Case("leading-1-layout-3heads-masks", CAUSAL[None], 3, patterned_callback),
    Case("per-head-masks", PER_HEAD, 2, patterned_callback),
]
IDS = [c.id for c in CASES]
