"""Launchers of the layer-norm kernels on torch tensors: read dims, allocate, grid, launch.

``x`` is ``(N, C)`` (``axis=1``) or ``(C, N)`` (``axis=0``), any strides; outputs are allocated
contiguous in the same layout.  ``mean`` / ``rstd`` are float32 ``(segments, N)``.  ``cfg``
overrides the tile table (:func:`blocksparse.ops.norms.configs.layer_norm_config`).
"""
import torch
import triton

from ...ops.norms.configs import (MERGE_WARPS, SplitConfig, layer_norm_config, split_backward_config,
                                  split_forward_config)
from ...ops.norms.layer_norm import layer_norm_bwd_kernel, layer_norm_fwd_kernel
from ...ops.norms.split_bwd import layer_norm_bwd_dx_kernel, layer_norm_bwd_part_kernel
from ...ops.norms.split_fwd import layer_norm_fwd_apply_kernel, layer_norm_fwd_merge_kernel, layer_norm_fwd_stats_kernel
from .._backend import sm_count
from .._reduce import sum_rows


def _strides(t, axis):
    """(token stride, feature stride) of activations in either layout."""
    return (t.stride(0), t.stride(1)) if axis == 1 else (t.stride(1), t.stride(0))


def _dims(x, axis, segments):
    """(tokens, features, features per segment)."""
    n, c = (x.shape[0], x.shape[1]) if axis == 1 else (x.shape[1], x.shape[0])
    return n, c, c // segments


def _aligned(axis, n, *tensors):
    """Whether Triton can load a ``(C, N)`` call's rows as vectors (it specialises on the token count,
    the feature strides and the addresses being multiples of 16); ``(N, C)`` tiles do not depend on it."""
    return axis == 1 or (n % 16 == 0 and all(t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in tensors))


def layer_norm_fwd(x, g, b, *, axis, epsilon, relu, segments, cfg=None):
    """``(y, mean, rstd)`` of ``relu?((x - mean) * rstd * g + b)`` per segment.  ``cfg``: a
    :class:`~blocksparse.ops.norms.configs.NormConfig` (the one-launch kernel) or a
    :class:`~blocksparse.ops.norms.configs.SplitConfig` (three launches)."""
    n, _, cs = _dims(x, axis, segments)
    y = x.new_empty(x.shape)
    if cfg is None:
        aligned = _aligned(axis, n, x, y)
        cfg = split_forward_config(axis, n, cs, x.element_size(), aligned) or \
            layer_norm_config(axis, cs, x.element_size(), relu=relu, aligned=aligned)
    mean = x.new_empty((segments, n), dtype=torch.float32)
    rstd = x.new_empty((segments, n), dtype=torch.float32)
    if n and isinstance(cfg, SplitConfig):
        _split_fwd(x, g, b, y, mean, rstd, axis, epsilon, relu, segments, cfg)
    elif n:
        layer_norm_fwd_kernel[(cfg.programs(n, segments, sm_count(x.device)), segments)](
            x, x if g is None else g, x if b is None else b, y, mean, rstd,
            n, cs, epsilon,
            *_strides(x, axis), *_strides(y, axis),
            BN=cfg.BN, BC=cfg.BC, ONE_CHUNK=cfg.one_chunk(cs),
            HAS_G=g is not None, HAS_B=b is not None, RELU=relu,
            num_warps=cfg.num_warps,
        )
    return y, mean, rstd


def _split_fwd(x, g, b, y, mean, rstd, axis, epsilon, relu, segments, cfg):
    """The forward in three launches over feature slices (:mod:`blocksparse.ops.norms.split_fwd`): the
    slices' partial statistics are staged in ``y``'s memory, which the last launch writes."""
    n, _, cs = _dims(x, axis, segments)
    fs = cfg.slice_features(n, cs, segments, sm_count(x.device))
    grid = (triton.cdiv(n, cfg.BN), triton.cdiv(cs, fs), segments)
    part = y.view(-1).view(torch.float32) if y.is_contiguous() and y.numel() * y.element_size() % 4 == 0 else None
    if part is None or part.numel() < segments * grid[1] * 2 * n:  # partials that do not fit y: a buffer
        part = x.new_empty((segments * grid[1] * 2 * n,), dtype=torch.float32)
    layer_norm_fwd_stats_kernel[grid](x, part, n, cs, fs, *_strides(x, axis), BN=cfg.BN, R=cfg.R,
                                      num_warps=cfg.num_warps)
    layer_norm_fwd_merge_kernel[(grid[0], 1, segments)](part, mean, rstd, n, cs, fs, epsilon, BN=cfg.BN,
                                                         num_warps=MERGE_WARPS)
    layer_norm_fwd_apply_kernel[grid](
        x, x if g is None else g, x if b is None else b, y, mean, rstd,
        n, cs, fs, *_strides(x, axis), *_strides(y, axis),
        BN=cfg.BN, R=cfg.R, HAS_G=g is not None, HAS_B=b is not None, RELU=relu, num_warps=cfg.num_warps)


def layer_norm_bwd(dy, x, g, b, mean, rstd, *, axis, relu, segments, cfg=None):
    """``(dx, dg, db)`` (``dg`` / ``db`` None where ``g`` / ``b`` is) from the forward's statistics.
    ``cfg``: a :class:`~blocksparse.ops.norms.configs.NormConfig` (the one-launch kernel) or a
    :class:`~blocksparse.ops.norms.configs.SplitConfig` (two launches)."""
    n, c, cs = _dims(x, axis, segments)
    dx = x.new_empty(x.shape)
    if not n:
        return dx, *(None if p is None else torch.zeros_like(p) for p in (g, b))
    if cfg is None:
        aligned = _aligned(axis, n, x, dy, dx)
        cfg = split_backward_config(axis, cs, x.element_size(), relu, aligned) or \
            layer_norm_config(axis, cs, x.element_size(), backward=True, relu=relu, aligned=aligned)
    if isinstance(cfg, SplitConfig):
        return _split_bwd(dy, x, dx, g, b, mean, rstd, axis, relu, segments, cfg)
    one_chunk = cfg.one_chunk(cs)
    programs = cfg.programs(n, segments, sm_count(x.device))
    # one chunk: every program writes its whole row once; chunked: rows are accumulated into
    alloc = x.new_empty if one_chunk else x.new_zeros
    dg_part = None if g is None else alloc((programs, c), dtype=torch.float32)
    db_part = None if b is None else alloc((programs, c), dtype=torch.float32)
    layer_norm_bwd_kernel[(programs, segments)](
        x, x if g is None else g, x if b is None else b, dy, dx, mean, rstd,
        mean if dg_part is None else dg_part, mean if db_part is None else db_part,
        n, cs,
        *_strides(x, axis), *_strides(dy, axis), *_strides(dx, axis),
        BN=cfg.BN, BC=cfg.BC, ONE_CHUNK=one_chunk,
        HAS_G=g is not None, HAS_B=b is not None, RELU=relu,
        num_warps=cfg.num_warps,
    )
    return dx, *_param_grads(dg_part, db_part, g, b)


def _split_bwd(dy, x, dx, g, b, mean, rstd, axis, relu, segments, cfg):
    """The backward in two launches over feature slices (:mod:`blocksparse.ops.norms.split_bwd`)."""
    n, c, cs = _dims(x, axis, segments)
    fs = cfg.slice_features(n, cs, segments, sm_count(x.device))
    grid = (triton.cdiv(n, cfg.BN), triton.cdiv(cs, fs), segments)
    c1 = x.new_empty((segments * grid[1], n), dtype=torch.float32)
    c2 = torch.empty_like(c1)
    dg_part = None if g is None else x.new_empty((grid[0], c), dtype=torch.float32)
    db_part = None if b is None else x.new_empty((grid[0], c), dtype=torch.float32)
    params = (x if g is None else g, x if b is None else b)
    flags = dict(BN=cfg.BN, R=cfg.R, HAS_G=g is not None, HAS_B=b is not None, RELU=relu, num_warps=cfg.num_warps)
    layer_norm_bwd_part_kernel[grid](
        x, *params, dy, mean, rstd, c1, c2,
        c1 if dg_part is None else dg_part, c1 if db_part is None else db_part,
        n, cs, fs, *_strides(x, axis), *_strides(dy, axis), **flags)
    layer_norm_bwd_dx_kernel[grid](
        x, *params, dy, dx, mean, rstd, c1, c2,
        n, cs, fs, *_strides(x, axis), *_strides(dy, axis), *_strides(dx, axis), **flags)
    return dx, *_param_grads(dg_part, db_part, g, b)


def _param_grads(dg_part, db_part, g, b):
    """``(dg, db)`` from their partial rows (None where the parameter is)."""
    wanted = [(part, t.dtype) for part, t in ((dg_part, g), (db_part, b)) if t is not None]
    sums = sum_rows(wanted) if wanted else []
    return (sums.pop(0) if g is not None else None), (sums.pop(0) if b is not None else None)
