"""Bad arguments the PyTorch frontend turns into TypeError / ValueError naming them: float8 and
sparse tensors, an epsilon that vanishes in float32, the conv layer's flags, attention's block size
on a cached raw layout, out-of-range integers."""
import numpy as np
import pytest
import torch

import blocksparse.torch as bt

F8 = getattr(torch, "float8_e4m3fn", None)


def _conv(edge_bias=False):
    return bt.BlocksparseConv([([0, 1], [0, 1]), ([2, 3], [1, 2])], (3,), (8,), edge_bias=edge_bias)


def _cases(make):
    """(label, call) pairs feeding ``make(t)``'d tensors to every op that takes activations."""
    mm = bt.BlocksparseMatMul(np.array([[1, 0], [1, 1]]), 8)
    conv = _conv(edge_bias=True)
    bst = bt.BlocksparseTransformer(np.ones((1, 2, 2), dtype=np.int32), block_size=16)
    x16 = torch.randn(3, 16)
    return [
        ("x", lambda: mm(make(x16), torch.randn(mm.w_shape))),
        ("w", lambda: mm(x16, make(torch.randn(mm.w_shape)))),
        ("x", lambda: bt.layer_norm(make(x16), torch.ones(16), torch.zeros(16))),
        ("c", lambda: bt.fused_lstm_gates(make(torch.randn(3, 4)), torch.randn(3, 16))),
        ("I", lambda: conv(torch.randn(conv.f_shape()), make(torch.randn(conv.i_shape(2))),
                           torch.randn(conv.edge_bias_shape()))),
        ("edge_bias", lambda: conv(torch.randn(conv.f_shape()), torch.randn(conv.i_shape(2)),
                                   make(torch.randn(conv.edge_bias_shape())))),
        ("q", lambda: bst.query_key_op(make(torch.randn(1, 32, 16)), torch.randn(1, 32, 16))),
        ("x", lambda: bst.softmax(make(torch.randn(1, 1, 2, 16, 16)))),
    ]


@pytest.mark.skipif(F8 is None, reason="this torch has no float8")
@pytest.mark.parametrize("index", range(8))
def test_float8_is_refused(index):
    name, call = _cases(lambda t: t.to(F8))[index]
    with pytest.raises(TypeError, match=rf"{name} must be .*float16.*got torch.float8_e4m3fn"):
        call()


@pytest.mark.parametrize("index", range(8))
def test_sparse_tensors_are_refused(index):
    name, call = _cases(lambda t: t.to_sparse())[index]
    with pytest.raises(TypeError, match=rf"{name} must be a dense \(strided\) tensor"):
        call()


@pytest.mark.parametrize("epsilon", [1e-50, 1e39])
def test_epsilon_must_stay_positive_and_finite_in_float32(epsilon):
    x = torch.full((2, 16), 3.0)  # constant rows: the variance is 0, epsilon all that divides
    with pytest.raises(ValueError, match="epsilon must be a positive float32 number"):
        bt.layer_norm(x, torch.ones(16), torch.zeros(16), epsilon=epsilon)
    conv = _conv()
    with pytest.raises(ValueError, match="epsilon must be a positive float32 number"):
        conv.l2_normalize(torch.zeros(conv.f_shape()), epsilon=epsilon)


def test_smallest_float32_epsilon_still_serves():
    x = torch.full((2, 16), 3.0)
    y = bt.layer_norm(x, torch.ones(16), torch.zeros(16), epsilon=1e-45)
    assert torch.equal(y, torch.zeros_like(y))


def test_conv_layer_checks_transposed_and_dtype():
    args = ([([0, 1], [0, 1])], (3,), (8,))
    with pytest.raises(TypeError, match="transposed must be a bool"):
        bt.BlocksparseConvLayer(*args, transposed="no")
    with pytest.raises(TypeError, match="transposed must be a bool"):
        bt.BlocksparseConvLayer(*args, transposed=1)
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64"):
        bt.BlocksparseConvLayer(*args, dtype=torch.int32)
    layer = bt.BlocksparseConvLayer(*args, transposed=np.bool_(True), dtype="float64")
    assert isinstance(layer.conv, bt.BlocksparseDeconv) and layer.weight.dtype == torch.float64


def test_attention_block_size_checked_on_every_call():
    q = torch.randn(1, 2, 32, 16)
    layout = np.ones((2, 2), dtype=np.int32)
    want = bt.attention(q, q, q, layout, block_size=16)  # now cached
    for bad in (16.0, True, np.float32(16)):
        with pytest.raises(TypeError, match="block_size must be an int"):
            bt.attention(q, q, q, layout, block_size=bad)
    with pytest.raises(TypeError, match="block_size must be an int"):
        bt.attention(q, q, q, bt.AttentionLayout(layout, 16), block_size=16.0)
    torch.testing.assert_close(bt.attention(q, q, q, layout, block_size=np.int64(16)), want)


def test_autoregress_at_key_beyond_int64_is_refused():
    bst = bt.BlocksparseTransformer(np.ones((1, 2, 2), dtype=np.int32), block_size=16)
    x = torch.randn(1, 1, 2, 16, 16)
    with pytest.raises(ValueError, match="autoregress_at_key must be >= 0 and <= 9223372036854775807"):
        bst.masked_softmax(x, autoregress_at_key=2**64)
