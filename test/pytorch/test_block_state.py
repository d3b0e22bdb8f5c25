"""The block structure in the layers' saved state: a state dict loads only into a layer with the same
blocks (else ``RuntimeError`` naming the difference); the keys stay those of the parameters; plain
dicts without the record load as before."""
import io

import numpy as np
import pytest
import torch

from blocksparse.torch import BlocksparseConvLayer, BlocksparseLinear, PixelflyLinear


def _round_trip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _same_count_layouts(rng):
    """Two different 4 x 5 masks with as many blocks (the weights' shapes agree)."""
    a = rng.random((4, 5)) < 0.5
    a[0, 0], a[0, 1] = True, False
    b = a.copy()
    b[0, 0], b[0, 1] = False, True
    return a.astype(np.int32), b.astype(np.int32)


def test_linear_loads_same_layout_and_refuses_moved_blocks(rng):
    a, b = _same_count_layouts(rng)
    src = BlocksparseLinear(a, block_size=8, impl="reference")
    state = _round_trip(src.state_dict())
    assert set(state) == {"weight", "bias"}
    twin = BlocksparseLinear(a, block_size=8, impl="reference")
    twin.load_state_dict(state)
    x = torch.randn(3, src.in_features)
    torch.testing.assert_close(twin(x), src(x), rtol=0, atol=0)
    other = BlocksparseLinear(b, block_size=8, impl="reference")
    before = other.weight.detach().clone()
    with pytest.raises(RuntimeError,
                       match=r"block structure mismatch for BlocksparseLinear: weight block \d+ sits at .* there and"):
        other.load_state_dict(state)
    assert other.weight.shape == before.shape


def test_linear_block_order_counts(rng):
    """Same mask, other block numbering (Morton order): the weights' blocks mean other places."""
    mask = np.ones((4, 4), dtype=np.int32)
    row_major = BlocksparseLinear(mask, block_size=8, impl="reference")
    morton = BlocksparseLinear(mask, block_size=8, impl="reference", z_order=True)
    with pytest.raises(RuntimeError, match="block structure mismatch"):
        morton.load_state_dict(row_major.state_dict())


def test_plain_dict_without_record_loads(rng):
    a, b = _same_count_layouts(rng)
    src = BlocksparseLinear(a, block_size=8, impl="reference")
    other = BlocksparseLinear(b, block_size=8, impl="reference")
    other.load_state_dict(dict(src.state_dict()), strict=True)  # no metadata: nothing to check
    torch.testing.assert_close(other.weight, src.weight, rtol=0, atol=0)


def test_nested_module_names_the_layer(rng):
    a, b = _same_count_layouts(rng)
    src = torch.nn.Sequential(torch.nn.Identity(), BlocksparseLinear(a, block_size=8))
    dst = torch.nn.Sequential(torch.nn.Identity(), BlocksparseLinear(b, block_size=8))
    with pytest.raises(RuntimeError, match="block structure mismatch for 1:"):
        dst.load_state_dict(_round_trip(src.state_dict()))


def test_pixelfly_factors_differ():
    src = PixelflyLinear(64, 128, 16, 4, n_factors=2)
    twin = PixelflyLinear(64, 128, 16, 4, n_factors=2)
    twin.load_state_dict(_round_trip(src.state_dict()))
    torch.testing.assert_close(twin.weight, src.weight, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="block structure mismatch"):
        PixelflyLinear(64, 128, 16, 4, n_factors=1).load_state_dict(src.state_dict())


def test_conv_channels_differ():
    bck = [([0, 1], [0]), ([1, 2], [1])]
    src = BlocksparseConvLayer(bck, TRS=(3,), DHW=(8,))
    BlocksparseConvLayer(bck, TRS=(3,), DHW=(8,)).load_state_dict(_round_trip(src.state_dict()))
    moved = BlocksparseConvLayer([([0, 2], [0]), ([1, 2], [1])], TRS=(3,), DHW=(8,))
    with pytest.raises(RuntimeError, match="block structure mismatch.*other channels"):
        moved.load_state_dict(src.state_dict())
    transposed = BlocksparseConvLayer(bck, TRS=(3,), DHW=(8,), transposed=True)
    with pytest.raises(RuntimeError, match="block structure mismatch.*transposed"):
        transposed.load_state_dict(src.state_dict())


def test_malformed_record_is_refused(rng):
    a, _ = _same_count_layouts(rng)
    src = BlocksparseLinear(a, block_size=8)
    state = src.state_dict()
    state._metadata[""]["blocksparse_blocks"] = ["not", "ints"]
    with pytest.raises(RuntimeError, match="block structure mismatch.*not the block structure"):
        BlocksparseLinear(a, block_size=8).load_state_dict(state)
