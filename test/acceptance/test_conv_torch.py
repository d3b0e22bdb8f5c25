"""Acceptance: the PyTorch ``BlocksparseConv`` / ``BlocksparseDeconv`` / ``BlocksparseConvLayer`` as
documented, against float64 numpy (CPU: the dense reference path)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import conv_reference as ref  # noqa: E402
from conv_cases import CASES, IDS, make, reference  # noqa: E402

import blocksparse.torch as bst  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _f64(t):
    return t.detach().double().numpy()


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_values_and_gradients(case, dtype, rng):
    conv = make(case, bst)
    dt = DTYPES[dtype]
    with_eb = case.kwargs.get("edge_bias", False)
    x = torch.tensor(rng.standard_normal(conv.i_shape(case.N)), dtype=dt, requires_grad=True)
    blocks = [torch.tensor(rng.standard_normal(conv.f_shape(b)), dtype=dt, requires_grad=True)
              for b in range(conv.blocks)]
    eb = torch.tensor(rng.standard_normal(conv.edge_bias_shape()), dtype=dt, requires_grad=True)
    gy = torch.tensor(rng.standard_normal(conv.o_shape(case.N)), dtype=dt)
    y = conv(blocks, x, edge_bias=eb if with_eb else None)
    assert y.dtype == dt and list(y.shape) == conv.o_shape(case.N)
    y.backward(gy)
    want, dx, dF, deb = reference(case, conv, _f64(x), [_f64(b) for b in blocks], _f64(eb) if with_eb else None,
                                  _f64(gy))
    tol = tolerance(dtype)
    assert rel_error(y, want) < tol
    assert rel_error(x.grad, dx) < tol
    for b, d in zip(blocks, dF):
        assert rel_error(b.grad, d) < tol
    if with_eb and conv.edge_bias_shape()[1]:
        assert rel_error(eb.grad, deb) < tol


@pytest.mark.parametrize("form", ["stacked", "flat"])
def test_filter_forms(form, rng):
    case = CASES[0]
    conv = make(case, bst)
    F = torch.tensor(rng.standard_normal(conv.f_shape()), dtype=torch.float64)
    assert conv.f_shape() == [conv.blocks, *conv.f_shape(0)]
    x = torch.tensor(rng.standard_normal(conv.i_shape(2)), dtype=torch.float64)
    eb = torch.tensor(rng.standard_normal(conv.edge_bias_shape()), dtype=torch.float64)
    y = conv(F if form == "stacked" else F.reshape(-1), x, eb)  # positional edge_bias
    want, *_ = reference(case, conv, x.numpy(), list(F.numpy()), eb.numpy(), np.zeros(conv.o_shape(2)))
    assert rel_error(y, want) < 1e-12


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
def test_l2_normalize(transposed, rng):
    BCK = [([0, 2], [1, 3, 0]), ([1], [1]), ([3, 1], [2])]
    conv = (bst.BlocksparseDeconv if transposed else bst.BlocksparseConv)(BCK, (2, 3), (5, 5))
    blocks = [torch.tensor(rng.standard_normal(conv.f_shape(b)), requires_grad=True) for b in range(conv.blocks)]
    gain = torch.tensor(rng.uniform(0.5, 2.0, conv.K), requires_grad=True)
    out = conv.l2_normalize(blocks, gain=gain, dtype=torch.float64)
    want = ref.l2_normalize([_f64(b) for b in blocks], [k for _, k in BCK], _f64(gain), 1e-6, transposed)
    for o, w in zip(out, want):
        assert o.dtype == torch.float64 and rel_error(o, w) < 1e-12
    assert torch.autograd.gradcheck(lambda *a: conv.l2_normalize(list(a[:-1]), gain=a[-1], dtype=torch.float64),
                                    (*blocks, gain))
    flat = conv.l2_normalize(torch.cat([b.detach().reshape(-1) for b in blocks]).float())
    assert flat.dtype == torch.float32 and flat.shape == (conv.f_shape()[0],)
    assert rel_error(flat, np.concatenate([w.ravel() for w in want]) / np.concatenate(
        [np.broadcast_to(_f64(gain)[list(k)].reshape((1, -1) if transposed else (-1, 1)) [..., None, None],
                         w.shape).ravel() for (_, k), w in zip(BCK, want)])) < 1e-5


def test_layer_module(rng):
    BCK = [([0, 1], [0]), ([1, 2], [1])]
    layer = bst.BlocksparseConvLayer(BCK, TRS=(3,), DHW=(16,), edge_bias=True, dtype=torch.float64)
    assert list(layer.weight.shape) == layer.conv.f_shape()
    assert tuple(layer.edge_bias.shape) == layer.conv.edge_bias_shape()
    assert torch.all(layer.edge_bias == 0)
    with torch.no_grad():
        layer.edge_bias.normal_()
    x = torch.tensor(rng.standard_normal((4, 3, 16)))
    y = layer(x)
    assert y.shape == (4, 2, 16) and y.dtype == torch.float64
    assert torch.equal(y, layer.conv(layer.weight, x, layer.edge_bias))
    y.square().sum().backward()
    assert layer.weight.grad is not None and layer.edge_bias.grad is not None
    up = bst.BlocksparseConvLayer(BCK, TRS=(4,), DHW=(8,), strides=2, padding=1, transposed=True)
    assert up(torch.randn(2, 3, 8)).shape == (2, 2, 16)
    assert isinstance(up.conv, bst.BlocksparseDeconv)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
def test_compile_fullgraph(transposed, rng):
    case = CASES[6] if transposed else CASES[1]
    conv = make(case, bst)
    F = torch.tensor(rng.standard_normal(conv.f_shape()), dtype=torch.float32, requires_grad=True)
    eb = torch.tensor(rng.standard_normal(conv.edge_bias_shape()), dtype=torch.float32, requires_grad=True)
    x = torch.tensor(rng.standard_normal(conv.i_shape(2)), dtype=torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(lambda F, x, eb: conv(F, x, edge_bias=eb), fullgraph=True, backend="aot_eager")
    y = compiled(F, x, eb)
    y.sum().backward()
    assert rel_error(y, conv(F.detach().double(), x.double(), eb.detach().double())) < 1e-5
    assert F.grad is not None and eb.grad is not None


def test_autocast_bfloat16(rng):
    conv = make(CASES[0], bst)
    F = torch.tensor(rng.standard_normal(conv.f_shape()), dtype=torch.float32)
    x = torch.tensor(rng.standard_normal(conv.i_shape(2)), dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(F, x)
    assert y.dtype == torch.bfloat16
    assert rel_error(y, conv(F.double(), x.double())) < tolerance("bfloat16")


BAD_BCK = {
    "negative-channel": ([([0, -1], [0])], ValueError, r"BCK\[0\]"),
    "empty-block": ([([0], [0]), ([1], [])], ValueError, r"BCK\[1\].*empty"),
    "duplicate-block": ([([0, 1], [0]), ([1, 0], [0])], ValueError, r"blocks 0 and 1"),
    "overlapping-pair": ([([0, 1], [0, 1]), ([1, 2], [1])], ValueError, r"blocks 0 and 1"),
    "bool-channel": ([([True], [0])], TypeError, r"BCK\[0\]"),
    "nested-channels": ([([[0, 1]], [0])], TypeError, r"BCK\[0\]"),
}


@pytest.mark.parametrize("name", BAD_BCK)
def test_bad_bck(name):
    BCK, error, pattern = BAD_BCK[name]
    with pytest.raises(error, match=pattern):
        bst.BlocksparseConv(BCK, (3, 3), (8, 8))
    with pytest.raises(error, match=pattern):
        bst.BlocksparseConvLayer(BCK, (3, 3), (8, 8), transposed=True)


def test_bad_call_args(rng):
    conv = bst.BlocksparseConv([([0, 1], [0]), ([2], [1])], (3, 3), (6, 6), edge_bias=True)
    F = torch.randn(conv.f_shape())
    x = torch.randn(conv.i_shape(2))
    cases = [
        (lambda: conv(torch.zeros(5), x), ValueError, "F"),
        (lambda: conv(F, torch.zeros(2, 4, 6, 6)), ValueError, "I"),
        (lambda: conv(F, torch.zeros(3, 6, 6)), ValueError, "I"),
        (lambda: conv(F.double(), x), TypeError, "dtype"),
        (lambda: conv(F, torch.zeros(2, 3, 6, 6, dtype=torch.int32)), TypeError, "I"),
        (lambda: conv(F, x.numpy()), TypeError, "I"),
        (lambda: conv(F, x, edge_bias=torch.zeros(2, 3)), ValueError, "edge_bias"),
        (lambda: conv([F], x), ValueError, "F"),
        (lambda: conv.l2_normalize(F, gain=torch.ones(3)), ValueError, "gain"),
        (lambda: conv.l2_normalize(F, epsilon=0.0), ValueError, "epsilon"),
        (lambda: conv.l2_normalize(F, dtype=torch.int32), (TypeError, ValueError), "dtype"),
        (lambda: conv.f_shape(2), ValueError, "block"),
        (lambda: conv.f_shape("0"), TypeError, "block"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


@pytest.mark.parametrize("dtype, want", [(torch.float16, torch.float16), (np.float32, torch.float32),
                                         ("bfloat16", torch.bfloat16), ("float64", torch.float64)],
                         ids=["torch-dtype", "numpy-dtype", "name-bfloat16", "name-float64"])
def test_l2_normalize_dtype_forms(dtype, want, rng):
    conv = bst.BlocksparseConv([([0, 1], [0]), ([2], [1])], (3,), (6,))
    F = torch.tensor(rng.standard_normal(conv.f_shape()), dtype=torch.float32)
    out = conv.l2_normalize(F, dtype=dtype)
    assert out.dtype == want and out.shape == F.shape


@pytest.mark.parametrize("dtype", [torch.int32, np.int8, "int64", None, "foo"], ids=str)
def test_l2_normalize_rejects_non_float_dtype(dtype):
    conv = bst.BlocksparseConv([([0, 1], [0])], (3,), (6,))
    with pytest.raises(TypeError, match="dtype"):
        conv.l2_normalize(torch.randn(conv.f_shape()), dtype=dtype)


def test_documented_positional_and_keyword_forms(rng):
    BCK = [([0, 1], [0, 1]), ([2, 3], [2, 3])]
    by_position = bst.BlocksparseConv(BCK, (3, 3), (6, 6), None, (1, 1, 1), (1, 1, 1), "SAME", True)
    by_keyword = bst.BlocksparseConv(BCK=BCK, TRS=(3, 3), DHW=(6, 6), MPQ=None, strides=(1, 1, 1),
                                     dilates=(1, 1, 1), padding="SAME", edge_bias=True)
    assert bst.BlocksparseDeconv(BCK, (3, 3), (6, 6), (12, 12), 2, 1, "SAME", False).o_shape(1) == [1, 4, 12, 12]
    F = torch.tensor(rng.standard_normal(by_position.f_shape()))
    x = torch.tensor(rng.standard_normal(by_position.i_shape(N=2)))
    eb = torch.tensor(rng.standard_normal(by_position.edge_bias_shape()))
    assert torch.equal(by_position(F, x, eb), by_keyword(F=F, I=x, edge_bias=eb))
    gain = torch.tensor(rng.uniform(1, 2, 4))
    assert torch.equal(by_position.l2_normalize(F, gain, 1e-6, torch.float64),
                       by_keyword.l2_normalize(F=F, gain=gain, epsilon=1e-6, dtype=torch.float64))
