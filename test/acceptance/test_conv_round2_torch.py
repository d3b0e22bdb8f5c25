"""Acceptance, second round: the PyTorch ``BlocksparseConv`` / ``BlocksparseDeconv`` /
``BlocksparseConvLayer`` as a demanding user calls them -- unused channels, 1x1 filters, long
strides, the ``path`` choices that run on the CPU, empty batches, strided and channels-last inputs,
``no_grad`` / ``inference_mode``, the meta device, copies, ``state_dict``, ``.to(dtype)``, second
derivatives and bad shape-helper arguments -- against float64 numpy."""
import copy
import io
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conv_cases import (BAD_MINIBATCH, CASES, MORE_CASES, MORE_IDS, Case, assert_results,  # noqa: E402
                        check_bad_minibatch, make, reference)

import blocksparse.torch as bst  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402


def _f64(t):
    return t.detach().double().numpy()


def _inputs(case, conv, rng, dtype=torch.float64, N=None):
    N = case.N if N is None else N
    x = torch.tensor(rng.standard_normal(conv.i_shape(N)), dtype=dtype, requires_grad=True)
    blocks = [torch.tensor(rng.standard_normal(conv.f_shape(b)), dtype=dtype, requires_grad=True)
              for b in range(conv.blocks)]
    eb = torch.tensor(rng.standard_normal(conv.edge_bias_shape()), dtype=dtype, requires_grad=True)
    gy = torch.tensor(rng.standard_normal(conv.o_shape(N)), dtype=dtype)
    return x, blocks, eb, gy


def _check(case, conv, x, blocks, eb, gy, y, tol):
    with_eb = case.kwargs.get("edge_bias", False)
    want = reference(case, conv, _f64(x), [_f64(b) for b in blocks], _f64(eb) if with_eb else None, _f64(gy))
    got = (y.detach(), x.grad, [b.grad for b in blocks], eb.grad)
    assert_results(case, conv, got, want, tol, rel_error)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("case", MORE_CASES, ids=MORE_IDS)
def test_more_shapes_values_and_gradients(case, dtype, rng):
    conv = make(case, bst)
    dt = getattr(torch, dtype)
    x, blocks, eb, gy = _inputs(case, conv, rng, dt)
    y = conv(blocks, x, eb if case.kwargs.get("edge_bias") else None)
    assert y.dtype == dt
    y.backward(gy)
    _check(case, conv, x, blocks, eb, gy, y, tolerance(dtype))


def test_unused_channels():
    """An input channel no block lists does not matter; an output channel none lists is zero."""
    case = MORE_CASES[0]
    conv = make(case, bst)
    assert (conv.C, conv.K) == (4, 4)
    x = torch.randn(conv.i_shape(2), dtype=torch.float64)
    F = torch.randn(conv.f_shape(), dtype=torch.float64)
    y = conv(F, x)
    x2 = x.clone()
    x2[:, 1:3] = torch.randn(2, 2, 4, 5, dtype=torch.float64)
    assert torch.equal(conv(F, x2), y) and not y[:, 1].any()


@pytest.mark.parametrize("path", ["auto", "dense", "grouped", "implicit"])
def test_paths_on_cpu(path, rng):
    case = CASES[1]
    conv = bst.BlocksparseConv([(list(c), list(k)) for c, k in case.BCK], case.TRS, case.DHW, path=path,
                               **case.kwargs)
    assert conv.path == path
    x, blocks, eb, gy = _inputs(case, conv, rng)
    y = conv(blocks, x, eb)
    y.backward(gy)
    _check(case, conv, x, blocks, eb, gy, y, 1e-10)


def test_matmul_path_on_cpu(rng):
    BCK = [(range(0, 16), range(0, 16)), (range(16, 32), range(0, 16)), (range(16, 32), range(16, 32))]
    conv = bst.BlocksparseConv(BCK, (1, 1), (3, 2), path="matmul")
    assert conv.path == "matmul"
    F = torch.tensor(rng.standard_normal(conv.f_shape()), requires_grad=True)
    x = torch.tensor(rng.standard_normal(conv.i_shape(2)))
    W = np.zeros((32, 32))
    for (cs, ks), f in zip(BCK, _f64(F)):
        W[np.ix_(list(ks), list(cs))] += f[:, :, 0, 0]
    assert rel_error(conv(F, x), np.einsum("kc,nchw->nkhw", W, x.numpy())) < 1e-12


@pytest.mark.parametrize("cls, path", [("BlocksparseDeconv", "implicit"), ("BlocksparseConv", "matmul"),
                                       ("BlocksparseConv", "Dense"), ("BlocksparseConv", None)],
                         ids=["implicit-deconv", "matmul-3x3", "capitalised", "none"])
def test_bad_paths(cls, path):
    with pytest.raises(ValueError, match="path"):
        getattr(bst, cls)([([0, 1], [0])], (3, 3), (5, 5), path=path)
    with pytest.raises(ValueError, match="path"):
        bst.BlocksparseConvLayer([([0, 1], [0])], (3, 3), (5, 5), transposed=cls == "BlocksparseDeconv", path=path)


@pytest.mark.parametrize("case", [CASES[0], CASES[6]], ids=[CASES[0].id, CASES[6].id])
def test_empty_batch(case, rng):
    conv = make(case, bst)
    x, blocks, eb, _ = _inputs(case, conv, rng, N=0)
    y = conv(blocks, x, eb)
    assert list(y.shape) == conv.o_shape(0)
    y.sum().backward()
    assert x.grad.shape == x.shape and not blocks[0].grad.any() and not eb.grad.any()


@pytest.mark.parametrize("layout", ["channels-last", "permuted", "sliced"])
@pytest.mark.parametrize("case", [CASES[1], CASES[6]], ids=[CASES[1].id, CASES[6].id])
def test_strided_inputs(case, layout, rng):
    conv = make(case, bst)
    _, blocks, eb, gy = _inputs(case, conv, rng)
    N, C, H, W = conv.i_shape(case.N)
    if layout == "channels-last":
        x = torch.tensor(rng.standard_normal((N, C, H, W))).to(memory_format=torch.channels_last)
    elif layout == "permuted":
        x = torch.tensor(rng.standard_normal((N, H, W, C))).permute(0, 3, 1, 2)
    else:
        x = torch.tensor(rng.standard_normal((N, 2 * C, H, W + 3)))[:, ::2, :, 1:W + 1]
    x.requires_grad_()
    assert not x.is_contiguous()
    y = conv(blocks, x, eb)
    y.backward(gy)
    _check(case, conv, x, blocks, eb, gy, y, 1e-10)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_without_autograd(mode, rng):
    case = CASES[0]
    conv = make(case, bst)
    x, blocks, eb, gy = _inputs(case, conv, rng)
    with getattr(torch, mode)():
        y = conv(blocks, x, eb)
    assert not y.requires_grad
    want, *_ = reference(case, conv, _f64(x), [_f64(b) for b in blocks], _f64(eb), _f64(gy))
    assert rel_error(y, want) < 1e-12


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
def test_meta_device(transposed):
    cls = bst.BlocksparseDeconv if transposed else bst.BlocksparseConv
    conv = cls([([0, 1], [0]), ([1, 2], [1, 2])], (3, 3), (5, 5), strides=2, edge_bias=True)
    meta = lambda shape: torch.empty(shape, device="meta", dtype=torch.bfloat16)  # noqa: E731
    y = conv(meta(conv.f_shape()), meta(conv.i_shape(2)), meta(conv.edge_bias_shape()))
    assert (y.device.type, list(y.shape), y.dtype) == ("meta", conv.o_shape(2), torch.bfloat16)
    assert conv.l2_normalize(meta(conv.f_shape())).device.type == "meta"
    layer = bst.BlocksparseConvLayer([([0, 1], [0]), ([1, 2], [1, 2])], (3, 3), (5, 5), strides=2,
                                     edge_bias=True, transposed=transposed, device="meta")
    assert layer.weight.device.type == "meta"
    assert list(layer(torch.empty(conv.i_shape(2), device="meta")).shape) == conv.o_shape(2)


LAYER = Case("layer-1d-unequal-blocks", [([0, 2], [1]), ([1], [0, 1])], (3,), (6,), {"strides": 2, "edge_bias": True})


def _layer(transposed=False, **kwargs):
    return bst.BlocksparseConvLayer(LAYER.BCK, LAYER.TRS, LAYER.DHW, transposed=transposed, **LAYER.kwargs, **kwargs)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
def test_layer_state_dict_round_trip(transposed, rng):
    layer = _layer(transposed, dtype=torch.float64)
    with torch.no_grad():
        layer.edge_bias.normal_()
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    other = _layer(transposed, dtype=torch.float64)
    assert sorted(other.state_dict()) == ["edge_bias", "weight"]
    other.load_state_dict(torch.load(buffer))
    x = torch.tensor(rng.standard_normal(layer.conv.i_shape(3)))
    assert torch.equal(other(x), layer(x))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_layer_and_op_copies(how, rng):
    layer = _layer(dtype=torch.float64)
    clone = copy.deepcopy if how == "deepcopy" else lambda o: pickle.loads(pickle.dumps(o))
    other = clone(layer)
    x = torch.tensor(rng.standard_normal(layer.conv.i_shape(2)))
    assert torch.equal(other(x), layer(x))
    assert other.weight is not layer.weight and torch.equal(other.weight, layer.weight)
    op = clone(layer.conv)
    assert torch.equal(op(layer.weight, x, layer.edge_bias), layer(x))


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_layer_to_dtype(dtype, rng):
    layer = _layer()
    with torch.no_grad():
        layer.edge_bias.normal_()
    layer.to(getattr(torch, dtype))
    assert layer.weight.dtype == layer.edge_bias.dtype == getattr(torch, dtype)
    x = torch.tensor(rng.standard_normal(layer.conv.i_shape(2)), dtype=getattr(torch, dtype))
    y = layer(x)
    assert y.dtype == getattr(torch, dtype)
    shapes = [layer.conv.f_shape(b) for b in range(layer.conv.blocks)]
    flat = np.split(_f64(layer.weight), np.cumsum([np.prod(shape) for shape in shapes])[:-1])
    blocks = [f.reshape(shape) for f, shape in zip(flat, shapes)]
    want, *_ = reference(LAYER, layer.conv, _f64(x), blocks, _f64(layer.edge_bias), np.zeros(layer.conv.o_shape(2)))
    assert rel_error(y, want) < tolerance(dtype)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
def test_second_derivatives(transposed, rng):
    cls = bst.BlocksparseDeconv if transposed else bst.BlocksparseConv
    conv = cls([([0, 2], [1]), ([1], [0, 1])], (3,), (3,), strides=2, edge_bias=True)
    assert conv.edge_bias_shape()[1] > 0
    x = torch.tensor(rng.standard_normal(conv.i_shape(1)), requires_grad=True)
    F = torch.tensor(rng.standard_normal(conv.f_shape()), requires_grad=True)
    eb = torch.tensor(rng.standard_normal(conv.edge_bias_shape()), requires_grad=True)
    assert torch.autograd.gradgradcheck(conv, (F, x, eb))


@BAD_MINIBATCH
def test_shape_helpers_reject_bad_minibatch(N, error):
    check_bad_minibatch(bst, N, error)
    conv = bst.BlocksparseDeconv([([0, 1], [0])], (3,), (5,), strides=2)
    assert conv.i_shape(None) == [None, 2, 5] and conv.o_shape(0) == [0, 1, 10]
    assert conv.i_shape(np.int64(3))[0] == 3 and conv.i_shape(torch.tensor(3))[0] == 3


def test_autocast_leaves_float64_alone(rng):
    case = CASES[0]
    conv = make(case, bst)
    x, blocks, eb, gy = _inputs(case, conv, rng)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(blocks, x, eb)
    assert y.dtype == torch.float64
    want, *_ = reference(case, conv, _f64(x), [_f64(b) for b in blocks], _f64(eb), _f64(gy))
    assert rel_error(y, want) < 1e-12


def test_l2_normalize_epsilon_forms(rng):
    """``epsilon`` may be any real number > 0 (a numpy scalar too); it bounds the squared norm."""
    conv = bst.BlocksparseConv([([0, 1], [0]), ([2], [1])], (3,), (6,))
    F = torch.tensor(rng.standard_normal(conv.f_shape()), dtype=torch.float64)
    big = 1e3   # above every block row's squared norm: the filter is divided by sqrt(big)
    assert float(F.square().sum()) < big
    out = conv.l2_normalize(F, epsilon=np.float32(big), dtype=torch.float64)
    assert rel_error(out, F.numpy() / np.sqrt(big)) < 1e-12
    for bad, error in ((float("inf"), ValueError), (float("nan"), ValueError), (-1e-6, ValueError),
                       ("1e-6", TypeError), (None, TypeError)):
        with pytest.raises(error, match="epsilon"):
            conv.l2_normalize(F, epsilon=bad)
