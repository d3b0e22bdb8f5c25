"""The order in which the attention kernels' programs take their tiles (Triton's interpreter):
``split_program`` against the two-dimensional grids it stands for, and ``heads_first`` starting
every head's first (heaviest) tile before any head's second."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from blocksparse.ops.attention.tiles import split_program  # noqa: E402

pytestmark = pytest.mark.interpreter


@triton.jit
def _schedule_kernel(OUT, tiles, heads, HEADS_FIRST: tl.constexpr):
    pid = tl.program_id(0)
    i_t, i_h = split_program(pid, tiles, heads, HEADS_FIRST)
    tl.store(OUT + 2 * pid, i_t)
    tl.store(OUT + 2 * pid + 1, i_h)


def _schedule(tiles, heads, heads_first):
    out = torch.full((tiles * heads, 2), -1, dtype=torch.int32)
    _schedule_kernel[(tiles * heads,)](out, tiles, heads, HEADS_FIRST=heads_first)
    return out.numpy()


@pytest.mark.parametrize("heads_first", [False, True])
def test_every_tile_of_every_head_once(rng, heads_first):
    tiles, heads = (int(x) for x in rng.integers(2, 7, size=2))
    got = _schedule(tiles, heads, heads_first)
    assert sorted(map(tuple, got)) == [(t, h) for t in range(tiles) for h in range(heads)]
    # the launch order of the grid it replaces: (tiles, heads) runs tiles fastest, (heads, tiles) heads
    t, h = np.meshgrid(np.arange(tiles), np.arange(heads), indexing="xy" if not heads_first else "ij")
    want = np.stack([t.ravel(), h.ravel()], axis=1)
    np.testing.assert_array_equal(got, want)


def test_heads_first_starts_every_heads_first_tile_first(rng):
    tiles, heads = int(rng.integers(3, 6)), int(rng.integers(2, 5))
    got = _schedule(tiles, heads, True)
    assert (got[:heads, 0] == 0).all() and sorted(got[:heads, 1]) == list(range(heads))
    assert (np.diff(got[:, 0]) >= 0).all()          # tile ranks never go back
    plain = _schedule(tiles, heads, False)
    assert (plain[:tiles, 1] == 0).all()            # without: head 0's tiles, then head 1's, ...
