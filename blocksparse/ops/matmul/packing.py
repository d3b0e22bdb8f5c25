"""Where a weight block lies in its packed storage (:attr:`blocksparse.layout.Layout.packing`).

With ``PACK`` ``p`` the weight is stored as blocks of ``p * BS``, each holding ``p x p`` of the
layout's blocks: block ``f`` is part ``(f // p % p, f % p)`` of stored block ``f // p**2``.  Viewed
as the 2-D array ``(stored blocks * p * BS, p * BS)``, its first element is at row
``(f // p) * BS``, column ``(f % p) * BS``, and its rows are ``p * BS`` elements apart.  ``PACK``
1 is the plain ``(blocks, BS, BS)`` packing.  A negative block id (a table's padding) lies outside
the array (a negative row or column), where tensor-descriptor loads read zeros.
"""
import triton
import triton.language as tl


@triton.jit
def block_origin(blk, BS: tl.constexpr, PACK: tl.constexpr):
    """(row, column) of block ``blk``'s first element in the weight's 2-D view."""
    if PACK == 1:
        row, col = blk * BS, blk * 0
    else:
        row, col = (blk // PACK) * BS, (blk % PACK) * BS
    return row, col


@triton.jit
def block_offset(blk, BS: tl.constexpr, PACK: tl.constexpr):
    """Element offset of block ``blk``'s first element (its rows ``PACK * BS`` apart)."""
    row, col = block_origin(blk, BS, PACK)
    return row * (PACK * BS) + col
