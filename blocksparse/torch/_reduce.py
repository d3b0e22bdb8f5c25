"""Column sums: :func:`sum_rows` launches :func:`blocksparse.ops.common.reduce.sum_rows_kernel`, the
deterministic sum of a kernel's per-program partial rows (layer norm's ``dg`` / ``db``, the LSTM
gates' ``dbias``); :func:`column_sums` is the matmul layers' bias gradient."""
import torch
import triton

from ..ops.common.reduce import sum_rows_kernel, sum_rows_tile


def sum_rows(parts):
    """Column sums of one or two float32 ``(P, M)`` buffers, each cast to its dtype.

    ``parts``: a list of ``(buffer, dtype)`` pairs (one launch serves both); returns a list of
    ``(M,)`` tensors in the same order.
    """
    if not 1 <= len(parts) <= 2:
        raise ValueError(f"sum_rows takes one or two partial buffers; got {len(parts)}")
    (part_a, dtype_a), (part_b, dtype_b) = parts[0], parts[-1]
    P, M = part_a.shape
    out_a = part_a.new_empty((M,), dtype=dtype_a)
    out_b = part_b.new_empty((M,), dtype=dtype_b) if len(parts) == 2 else out_a
    bp, bm = sum_rows_tile(P)
    sum_rows_kernel[(triton.cdiv(M, bm),)](
        part_a, part_b, out_a, out_b,
        P, M,
        HAS_B=len(parts) == 2, BP=bp, BM=bm, num_warps=4,
    )
    return [out_a, out_b][:len(parts)]


_ONES = {}  # (device, dtype) -> a (1, n) row of ones, grown as needed


def column_sums(t):
    """``t.sum(0)`` of a 2-D tensor; for 16-bit CUDA tensors computed as a row of ones times ``t``
    through cuBLAS (float32 accumulation: the same result, 1.3-1.8x faster than ``sum``'s column
    reduction at 8192 rows on the H200; ``bench/results/raw/colsum-h200.json``), as the native op
    does.  The rows of ones are kept per device and dtype, made by the first call (before a CUDA
    graph's capture, as the plans' tables are).  A broadcast scalar (every stride 0, the gradient of
    a ``sum()``) sums to the row count times it: one multiply."""
    if t.dim() == 2 and t.numel() and not any(t.stride()):
        total = t.as_strided((1,), (0,)).float() * t.shape[0]
        return total.to(t.dtype).expand(t.shape[1]).contiguous()
    if not t.is_cuda or t.dim() != 2 or not t.shape[0] or t.dtype not in (torch.bfloat16, torch.float16):
        return t.sum(0)
    key = (t.device, t.dtype)
    ones = _ONES.get(key)
    if ones is None or ones.shape[1] < t.shape[0]:
        ones = _ONES[key] = torch.ones(1, max(t.shape[0], 8192), device=t.device, dtype=t.dtype)
    return (ones[:, :t.shape[0]] @ t).view(t.shape[1])
