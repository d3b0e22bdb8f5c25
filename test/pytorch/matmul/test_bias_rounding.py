"""A 16-bit ``BlocksparseLinear``'s bias is added to the float32 sums before the one rounding to the
output dtype, on every implementation: a product that overflows float16 by itself but not with the
bias stays finite, and random outputs are float64's rounded once."""
import numpy as np
import pytest
import torch

from blocksparse.torch import BlocksparseLinear

IMPLS = ["reference", "portable", "dense", pytest.param("kernels", marks=pytest.mark.interpreter)]


@pytest.mark.parametrize("impl", IMPLS)
def test_bias_rescues_a_float16_overflow(impl, monkeypatch):
    if impl == "kernels":
        monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    layer = BlocksparseLinear(np.ones((1, 2), int), block_size=16, impl=impl).half()
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(-100.0)
    x = torch.full((16, 16), 4096.0, dtype=torch.float16)  # x @ W = 65536: inf in float16
    y = layer(x)
    assert torch.equal(y, torch.full((16, 32), 65440.0, dtype=torch.float16))  # 65436 rounded once


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("impl", ["reference", "portable", "dense"])
def test_random_outputs_round_once(rng, impl, dtype):
    """(Not the kernels through Triton's interpreter: its 16-bit products are not float32's.)"""
    mask = (rng.random((3, 4)) < 0.6).astype(int)
    mask[0] = 1
    layer = BlocksparseLinear(mask, block_size=16, impl=impl).to(dtype)
    with torch.no_grad():
        layer.bias.copy_(torch.from_numpy(rng.standard_normal(64) * 4))
    x = torch.from_numpy(rng.standard_normal((32, 48))).to(dtype)
    y = layer(x)
    w = torch.from_numpy(layer.layout.dense(layer.weight.detach().double().numpy()))
    want = (x.double() @ w + layer.bias.detach().double()).to(dtype)
    # float32 sums in another order than float64's can land across a rounding boundary, rarely
    assert (y != want).float().mean() < 0.01


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_bias_under_autocast_as_nn_linear(impl, monkeypatch):
    """Under autocast the float32 bias is taken in the products' dtype (as the kernels' epilogue and
    ``nn.Linear`` take it), on every implementation alike: x @ W = 256 and the bias 1 + 2**-8, which is 1
    in bfloat16: 257 rounds to 256 (the float32 bias would give 257.004, rounded to 258)."""
    if impl == "kernels":
        monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    layer = BlocksparseLinear(np.ones((1, 1), int), block_size=16, impl=impl)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(1.0 + 2.0**-8)
    x = torch.full((16, 16), 16.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and torch.equal(y, torch.full((16, 16), 256.0, dtype=torch.bfloat16))
    dense = torch.nn.Linear(16, 16)
    with torch.no_grad():
        dense.weight.fill_(1.0)
        dense.bias.fill_(1.0 + 2.0**-8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(y, dense(x), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens", [16, 64, 4096])  # few tokens: split reductions summed in float32
def test_gpu_kernels_round_once(rng, dtype, tokens):
    """The CUDA kernels (and the plans' split reductions) round float64's sums plus the bias once."""
    mask = (rng.random((64, 4)) < 0.5).astype(int)
    mask[:, 0] = 1
    layer = BlocksparseLinear(mask, block_size=32, impl="kernels").to("cuda", dtype)
    with torch.no_grad():
        layer.bias.copy_(torch.from_numpy(rng.standard_normal(128) * 4))
    x = torch.from_numpy(rng.standard_normal((tokens, 2048))).to("cuda", dtype)
    w = torch.from_numpy(layer.layout.dense(layer.weight.detach().double().cpu().numpy())).cuda()
    want = (x.double() @ w + layer.bias.detach().double()).to(dtype)
    for _ in range(2):  # the second call planned by the first (split products add in any order: not bitwise)
        assert (layer(x) != want).float().mean() < 0.01


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [16, 4096])
def test_gpu_float32_bias_under_autocast_as_nn_linear(rng, tokens):
    mask = (rng.random((16, 4)) < 0.5).astype(int)
    mask[:, 0] = 1
    layer = BlocksparseLinear(mask, block_size=32, impl="kernels").cuda()
    with torch.no_grad():
        layer.bias.copy_(torch.from_numpy(rng.standard_normal(128) * 4))
    x = torch.from_numpy(rng.standard_normal((tokens, 512))).float().cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    w = torch.from_numpy(layer.layout.dense(layer.weight.detach().double().cpu().numpy())).cuda()
    low = [t.to(torch.bfloat16).double() for t in (x, w, layer.bias.detach())]
    want = (low[0] @ low[1] + low[2]).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and (y != want).float().mean() < 0.01


def test_compiled_equals_eager_under_autocast(rng):
    """The custom op takes the bias too: compiled and eager calls round the same sums once."""
    mask = (rng.random((4, 3)) < 0.6).astype(int)
    mask[0] = 1
    layer = BlocksparseLinear(mask, block_size=16, impl="kernels")
    with torch.no_grad():
        layer.bias.copy_(torch.from_numpy(rng.standard_normal(48) * 4))
    x = torch.from_numpy(rng.standard_normal((32, 64))).float().requires_grad_()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    outs = []
    for fn in (layer, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(x)
        grads = torch.autograd.grad(y.float().square().sum(), (x, layer.weight, layer.bias))
        outs.append((y, *grads))
    for eager, comp in zip(*outs):
        assert comp.dtype == eager.dtype and torch.equal(comp, eager)
