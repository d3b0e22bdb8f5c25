"""The small block-sparse MLP and the data the distributed tests train on (shared by the workers
and the single-process reference)."""
import torch

from blocksparse.torch import BlocksparseLinear

STEPS = 3
BATCH = 8
SEED = 1234


def make_model(layouts):
    """Two block-sparse layers with a GELU between them, float64, seeded (every rank equal)."""
    torch.manual_seed(SEED)
    first, second = layouts
    return torch.nn.Sequential(
        BlocksparseLinear(first, block_size=first.block_size, dtype=torch.float64),
        torch.nn.GELU(),
        BlocksparseLinear(second, block_size=second.block_size, dtype=torch.float64),
    )


def batches():
    """``STEPS`` (x, y) batches of ``BATCH`` rows, the same on every rank."""
    g = torch.Generator().manual_seed(SEED + 1)
    for _ in range(STEPS):
        yield (torch.randn(BATCH, 64, generator=g, dtype=torch.float64),
               torch.randn(BATCH, 48, generator=g, dtype=torch.float64))
