"""Public PyTorch API of block-sparse attention: :class:`BlocksparseTransformer`."""
from __future__ import annotations

import torch

from ..ops.transformer.frontend import TransformerBase, check_autoregress_at_key, check_bench, check_scale
from ._checks import autocast as _autocast
from ._checks import float_dtype, floating_tensor, plain_ops_needed
from ._live import LiveState, field
from ._transformer import ops as _ops
from ._transformer import state as _state

__all__ = ["BlocksparseTransformer"]


class BlocksparseTransformer(LiveState, TransformerBase):
    __doc__ = TransformerBase.__doc__.split("    This class holds")[0] + """\
    PyTorch (``name`` and the ``name`` / ``bench`` arguments of the ops are accepted for the same
    API, and unused): on CUDA tensors the Triton kernels run, elsewhere (and for block size 8 and float64)
    the reference path (PyTorch ops).  Every op is traceable by ``torch.compile(fullgraph=True)``;
    under ``torch.autocast`` the products run in the autocast dtype.

    Examples
    --------
    >>> import numpy as np
    >>> bst = BlocksparseTransformer(np.tril(np.ones((4, 4))), block_size=16, heads=2)
    >>> q, k, v = (torch.randn(3, 64, 2 * 8) for _ in range(3))
    >>> w = bst.query_key_op(q, k)                    # (3, 2, 10, 16, 16)
    >>> p = bst.masked_softmax(w, scale=8 ** -0.5)
    >>> bst.weight_value_op(p, v).shape
    torch.Size([3, 64, 16])
    """

    def __init__(self, layout, block_size=64, heads=None, mask_callback=None, name=None):
        super().__init__(layout, block_size, heads, mask_callback, name)
        self._live_rebuild()

    # what the traced code reads, kept where torch.compile specialises it (see ._live)
    _live_fields = ("layout", "masks")
    layout = field("layout", "The :class:`blocksparse.ops.transformer.lut.AttentionLayout`.")
    masks = field("masks", "The per-block masks of ``mask_callback``, or None.")
    _handle = field("handle")

    def _live_rebuild(self):
        self._handle = _state.handle(self.layout, self.masks, self)

    def _nt(self, a, b, name, bench):
        check_bench(bench)
        a_t, b_t = self._operands((*a, "ctx_q"), (*b, "ctx_k"))
        if a_t.shape[2] != b_t.shape[2]:
            raise ValueError(f"{a[0]} and {b[0]} must have the same features (heads * head_dim); got "
                             f"{a_t.shape[2]} and {b_t.shape[2]}")
        nt = _ops.plain_nt if plain_ops_needed(a_t, b_t) else _ops.nt
        return nt(a_t, b_t, self._handle)

    def _xn(self, w, x, trans, name, bench):
        check_bench(bench)
        (wn, wt), (_, xt) = w, x
        if (isinstance(wt, torch.Tensor) and isinstance(xt, torch.Tensor) and wt.dtype in (torch.float16, torch.bfloat16)
                and xt.dtype == torch.float32 and not torch.is_autocast_enabled(xt.device.type)):
            w = (wn, wt.float())  # 16-bit scores, float32 activations (the original's NN / TN): exact
        w_t, x_t = self._operands((*w, "scores"), (*x, "ctx_q" if trans else "ctx_k"))
        if plain_ops_needed(w_t, x_t):
            return _ops.plain_xn(w_t, x_t, self._handle, trans)
        return (_ops.tn if trans else _ops.nn)(w_t, x_t, self._handle)

    def _softmax(self, x, scale, autoregress_at_key, dtype, masked):
        scale = check_scale(scale)
        autoregress_at_key = check_autoregress_at_key(autoregress_at_key)
        (x,) = self._operands(("x", x, "scores"), autocast=False)
        dtype = x.dtype if dtype is None else float_dtype("dtype", dtype)
        softmax = _ops.plain_softmax if plain_ops_needed(x) else _ops.softmax
        return softmax(x, self._handle, scale, autoregress_at_key, masked, dtype)

    def _operands(self, *specs, autocast=True):
        """Check ``(name, tensor, kind)`` operands (kind: ``"scores"`` or the context, ``"ctx_q"`` /
        ``"ctx_k"``, of activations); cast to the autocast dtype if on."""
        tensors = []
        for name, t, kind in specs:
            floating_tensor(name, t)
            if kind == "scores":
                error = self.scores_shape_error(name, tuple(t.shape))
            else:
                error = self.dense_shape_error(name, tuple(t.shape), getattr(self, kind), kind)
            if error:
                raise ValueError(error)
            tensors.append(t)
        first = tensors[0]
        for (name, *_), t in zip(specs[1:], tensors[1:]):
            if t.device != first.device:
                raise ValueError(f"{specs[0][0]} and {name} must be on one device; got {first.device} and {t.device}")
            if t.shape[0] != first.shape[0]:
                raise ValueError(f"{specs[0][0]} and {name} must have the same batch size; got {first.shape[0]} "
                                 f"and {t.shape[0]}")
        if autocast:
            tensors = _autocast(*tensors)
        for (name, *_), t in zip(specs[1:], tensors[1:]):
            if t.dtype != tensors[0].dtype:
                raise TypeError(f"{specs[0][0]} and {name} must have the same dtype; got {tensors[0].dtype} "
                                f"and {t.dtype}")
        return tensors
