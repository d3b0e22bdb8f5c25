"""In-place ops on the outputs of the PyTorch ops (``relu_``, ``+=``, ``nn.ReLU(inplace=True)``), as
PyTorch's own ``x @ W`` / ``F.layer_norm`` allow them: the values and gradients are those of the
out-of-place op; an op whose backward reads its output (softmax) raises PyTorch's version error."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import blocksparse.torch as bt  # noqa: E402
from blocksparse.testing import rel_error  # noqa: E402

LAYOUT = np.array([[1, 0, 1], [0, 1, 1]])


def _same_as_out_of_place(fn, *leaves):
    """``fn(*leaves).relu_()`` against ``fn(*leaves).relu()``: values and every leaf's gradient."""
    def run(inplace):
        ins = [t.detach().clone().requires_grad_() for t in leaves]
        y = fn(*ins)
        y = y.relu_() if inplace else y.relu()
        dy = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        return y.detach(), torch.autograd.grad(y, ins, dy)
    (y, grads), (y_ref, grads_ref) = run(True), run(False)
    assert torch.equal(y, y_ref)
    assert all(rel_error(g, r) < 1e-6 for g, r in zip(grads, grads_ref))


@pytest.mark.parametrize("axis", [1, 0])
def test_matmul(axis):
    m = bt.BlocksparseMatMul(LAYOUT, block_size=8, feature_axis=axis)
    x = torch.randn((5, 16) if axis else (16, 5))
    _same_as_out_of_place(lambda x, w: m(x, w), x, torch.randn(m.w_shape))


@pytest.mark.parametrize("impl", ["reference", "portable", "dense"])
def test_linear_without_bias(impl):
    layer = bt.BlocksparseLinear(LAYOUT, block_size=8, bias=False, impl=impl)
    _same_as_out_of_place(layer, torch.randn(5, 16))
    net = torch.nn.Sequential(layer, torch.nn.ReLU(inplace=True))
    net(torch.randn(5, 16, requires_grad=True)).sum().backward()


@pytest.mark.parametrize("shape, axis", [((6, 16), 1), ((16, 6), 0), ((2, 3, 16), -1)])
def test_layer_norm(shape, axis):
    _same_as_out_of_place(lambda x, g, b: bt.layer_norm(x, g, b, axis=axis), torch.randn(shape),
                          torch.rand(16) + 0.5, torch.randn(16))


def test_transformer_products():
    bst = bt.BlocksparseTransformer(np.array([[1, 0], [1, 1]]), block_size=8, heads=2)
    q, k, v = (torch.randn(1, 16, 8) for _ in range(3))
    _same_as_out_of_place(bst.query_key_op, q, k)
    probs = torch.softmax(torch.randn(1, 2, 3, 8, 8), -1)
    _same_as_out_of_place(bst.weight_value_op, probs, v)
    scores = bst.query_key_op(q.requires_grad_(), k)
    y = bst.masked_softmax(scores).mul_(2)          # its backward reads y: PyTorch's version error
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_create_graph_weight_gradient():
    """A weight gradient taken with ``create_graph=True`` (the updat's own node) takes ``mul_``."""
    m = bt.BlocksparseMatMul(LAYOUT, block_size=8)
    x, w = torch.randn(5, 16, requires_grad=True), torch.randn(m.w_shape, requires_grad=True)
    (dw,) = torch.autograd.grad(m(x, w).square().sum(), w, create_graph=True)
    want = dw.detach() * 0.5
    dw.mul_(0.5).sum().backward()
    assert torch.equal(dw.detach(), want) and x.grad is not None


@pytest.mark.interpreter
def test_implicit_convolution(monkeypatch):
    """The implicit-GEMM convolution (kernels through the interpreter) as ``F.conv2d`` takes ``relu_``."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    op = bt.BlocksparseConv([([0, 1], [0, 1]), ([2, 3], [1, 2])], TRS=(3, 3), DHW=(4, 4), path="implicit")
    _same_as_out_of_place(op, torch.randn(op.f_shape()), torch.randn(op.i_shape(2)))


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_make_fx_traces_them(mode):
    """``make_fx`` (a dispatch mode, not ``torch.compile``) records the ops' outputs as before."""
    from torch.fx.experimental.proxy_tensor import make_fx
    m = bt.BlocksparseMatMul(LAYOUT, block_size=8)
    ln = lambda x, g: bt.layer_norm(x, g, None, axis=1)  # noqa: E731
    cases = [(ln, (torch.randn(5, 24, requires_grad=True), torch.rand(24, requires_grad=True)))]
    if mode == "real":  # (the matmul's layout tables are real tensors: fake tracing refuses them)
        cases.append((lambda x, w: m(x, w), (torch.randn(5, 16), torch.randn(m.w_shape, requires_grad=True))))
    for fn, args in cases:
        traced = make_fx(fn, tracing_mode=mode)(*args)
        torch.testing.assert_close(traced(*args), fn(*args))
