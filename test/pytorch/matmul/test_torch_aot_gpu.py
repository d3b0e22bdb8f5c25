"""blocksparse.torch on a CUDA GPU through the kernel library (the ahead-of-time path): every block
size, dtype and feature axis against float64 with NaN-poisoned outputs, every plan of the calls
taking a compiled spec, the plan cache, CUDA graphs, several devices' current streams.  Skipped
without a GPU.

The library: the ``gpu_kernels`` fixture (``test/pytorch/conftest.py``)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import TOLERANCE, rel_error  # noqa: E402
from blocksparse.testing.matmul import check_torch_products, random_layout  # noqa: E402
from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul  # noqa: E402
from blocksparse.torch._matmul import plan as _plan  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _plans(bsmm):
    return list(_plan.state(bsmm._handle).plans.values())


def _check(bsmm, rng, n, dtype):
    check_torch_products(bsmm, rng, n, DTYPES[dtype], "cuda")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs", [16, 32, 64, 128])
def test_every_block_size_dtype_and_axis_through_compiled_kernels(aot, rng, bs, axis, dtype):
    mask = random_layout(rng, 512 // bs, 384 // bs, 0.3, empty_rows=1, empty_cols=1)
    bsmm = BlocksparseMatMul(mask, bs, axis)
    for n in (64, 1000):  # (F, N) rows of 1000 tokens are 16-byte aligned in every dtype
        _check(bsmm, rng, n, dtype)
    paths = {(p.kind, p.path) for p in _plans(bsmm)}
    assert paths == {("fprop", "aot"), ("bprop", "aot"), ("updat", "aot")}, paths


def test_unaligned_rows_take_the_compiled_pointer_kernels(aot, rng):
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 6, 0.5), 32, feature_axis=0)
    _check(bsmm, rng, 13, "bfloat16")
    assert {p.path for p in _plans(bsmm)} == {"aot"}
    assert not any("_tma" in p.runner.kernels.specs[p.runner.spec_index]["kernel"] for p in _plans(bsmm))


def test_the_plan_cache(aot, rng):
    bsmm = BlocksparseMatMul(random_layout(rng, 8, 8, 0.4), 64)
    w = torch.randn(bsmm.w_shape, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256, bsmm.C, device="cuda", dtype=torch.bfloat16)
    y1 = bsmm(x, w)
    plans = dict(_plan.state(bsmm._handle).plans)
    y2 = bsmm(x.clone(), w)
    assert _plan.state(bsmm._handle).plans == plans and torch.equal(y1, y2)  # same shape: the same plan
    bsmm(torch.randn(300, bsmm.C, device="cuda", dtype=torch.bfloat16), w)
    assert len(_plan.state(bsmm._handle).plans) == len(plans) + 1


def test_tf32_products_take_the_jit(aot, rng):
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 4, 0.5), 64, allow_tf32=True)
    x = torch.randn(128, bsmm.C, device="cuda")
    bsmm(x, torch.randn(bsmm.w_shape, device="cuda"))
    assert {p.path for p in _plans(bsmm)} == {"jit"}  # the compiled float32 kernels are exact (IEEE)


def test_cuda_graphs_replay_compiled_launches(aot, rng):
    lin = BlocksparseLinear(random_layout(rng, 8, 8, 0.3), block_size=64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    ref = lin(x)  # warms the plans up
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        lin(x)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        out = lin(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, lin(x)) and not torch.equal(out, ref)


def test_launches_from_a_thread_without_a_current_context(aot, rng):
    """A fresh thread has no CUDA context current (autograd's worker threads start so): launches on
    the default stream take the operands' device's context, the split updat's zero fill too."""
    import threading

    lin = BlocksparseLinear(random_layout(rng, 8, 8, 0.3, cover=True), block_size=32, impl="kernels", device="cuda",
                            dtype=torch.bfloat16)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    results, errors = [], []

    def step():
        try:
            y = lin(x)
            results.append((y, *torch.autograd.grad(y, (x, lin.weight), dy)))
        except Exception as exc:  # noqa: BLE001 -- reported by the main thread
            errors.append(exc)

    for _ in range(2):  # the second time: the backward's worker thread is warm
        thread = threading.Thread(target=step)
        thread.start()
        thread.join()
    assert not errors, errors
    dense = torch.from_numpy(lin.layout.dense(lin.weight.detach().double().cpu().numpy())).cuda()
    xd, dyd = x.detach().double(), dy.double()
    y, dx, dw = results[-1]
    assert rel_error(y, xd @ dense + lin.bias.detach().double()) < TOLERANCE["bfloat16"]
    assert rel_error(dx, dyd @ dense.T) < TOLERANCE["bfloat16"]
    dw_dense = torch.from_numpy(lin.layout.dense(dw.double().cpu().numpy())).cuda()
    mask = torch.from_numpy(lin.layout.dense(torch.ones(lin.layout.w_shape).double().numpy())).cuda()
    assert rel_error(dw_dense, (xd.T @ dyd) * mask) < TOLERANCE["bfloat16"]
    assert {p.path for p in _plans(lin.bsmm)} == {"aot"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("axis", [1, 0])
def test_the_native_op_is_one_cpp_node_and_matches_the_python_path(aot, rng, monkeypatch, dtype, axis):
    """Eager forward + backward through the native op (one C++ autograd node): against float64, and
    what the Python autograd.Function gives with the same launches (to rounding: split products
    add float32 partials by atomics, in no fixed order)."""
    from blocksparse.torch import _native

    if not _native.available():
        pytest.skip(f"the native op cannot be built here: {_native._state.get('why')}")
    bsmm = BlocksparseMatMul(random_layout(rng, 8, 6, 0.4, cover=True), 32, feature_axis=axis)
    n, dt = 256, DTYPES[dtype]
    shape = (n, bsmm.C) if axis == 1 else (bsmm.C, n)
    x = torch.randn(shape, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(bsmm.w_shape, device="cuda", dtype=dt, requires_grad=True)
    y = bsmm(x, w)
    assert type(y.grad_fn).__name__ == "CppFunction"  # a C++ autograd::Function node
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", "off")
    y_py = bsmm(x, w)
    assert type(y_py.grad_fn).__name__ != "CppFunction"
    dx_py, dw_py = torch.autograd.grad(y_py, (x, w), dy)
    for got, python_path in ((y, y_py), (dx, dx_py), (dw, dw_py)):
        assert rel_error(got, python_path) < TOLERANCE[dtype] / 10  # (rel_error detaches)
    dense = torch.from_numpy(bsmm.layout.dense(w.detach().double().cpu().numpy())).cuda()
    xd = x.detach().double() if axis == 1 else x.detach().double().T
    dyd = dy.double() if axis == 1 else dy.double().T
    tol = TOLERANCE[dtype]
    assert rel_error(y if axis == 1 else y.T, xd @ dense) < tol
    assert rel_error(dx if axis == 1 else dx.T, dyd @ dense.T) < tol
    mask = torch.from_numpy(bsmm.layout.dense(np.ones(bsmm.w_shape))).cuda()
    dw_dense = torch.from_numpy(bsmm.layout.dense(dw.double().cpu().numpy())).cuda()
    assert rel_error(dw_dense, (xd.T @ dyd) * mask) < tol


def _scratch_is_clean():
    from blocksparse.torch import _scratch

    torch.cuda.synchronize()
    return all(not ws.any() and not counters.any() for ws, counters in _scratch._buffers.values())


@pytest.mark.parametrize("kernels", ["aot", "jit"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("bs", [32, 64])
def test_split_reductions_are_finished_in_the_kernel(aot, rng, monkeypatch, kernels, dtype, bs):
    """Few-token fprop / bprop and split updats finish their reductions in the kernel (tickets): no
    zero fill, no cast; right against float64 call after call (each leaves its scratch zero)."""
    monkeypatch.setenv("BLOCKSPARSE_SPLIT_MIN_RUN", "1")  # split every run that the tile splits
    if kernels == "jit":
        monkeypatch.setenv("BLOCKSPARSE_KERNELS", "jit")
    bsmm = BlocksparseMatMul(random_layout(rng, 2048 // bs, 1024 // bs, 0.5, empty_rows=1, empty_cols=1), bs)
    for n in (1, 64, 300, 64):
        _check(bsmm, rng, n, dtype)
    assert _scratch_is_clean()
    ticketed = [p for p in _plans(bsmm) if p.scratch is not None]
    assert {p.kind for p in ticketed} >= {"fprop", "bprop"}
    assert all(p.path == kernels and not p.zero and p.cast_to is None for p in ticketed)


def test_the_native_op_finishes_split_reductions_in_the_kernel(aot, rng, monkeypatch):
    """A few-token layer through the native op: its split products run the kernel library's ticket
    specs with the op's own zeroed scratch, forward and backward, also replayed in a CUDA graph."""
    from blocksparse.torch import _native

    if not _native.available():
        pytest.skip(f"the native op cannot be built here: {_native._state.get('why')}")
    monkeypatch.setenv("BLOCKSPARSE_SPLIT_MIN_RUN", "1")
    lin = BlocksparseLinear(random_layout(rng, 32, 16, 0.5, cover=True), block_size=32, impl="kernels",
                            device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dense = torch.from_numpy(lin.layout.dense(lin.weight.detach().double().cpu().numpy())).cuda()
    for _ in range(3):
        dy = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
        y = lin(x)
        assert type(y.grad_fn).__name__ == "CppFunction"
        dx, dw = torch.autograd.grad(y, (x, lin.weight), dy)
        xd, dyd = x.detach().double(), dy.double()
        assert rel_error(y, xd @ dense + lin.bias.detach().double()) < TOLERANCE["bfloat16"]
        assert rel_error(dx, dyd @ dense.T) < TOLERANCE["bfloat16"]
        dw_dense = torch.from_numpy(lin.layout.dense(dw.double().cpu().numpy())).cuda()
        mask = torch.from_numpy(lin.layout.dense(np.ones(lin.layout.w_shape))).cuda()
        assert rel_error(dw_dense, (xd.T @ dyd) * mask) < TOLERANCE["bfloat16"]
    assert any(p.scratch is not None for p in _plans(lin.bsmm) if p.kind != "updat")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.no_grad():
        with torch.cuda.stream(stream):
            lin(x)  # warms the stream's scratch up
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            out = lin(x)
        for _ in range(3):
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            assert rel_error(out, x.detach().double() @ dense + lin.bias.detach().double()) < TOLERANCE["bfloat16"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_tensor_on_another_device_than_the_current_one(aot, rng):
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 4, 0.5), 32)
    with torch.cuda.device(0):
        x = torch.randn(64, bsmm.C, device="cuda:1", dtype=torch.bfloat16)
        w = torch.randn(bsmm.w_shape, device="cuda:1", dtype=torch.bfloat16)
        y = bsmm(x, w)
    ref = x.double().cpu().numpy() @ bsmm.layout.dense(w.double().cpu().numpy())
    assert rel_error(y, ref) < TOLERANCE["bfloat16"]


def test_without_the_library_the_jit_serves(monkeypatch, rng):
    monkeypatch.setenv("BLOCKSPARSE_KERNELS", "jit")
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 4, 0.5), 32)
    _check(bsmm, rng, 64, "bfloat16")
    assert {p.path for p in _plans(bsmm)} == {"jit"}


def test_build_info_names_the_library(aot, gpu_kernels):
    import blocksparse

    info = blocksparse.build_info()["kernels"]
    assert {k: info[k] for k in ("library", "source", "launch")} == \
        {"library": gpu_kernels, "source": "BLOCKSPARSE_KERNELS", "launch": "aot"}
    major, minor = torch.cuda.get_device_capability()
    assert f"sm_{major}{minor}" in info["archs"] and isinstance(info["ptx"], list)  # the GPU's cubins are in it

