"""Launcher of :func:`blocksparse.ops.common.reduce.sum_rows_kernel`: the deterministic sum of a
kernel's per-program partial rows (layer norm's ``dg`` / ``db``, the LSTM gates' ``dbias``)."""
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
