"""Launchers of the LSTM gate kernels on torch tensors: read dims, allocate, grid, launch.

The four gates come as four ``(N, K)`` tensors -- views of one merged ``(N, 4K)`` tensor or
separate ones -- whose features are contiguous (column stride 1, as are ``c`` and the incoming
gradients: :func:`rows` makes them so).  ``cfg`` overrides the tile table
(:func:`blocksparse.ops.lstm.configs.lstm_gates_config`).
"""
import torch
import triton

from ...ops.lstm.configs import lstm_gates_config
from ...ops.lstm.gates import lstm_gates_bwd_kernel, lstm_gates_fwd_kernel
from .._backend import sm_count
from .._reduce import sum_rows


def rows(t):
    """``t`` with contiguous features (a copy only when they are not)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def lstm_gates_fwd(c, gates, bias, *, forget_bias, cfg=None):
    """``(c_next, h_next)`` from the cell state and the four gate pre-activations ``(i, j, f, o)``."""
    n, k = c.shape
    cfg = cfg or lstm_gates_config(k)
    c_next, h_next = c.new_empty((n, k)), c.new_empty((n, k))
    if n and k:
        lstm_gates_fwd_kernel[(triton.cdiv(n, cfg.BN), triton.cdiv(k, cfg.BK))](
            c, *gates, c if bias is None else bias, c_next, h_next,
            n, k, forget_bias,
            c.stride(0), *(t.stride(0) for t in gates), c_next.stride(0), h_next.stride(0),
            BN=cfg.BN, BK=cfg.BK, HAS_BIAS=bias is not None,
            num_warps=cfg.num_warps,
        )
    return c_next, h_next


def lstm_gates_bwd(c, gates, bias, dc_next, dh_next, *, forget_bias, merged, cfg=None):
    """``(dc, dgates, dbias)``: ``dgates`` one ``(N, 4K)`` tensor when ``merged``, else four
    ``(N, K)`` tensors; ``dbias`` None without a bias."""
    n, k = c.shape
    cfg = cfg or lstm_gates_config(k, backward=True)
    dc = c.new_empty((n, k))
    if merged:
        dgates = c.new_empty((n, 4 * k))
        douts = dgates.split(k, dim=1)
    else:
        dgates = douts = tuple(c.new_empty((n, k)) for _ in range(4))
    if not (n and k):
        return dc, dgates, None if bias is None else torch.zeros_like(bias)
    k_tiles, n_tiles = triton.cdiv(k, cfg.BK), triton.cdiv(n, cfg.BN)
    # with a bias every program folds its tokens' dbias into one partial row: few programs
    programs = n_tiles if bias is None else max(1, min(n_tiles, cfg.programs_per_sm * sm_count(c.device) // k_tiles))
    part = None if bias is None else c.new_empty((programs, 4 * k), dtype=torch.float32)
    lstm_gates_bwd_kernel[(programs, k_tiles)](
        c, *gates, c if bias is None else bias, dc_next, dh_next, dc, *douts, c if part is None else part,
        n, k, forget_bias,
        c.stride(0), *(t.stride(0) for t in gates), dc_next.stride(0), dh_next.stride(0),
        dc.stride(0), *(t.stride(0) for t in douts),
        BN=cfg.BN, BK=cfg.BK, HAS_BIAS=bias is not None,
        num_warps=cfg.num_warps,
    )
    dbias = None if part is None else sum_rows([(part, bias.dtype)])[0]
    return dc, dgates, dbias
