"""The tile tables' rules: fitting to block sizes, and the backward's grid order by layout density."""
from dataclasses import replace

import numpy as np
import pytest

from blocksparse.ops.attention import configs
from blocksparse.torch._attention.state import LayoutState


@pytest.mark.parametrize("block_size", configs.KERNEL_BLOCK_SIZES)
@pytest.mark.parametrize("head_dim", configs.HEAD_DIMS)
def test_tiles_never_straddle_blocks(head_dim, block_size):
    for cfg in (configs.fwd_config(head_dim, block_size), configs.bwd_config(head_dim, block_size, 0.1)):
        tiles = [cfg.BM, cfg.BN] if isinstance(cfg, configs.FwdConfig) else [cfg.BM1, cfg.BN1, cfg.BM2, cfg.BN2]
        assert all(t <= block_size and block_size % t == 0 for t in tiles)


def test_sparse_layouts_start_every_heads_heaviest_tiles_first():
    """At or below the table's density the backward takes ``heads_first``; above it, and without a
    density, the table's own config; head dims without an entry never change."""
    for head_dim, limit in configs.SPARSE_HEADS_FIRST.items():
        table = configs.bwd_config(head_dim, 128)
        assert not table.heads_first
        assert configs.bwd_config(head_dim, 128, limit).heads_first
        assert configs.bwd_config(head_dim, 128, limit / 2) == replace(table, heads_first=True)
        assert configs.bwd_config(head_dim, 128, min(1.0, limit + 0.01)) == table
    assert configs.SPARSE_HEADS_FIRST[128] < 0.24  # BigBird 4k (24% kept) ran slower with it
    for head_dim in set(configs.HEAD_DIMS) - set(configs.SPARSE_HEADS_FIRST):
        assert configs.bwd_config(head_dim, 128, 0.01) == configs.bwd_config(head_dim, 128)


def test_layout_density_counts_the_blocks_causal_keeps():
    rng = np.random.default_rng()
    layout = rng.random((3, 8, 8)) < 0.4
    st = LayoutState(layout, 16)
    assert st.density(False) == layout.mean()
    assert st.density(True) == np.tril(layout).mean()
    full = LayoutState(np.ones((1, 8, 8), bool), 16)
    assert full.density(True) == 36 / 64 and full.density(False) == 1.0
