"""Under CPU autocast the reference paths keep their float32 sums: a call with float32 inputs inside
``torch.autocast`` equals the same call on inputs cast to the autocast dtype outside it (autocast
used to round the reference's float32 matmuls and einsums to 16 bits on the way), and both stay
within one rounding of float64."""
import copy

import numpy as np
import pytest
import torch

from blocksparse.layouts import attention as layouts
from blocksparse.torch import BlocksparseLinear, BlocksparseTransformer, attention

LOW = [torch.bfloat16, torch.float16]


def _in_autocast(dtype, fn, *args):
    with torch.autocast("cpu", dtype=dtype):
        return fn(*args)


@pytest.mark.parametrize("dtype", LOW)
def test_linear_reference_path(rng, dtype):
    mask = (rng.random((8, 4)) < 0.7).astype(int)
    mask[:, 0] = 1
    layer = BlocksparseLinear(mask, block_size=32, impl="reference")
    x = torch.from_numpy(rng.standard_normal((48, 256))).float().requires_grad_()
    y = _in_autocast(dtype, layer, x)
    low = copy.deepcopy(layer).to(dtype)
    x_low = x.detach().to(dtype).requires_grad_()
    want = low(x_low)
    assert y.dtype == dtype and torch.equal(y, want)
    dy = torch.from_numpy(rng.standard_normal(y.shape)).to(dtype)
    dx, dw = torch.autograd.grad(y, (x, layer.weight), dy)
    dx_low, dw_low = torch.autograd.grad(want, (x_low, low.weight), dy)
    torch.testing.assert_close(dx, dx_low.float(), rtol=0, atol=0)
    torch.testing.assert_close(dw, dw_low.float(), rtol=0, atol=0)
    w = torch.from_numpy(layer.layout.dense(layer.weight.detach().double().numpy())).to(dtype).double()
    exact = x.detach().to(dtype).double() @ w + layer.bias.detach().to(dtype).double()
    assert (y.double() - exact).abs().max() <= 2 * torch.finfo(dtype).eps * exact.abs().max()


@pytest.mark.parametrize("dtype", LOW)
def test_attention_reference_path(rng, dtype):
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 128, 32))).float() for _ in range(3))
    layout = layouts.causal(4)
    call = lambda q, k, v: attention(q, k, v, layout, block_size=32, causal=True)  # noqa: E731
    o = _in_autocast(dtype, call, q, k, v)
    assert o.dtype == dtype and torch.equal(o, call(*(t.to(dtype) for t in (q, k, v))))


@pytest.mark.parametrize("dtype", LOW)
def test_transformer_reference_products(rng, dtype):
    bst = BlocksparseTransformer(np.tril(np.ones((4, 4), int)), block_size=32, heads=2)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 128, 64))).float() for _ in range(3))
    scores = _in_autocast(dtype, bst.query_key_op, q, k)
    assert scores.dtype == dtype and torch.equal(scores, bst.query_key_op(q.to(dtype), k.to(dtype)))
    w = bst.masked_softmax(scores, scale=0.125)
    out = _in_autocast(dtype, bst.weight_value_op, w, v)
    assert out.dtype == dtype and torch.equal(out, bst.weight_value_op(w, v.to(dtype)))
