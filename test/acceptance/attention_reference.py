"""Independent float64 numpy references of the ``BlocksparseTransformer`` ops, written from the
documented semantics: packed blocks of each head in row-major ``(q, k)`` order, element
``[n, h, b, i, j]`` = query position ``q*bs + i`` against key position ``k*bs + j``."""
import numpy as np


class Ref:
    """``layout``: 0/1 ``(H, QB, KB)`` (one per head, already broadcast); ``masks``: ``(H, QB, KB, bs,
    bs)`` 0/1 element masks (None: all kept)."""

    def __init__(self, layout, bs, masks=None):
        self.layout, self.bs = np.asarray(layout, bool), bs
        self.H, self.QB, self.KB = self.layout.shape
        self.coords = [np.argwhere(self.layout[h]) for h in range(self.H)]   # row-major
        self.blocks = len(self.coords[0])
        keep = np.zeros((self.H, self.QB * bs, self.KB * bs), bool)
        for h in range(self.H):
            for q, k in self.coords[h]:
                m = np.ones((bs, bs), bool) if masks is None else np.asarray(masks[h][q][k], bool)
                keep[h, q * bs:(q + 1) * bs, k * bs:(k + 1) * bs] = m
        self.keep = keep

    def _split(self, x):
        N, ctx, F = x.shape
        return np.asarray(x, np.float64).reshape(N, ctx, self.H, F // self.H).transpose(0, 2, 1, 3)  # (N, H, ctx, D)

    @staticmethod
    def _merge(x):
        N, H, ctx, D = x.shape
        return x.transpose(0, 2, 1, 3).reshape(N, ctx, H * D)

    def pack(self, dense):
        """(N, H, ctx_q, ctx_k) -> (N, H, blocks, bs, bs)."""
        bs = self.bs
        out = np.zeros((dense.shape[0], self.H, self.blocks, bs, bs))
        for h in range(self.H):
            for b, (q, k) in enumerate(self.coords[h]):
                out[:, h, b] = dense[:, h, q * bs:(q + 1) * bs, k * bs:(k + 1) * bs]
        return out

    def unpack(self, packed):
        bs = self.bs
        out = np.zeros((packed.shape[0], self.H, self.QB * bs, self.KB * bs))
        for h in range(self.H):
            for b, (q, k) in enumerate(self.coords[h]):
                out[:, h, q * bs:(q + 1) * bs, k * bs:(k + 1) * bs] = packed[:, h, b]
        return out

    def nt(self, a, b):
        return self.pack(np.einsum("nhid,nhjd->nhij", self._split(a), self._split(b)))

    def nn(self, w, x):
        return self._merge(np.einsum("nhij,nhjd->nhid", self.unpack(np.asarray(w, np.float64)), self._split(x)))

    def tn(self, w, x):
        return self._merge(np.einsum("nhij,nhid->nhjd", self.unpack(np.asarray(w, np.float64)), self._split(x)))

    def keep_mask(self, autoregress_at_key=None):
        keep = self.keep.copy()
        if autoregress_at_key is not None:
            qp = np.arange(keep.shape[1])[:, None]
            kp = np.arange(keep.shape[2])[None, :]
            keep &= (kp <= qp) | (kp < autoregress_at_key)
        return keep

    def softmax(self, x, scale=1.0, autoregress_at_key=None, masked=True):
        keep = self.keep_mask(autoregress_at_key) if masked else self.unpack(np.ones((1, self.H, self.blocks,
                                                                                       self.bs, self.bs)))[0] > 0
        s = self.unpack(np.asarray(x, np.float64)) * scale
        s = np.where(keep, s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        e = np.where(keep, np.exp(s - np.where(np.isfinite(top), top, 0)), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        return self.pack(np.where(total > 0, e / np.where(total > 0, total, 1), 0.0))

    def softmax_grad(self, dy, y, scale=1.0):
        """d(scores) for probabilities ``y`` and their gradient ``dy`` (packed)."""
        Y, DY = self.unpack(np.asarray(y, np.float64)), self.unpack(np.asarray(dy, np.float64))
        return self.pack(scale * Y * (DY - (DY * Y).sum(-1, keepdims=True)))
