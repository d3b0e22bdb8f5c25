"""The native implicit-GEMM convolution (``blocksparse/torch/csrc/conv.cpp``) on the CPU, with the
stand-in runtime of ``stand_in.py`` for the kernel library's launches (registered by hand): which
operand reaches which argument word (the input and the output gradient made channels-last and
16-byte aligned, the packed filters gathered), the outputs' shapes, channels-last strides and zero
fill (NaN-poisoned allocations), that the backward launches the transposed record only where the
input's gradient is asked for, and that its filter gradient -- cuDNN's ``convolution_backward`` on
the CPU, in the op's geometry -- matches the float64 reference of ``blocksparse.testing.conv`` on
random data, for every geometry of its cases.  Then the Python glue: calls of a registered shape
take the C++ node, and unaligned inputs, ``BLOCKSPARSE_TORCH_NATIVE=off``, CPU calls and launches
the kernel library does not serve take the Python path.  The kernels themselves are checked on the
GPU (``test/pytorch/conv/test_torch_conv_implicit.py``)."""
import ctypes
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from blocksparse.testing import rel_error  # noqa: E402
from blocksparse.testing.conv import CASES, case_of, conv_products, make_op, random_inputs  # noqa: E402
from blocksparse.torch import BlocksparseConv, _native  # noqa: E402
from blocksparse.torch._conv import implicit as glue  # noqa: E402
from stand_in import expected, record  # noqa: E402


class PoisonedAllocations(TorchDispatchMode):
    """Every floating tensor an ``empty`` op makes -- in C++ too -- starts as NaN."""

    EMPTY = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
             torch.ops.aten.empty_like.default, torch.ops.aten.new_empty.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.EMPTY and out.is_floating_point():
            out.fill_(float("nan"))
        return out


def _count(lib, name):
    return ctypes.c_int.in_dll(lib, name).value


def _launched(lib, since):
    """The specs launched since the count ``since``."""
    specs = (ctypes.c_int * 64).in_dll(lib, "launches")
    return [specs[i % 64] for i in range(since, _count(lib, "n_launches"))]


class Setup:
    """An op, its CPU tables, float32 inputs and a conv record whose launches are the stand-in's:
    spec 2 (the output, zero-filled first and added to where ``zero``) and spec 3 (the input
    gradient).  ``Setup.of(lib, rng, case)``: an op of a test case (no edge bias)."""

    def __init__(self, lib, op, ref, inputs, zero=False, dense_dx=False):
        self.op, self.ref, spec = op, ref, op.spec
        self.t = op._tables.on(torch.device("cpu"))
        F, x, dy = inputs[:3]
        self.F, self.x, self.dy = torch.from_numpy(F).reshape(-1), torch.from_numpy(x), torch.from_numpy(dy)
        self.out, self.image = tuple(self.dy.shape[2:]), tuple(self.x.shape[2:])
        n = self.x.shape[0]
        y_last, dx_last = (n, *self.out, spec.blocks.K), (n, *self.image, spec.blocks.C)
        fprop = record(lib, 2, y_last, math.prod(y_last), self.x.numel(), zero=zero)
        bprop = -1 if dense_dx else record(lib, 3, dx_last, math.prod(dx_last), self.dy.numel())
        self.conv = glue.register_conv(spec, fprop, bprop, self.x.shape, torch.float32)

    @classmethod
    def of(cls, lib, rng, case, zero=False, dense_dx=False):
        op, ref = make_op(BlocksparseConv, rng, case, layout="random", edge_bias=False)
        return cls(lib, op, ref, random_inputs(rng, op), zero, dense_dx)

    def __call__(self, x, flat):
        t = self.t
        return _native.conv(x, flat, t.implicit_weight, t.implicit_grad_weight, t.dense, self.conv)

    def stand_in_y(self, x, flat):
        """What the stand-in writes for the output: ``x`` read channels-last, the forward's packed filter."""
        return self._last(x, self._packed(flat, self.t.implicit_weight), 2, self.out, self.op.spec.blocks.K)

    def stand_in_dx(self, dy, flat):
        return self._last(dy, self._packed(flat, self.t.implicit_grad_weight), 3, self.image, self.op.spec.blocks.C)

    @staticmethod
    def _packed(F, index):
        """The packed filter of ``F`` (flat, or a layout of equal blocks' ``(blocks, K, C, *TRS)``)."""
        return F.detach().reshape(-1)[index.long()]

    @staticmethod
    def _last(a, w, spec, size, written):
        return expected(a.detach().movedim(1, -1), w, spec, (a.shape[0], *size, written)).movedim(-1, 1)

    def reference(self, x, flat, dy):
        """float64 ``(y, dx, dF)`` of the op itself."""
        as64 = lambda t: t.detach().double().numpy()  # noqa: E731
        return conv_products(self.ref, as64(flat), as64(x), as64(dy))[:3]


def _channels_last(y):
    return y.movedim(1, -1).is_contiguous()


@pytest.mark.parametrize("case", list(CASES))
def test_forward_backward_and_the_filter_gradient(native, rng, case):
    s = Setup.of(native, rng, case)
    x, flat = s.x.clone().requires_grad_(), s.F.clone().requires_grad_()
    misaligned, since = _count(native, "misaligned"), _count(native, "n_launches")
    with PoisonedAllocations():
        y = s(x, flat)
    assert type(y.grad_fn).__name__ == "CppFunction"  # a C++ autograd::Function node
    assert y.shape == s.dy.shape and _channels_last(y)
    torch.testing.assert_close(y, s.stand_in_y(x, flat), rtol=0, atol=0)
    # a channels-first output gradient, read channels-last by the transposed launch
    with PoisonedAllocations():
        dx, dflat = torch.autograd.grad(y, (x, flat), s.dy)
    assert _launched(native, since) == [2, 3] and _count(native, "misaligned") == misaligned
    assert dx.shape == x.shape and _channels_last(dx)
    torch.testing.assert_close(dx, s.stand_in_dx(s.dy, flat), rtol=0, atol=0)
    _, _, want = s.reference(x, flat, s.dy)
    assert dflat.shape == flat.shape and rel_error(dflat, want) < 1e-5


@pytest.mark.parametrize("case", list(CASES))
def test_the_dense_input_gradient(native, rng, case):
    """A record without a transposed launch (strided layers): the input gradient comes from the
    filter gradient's ``convolution_backward`` with the dense filter built, cropped to the input --
    against float64, for every geometry; asked for alone, too."""
    s = Setup.of(native, rng, case, dense_dx=True)
    x, flat = s.x.clone().requires_grad_(), s.F.clone().requires_grad_()
    since = _count(native, "n_launches")
    with PoisonedAllocations():
        dx, dflat = torch.autograd.grad(s(x, flat), (x, flat), s.dy)
    assert _launched(native, since) == [2]
    _, dx_want, dflat_want = s.reference(x, flat, s.dy)
    assert dx.shape == x.shape and rel_error(dx, dx_want) < 1e-5
    assert dflat.shape == flat.shape and rel_error(dflat, dflat_want) < 1e-5
    (dx_alone,) = torch.autograd.grad(s(x, s.F), (x,), s.dy)
    torch.testing.assert_close(dx_alone, dx)


def test_only_the_gradients_asked_for(native, rng):
    s = Setup.of(native, rng, "2d-explicit-asymmetric")
    flat = s.F.clone().requires_grad_()
    y = s(s.x, flat)  # x needs no gradient: no transposed launch
    since = _count(native, "n_launches")
    (dflat,) = torch.autograd.grad(y, (flat,), s.dy)
    assert _launched(native, since) == []
    assert rel_error(dflat, s.reference(s.x, flat, s.dy)[2]) < 1e-5
    x = s.x.clone().requires_grad_()
    y = s(x, s.F)  # the filter needs none: no convolution_backward (a wrong one would not show; its cost would)
    since = _count(native, "n_launches")
    (dx,) = torch.autograd.grad(y, (x,), s.dy)
    assert _launched(native, since) == [3]
    torch.testing.assert_close(dx, s.stand_in_dx(s.dy, s.F), rtol=0, atol=0)


def test_the_output_takes_in_place_ops(native, rng):
    """``relu_`` on the node's output (channels-last memory, not a view of it): as on cuDNN's, the
    gradients are those of the out-of-place ``relu``."""
    s = Setup.of(native, rng, "2d-explicit-asymmetric")
    grads = []
    for inplace in (True, False):
        x, flat = s.x.clone().requires_grad_(), s.F.clone().requires_grad_()
        y = s(x, flat)
        y = y.relu_() if inplace else y.relu()
        assert _channels_last(y)
        grads.append(torch.autograd.grad(y, (x, flat), s.dy))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_backward_is_once_differentiable(native, rng):
    """As the Python path's ``@once_differentiable``: gradients with ``create_graph`` hold a node that
    fails when a second backward reaches it (the launches have no derivative); without, no graph."""
    s = Setup.of(native, rng, "2d-valid-stride-dilate")
    x, flat = s.x.clone().requires_grad_(), s.F.clone().requires_grad_()
    dx, dflat = torch.autograd.grad(s(x, flat), (x, flat), s.dy, create_graph=True)
    assert rel_error(dflat, s.reference(x, flat, s.dy)[2]) < 1e-5
    torch.testing.assert_close(dx, s.stand_in_dx(s.dy, flat), rtol=0, atol=0)
    for g in (dx, dflat):
        with pytest.raises(RuntimeError, match="once differentiable"):
            g.sum().backward()
    dx, dflat = torch.autograd.grad(s(x, flat), (x, flat), s.dy)
    assert not dx.requires_grad and not dflat.requires_grad


def test_an_output_the_plan_does_not_cover_is_zero_filled(native, rng):
    """``zero``: the output zero-filled by the runtime's fill (float32 words), then added to: a
    missed fill leaves the NaN of the poisoned allocation."""
    s = Setup.of(native, rng, "1d-same-s2", zero=True)
    memsets = _count(native, "n_memsets")
    with PoisonedAllocations():
        y = s(s.x, s.F)
    assert _count(native, "n_memsets") == memsets + 1
    assert (ctypes.c_uint64 * 64).in_dll(native, "memset_counts")[memsets % 64] == y.numel()
    torch.testing.assert_close(y, s.stand_in_y(s.x, s.F), rtol=0, atol=0)


def test_strided_unaligned_and_channels_last_operands(native, rng):
    """A channels-last input, an expanded (stride 0) output gradient and one that starts 4 bytes into
    its storage: the launches get their values channels-last, on 16-byte boundaries; the filter
    gradient sees them as they are."""
    s = Setup.of(native, rng, "2d-same-stride-dilate")
    x = s.x.to(memory_format=torch.channels_last).requires_grad_()
    flat = s.F.clone().requires_grad_()
    torch.testing.assert_close(s(x, flat), s.stand_in_y(s.x, flat), rtol=0, atol=0)
    misaligned = _count(native, "misaligned")
    expanded = torch.from_numpy(rng.standard_normal(s.dy.shape[1:]).astype(np.float32)).expand(s.dy.shape)
    storage = torch.from_numpy(rng.standard_normal(s.dy.numel() + 1).astype(np.float32))
    shifted = storage[1:].view(s.dy.shape)
    assert shifted.data_ptr() % 16
    for dy in (expanded, shifted):
        dx, dflat = torch.autograd.grad(s(x, flat), (x, flat), dy)
        torch.testing.assert_close(dx, s.stand_in_dx(dy, flat), rtol=0, atol=0)
        assert rel_error(dflat, s.reference(x, flat, dy)[2]) < 1e-5
    assert _count(native, "misaligned") == misaligned


def test_errors_name_what_failed(native, rng):
    s = Setup.of(native, rng, "1d-same-s2")
    with pytest.raises(RuntimeError, match="was made for inputs of shape"):
        s(s.x[:1], s.F)
    with pytest.raises(RuntimeError, match="was made for inputs of shape"):
        s(s.x.double(), s.F.double())
    with pytest.raises(RuntimeError, match="unknown conv record"):
        _native.conv(s.x, s.F, s.t.implicit_weight, s.t.implicit_grad_weight, s.t.dense, 10**6)
    with pytest.raises(RuntimeError, match="must have 1 entries"):
        _native.add_conv(0, 0, (2, 3, 9), torch.float32, (2, 1), (1,), (1,), (), (), (4, 3, 3))
    with pytest.raises(RuntimeError, match="pairs"):
        _native.add_conv(0, 0, (2, 3, 9), torch.float32, (2,), (1,), (1,), (0, 1, 2), (), (4, 3, 3))


# --------------------------------------------------------------------------------- the Python glue
@pytest.fixture
def interpreter(monkeypatch):
    """The kernels serve CPU tensors (Triton's interpreter): the implicit path runs on the CPU."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    monkeypatch.delenv("BLOCKSPARSE_TORCH_NATIVE", raising=False)


@pytest.mark.interpreter
@pytest.mark.parametrize("layout", ["random", "uniform"])
def test_a_registered_call_shape_takes_the_cpp_node_and_others_the_python_path(native, rng, interpreter,
                                                                               monkeypatch, layout):
    """The public call, its conv record entered by hand (on a GPU, the first call of a shape makes
    it): the C++ node serves (the stand-in's output, the edge bias added in Python, all three
    gradients); an unaligned input and ``BLOCKSPARSE_TORCH_NATIVE=off`` take the Python path (the
    interpreted kernel's values, against float64).  Equal blocks take a ``(blocks, K, C, *TRS)`` filter."""
    op, ref = make_op(BlocksparseConv, rng, "2d-same-even-filter", layout=layout, path="implicit")
    inputs = random_inputs(rng, op)
    s = Setup(native, op, ref, inputs)
    F, x, dy, eb = (torch.from_numpy(a) for a in inputs)
    s.t.implicit_native[(glue._precision(x), torch.float32, x.shape)] = s.conv
    Ft, xt, et = (a.clone().requires_grad_() for a in (F, x, eb))
    y = op(Ft, xt, et)
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "CppFunction"  # under the edge bias's add
    assert glue.native_path(s.t) == "native"
    y64, _, dF64, deb64 = conv_products(ref, F.numpy(), x.numpy(), dy.numpy(), eb.numpy())
    edge = y64 - conv_products(ref, F.numpy(), x.numpy(), dy.numpy())[0]  # the edge bias's share, float64
    assert rel_error(y - s.stand_in_y(x, F), edge) < 1e-5
    dx, dF, deb = torch.autograd.grad(y, (xt, Ft, et), dy)
    torch.testing.assert_close(dx, s.stand_in_dx(dy, F), rtol=0, atol=0)
    assert rel_error(dF, dF64) < 1e-5 and rel_error(deb, deb64) < 1e-5

    storage = torch.from_numpy(rng.standard_normal(x.numel() + 1).astype(np.float32))
    unaligned = storage[1:].view(x.shape)
    assert unaligned.data_ptr() % 16
    for name, xi, setting in (("unaligned", unaligned, "auto"), ("native off", x, "off")):
        monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", setting)
        xi = xi.detach().requires_grad_()
        since = _count(native, "n_launches")
        y = op(Ft, xi, et)
        assert "ImplicitConvFunction" in type(y.grad_fn.next_functions[0][0]).__name__, name
        got = (y, *torch.autograd.grad(y, (xi, Ft, et), dy))
        assert _launched(native, since) == [], name
        for g, w in zip(got, conv_products(ref, F.numpy(), xi.detach().numpy(), dy.numpy(), eb.numpy())):
            assert rel_error(g, w) < 1e-5, name


def test_the_native_path_reads_record_ids_not_truth(rng):
    """Record ids count from 0: an op whose one call shape holds id 0 is on the native path; a shape
    the op could not register (False) puts it on the Python path."""
    op, _ = make_op(BlocksparseConv, rng, "1d-same-s2", layout="random", edge_bias=False)
    t = op._tables.on(torch.device("cpu"))
    t.implicit_native[("ieee", torch.float32, (2, 7, 8))] = 0
    assert glue.native_path(t) == "native"
    t.implicit_native[("ieee", torch.float32, (4, 7, 8))] = False
    assert glue.native_path(t) == "python"


def test_cpu_calls_register_nothing_and_build_nothing(rng, monkeypatch):
    """Without an entry, a CPU call takes the Python path: nothing is registered, no op is built."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")  # the dense path: the implicit one is asked directly
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setattr(_native, "build", lambda cache=None: pytest.fail("built for a CPU call"))
    op, _ = make_op(BlocksparseConv, rng, "1d-same-s2", layout="random", edge_bias=False)
    t = op._tables.on(torch.device("cpu"))
    x = torch.randn(op.i_shape(2))
    assert glue._native_conv(x, op.spec, t, "ieee") is None
    assert t.implicit_native == {} and glue.native_path(t) is None


@pytest.mark.parametrize("served", ["forward only", "input gradient only"])
def test_a_launch_not_from_the_kernel_library_keeps_the_python_path(native, rng, monkeypatch, served):
    """A call shape registers only where both launches are prepared from the library (float32, for
    one, has no compiled spec: ``test/ops/conv/test_conv_aot.py``)."""
    op, _ = make_op(BlocksparseConv, rng, "2d-same-even-filter", layout="random", edge_bias=False)
    t = op._tables.on(torch.device("cpu"))
    monkeypatch.setattr(glue, "_compiled", lambda plan, spec, a5, written, transposed, *rest:
                        None if transposed == (served == "forward only") else object())
    monkeypatch.setattr(_native, "add_launch", lambda *a, **k: pytest.fail("registered"))
    assert glue._native_record(torch.randn(op.i_shape(2)), op.spec, t, "ieee") is False


def test_a_strided_layer_registers_its_forward_alone(rng, monkeypatch):
    """Strided layers take the dense input gradient: their record holds the forward's launch and -1,
    and the transposed launch is not even prepared."""
    op, _ = make_op(BlocksparseConv, rng, "2d-same-stride-dilate", layout="random", edge_bias=False)
    t = op._tables.on(torch.device("cpu"))
    monkeypatch.setattr(glue, "_compiled", lambda plan, spec, a5, written, transposed, *rest:
                        pytest.fail("prepared the transposed launch") if transposed else object())
    monkeypatch.setattr(_native, "add_launch", lambda *a, **k: 7)
    monkeypatch.setattr(glue, "register_conv", lambda spec, fprop, bprop, *rest: (fprop, bprop))
    assert glue._native_record(torch.randn(op.i_shape(2)), op.spec, t, "ieee") == (7, -1)


def test_an_output_to_zero_fill_in_half_words_keeps_the_python_path(native, rng, monkeypatch):
    """The runtime zero-fills whole 32-bit words: a 16-bit output of an odd element count whose plan
    leaves channels unwritten is not registered."""
    op = BlocksparseConv([([0, 2], [1, 4])], TRS=(3,), DHW=(5,))  # outputs 0, 2, 3 unwritten
    assert not op.spec.implicit.covers
    t = op._tables.on(torch.device("cpu"))
    monkeypatch.setattr(glue, "_compiled", lambda *a: object())
    monkeypatch.setattr(_native, "add_launch", lambda *a, **k: pytest.fail("registered"))
    x = torch.zeros(op.i_shape(1), dtype=torch.float16)  # 1 x 5 x 5 outputs: 50 bytes
    assert glue._native_record(x, op.spec, t, "ieee") is False


def test_a_sparse_filter_gradient_keeps_the_python_path(rng, monkeypatch):
    """Where the rule takes the filter gradient over the present blocks (``ops/conv/wgrad.py``, a Triton
    kernel the node does not launch), calls take the Python path, which computes it."""
    from blocksparse.ops.conv import wgrad

    op, _ = make_op(BlocksparseConv, rng, "2d-same-even-filter", layout="random", edge_bias=False)
    t = op._tables.on(torch.device("cpu"))
    x = torch.randn(op.i_shape(2))
    t.implicit_native[("ieee", x.dtype, x.shape)] = 5  # a registered call shape
    assert glue._native_conv(x, op.spec, t, "ieee") == 5
    monkeypatch.setattr(wgrad, "SPARSE_WGRAD_MAX_DENSITY", {1: 1.0})  # at once, for registered shapes too
    assert glue._native_conv(x, op.spec, t, "ieee") is None
