"""The launch layer every family's torch glue uses, with a family it has never seen
(``toy_family``): what an ahead-of-time launch packs (exactly what Triton's JIT gets for the same
launch), that it writes each call's pointers, when a spec cannot serve a launch (and the JIT takes
over), and the JIT path itself (Triton's interpreter)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import toy_family  # noqa: E402
from launch_checks import assert_packed_like_jit  # noqa: E402

from blocksparse.aot.abi import KernelError  # noqa: E402
from blocksparse.torch import _launch  # noqa: E402
from blocksparse.torch._launch import (AotLaunch, Descriptor, JitLaunch, KernelLaunch, Mismatch,  # noqa: E402
                                       Operand, prepare)

SCALE, ROWS = "scale_b128_sm90", "rows_b64_sm90"


def _index(lib, name):
    return next(i for i, s in enumerate(lib.specs) if s["name"] == name)


def scale_launch(n, args=None, consts=None, **options):
    """y[offset + i] = alpha * x[i]: operands (x, y)."""
    return KernelLaunch(toy_family.scale_kernel, (triton.cdiv(n, 128),),
                        {"X": Operand(0, torch.float32), "Y": Operand(1, torch.float32), "N": n, "offset": 16,
                         "alpha": 0.5, **(args or {})}, {"BLOCK": 128, **(consts or {})},
                        **{"num_warps": 4, "num_stages": 1, **options})


def rows_launch(rows, block=(64, 32), **args):
    """Copies a (rows, 32) float16 tensor through its descriptor: operands (x, y)."""
    return KernelLaunch(toy_family.rows_kernel, (triton.cdiv(rows, 64),),
                        {"x_desc": Descriptor(0, (rows, 32), (32, 1), block, torch.float16),
                         "Y": Operand(1, torch.float16), "stride_y": 32, "n_rows": rows, **args},
                        {"BM": 64, "BN": 32}, num_warps=4, num_stages=1)


def _scale_tensors(rng, n):
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    return x, torch.full((n + 16,), float("nan"))


@pytest.mark.parametrize("n", [1, 300])
def test_scale_packs_what_the_jit_passes(toy_library, rng, n):
    aot = AotLaunch(scale_launch(n), toy_library, _index(toy_library, SCALE), -1)
    tensors = _scale_tensors(rng, n)
    aot._words[aot.slots[0][0]] = tensors[0].data_ptr()  # what a call writes first
    aot._words[aot.slots[1][0]] = tensors[1].data_ptr()
    assert list(aot.grid) == [triton.cdiv(n, 128), 1, 1]
    assert_packed_like_jit(aot, tensors)


def test_descriptors_pack_what_the_jit_passes(toy_library):
    aot = AotLaunch(rows_launch(100), toy_library, _index(toy_library, ROWS), -1)
    tensors = (torch.randn(100, 32).half(), torch.empty(100, 32).half())
    for (word, index) in aot.slots:
        aot._words[word] = tensors[index].data_ptr()
    assert_packed_like_jit(aot, tensors)


@pytest.fixture
def no_gpu(monkeypatch):
    """CPU tensors stand in for device memory: the stream is the NULL stream, and no device is
    current (a CUDA build of torch on a machine without a driver would raise when asked)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    monkeypatch.setattr(_launch, "_stream", lambda device: 0)
    monkeypatch.setattr(_launch, "_current_device", None)


def test_each_call_writes_its_pointers(toy_library, rng, no_gpu):
    aot = AotLaunch(scale_launch(64), toy_library, _index(toy_library, SCALE), -1)
    for _ in range(2):
        tensors = _scale_tensors(rng, 64)
        with pytest.raises(KernelError, match="libcuda.so.1|cuInit") as info:
            aot(tensors)
        assert info.value.status == 3
        assert [aot.args[i].value.ptr for i in (0, 1)] == [t.data_ptr() for t in tensors]


def test_an_empty_grid_needs_no_gpu(toy_library, no_gpu):
    AotLaunch(scale_launch(0), toy_library, _index(toy_library, SCALE), -1)((torch.empty(0), torch.empty(16)))


MISMATCHES = {
    "constexpr": (SCALE, lambda: scale_launch(64, consts={"BLOCK": 64}), r"BLOCK: the spec was compiled with 128"),
    "dtype": (SCALE, lambda: scale_launch(64, args={"Y": Operand(1, torch.float16)}), r"Y: the spec takes \*fp32"),
    "tensor-for-scalar": (SCALE, lambda: scale_launch(64, args={"alpha": Operand(1)}),
                          "alpha: the spec takes a f32, the launch a tensor"),
    "missing": (SCALE, lambda: KernelLaunch(toy_family.scale_kernel, (1,), {"X": Operand(0), "Y": Operand(1)},
                                            {"BLOCK": 128}, 4, 1), "N: the spec takes it, the launch does not"),
    "extra": (SCALE, lambda: scale_launch(64, args={"beta": 1}), r"gives \['beta'\], which the spec neither"),
    "alignment": (SCALE, lambda: scale_launch(64, args={"offset": 8}), "offset = 8 is not a multiple of 16"),
    "range": (SCALE, lambda: scale_launch(64, args={"N": 2**31}), "does not fit in i32"),
    "kernel": (ROWS, lambda: scale_launch(64), "the spec compiles rows_kernel, the launch runs scale_kernel"),
    "warps": (SCALE, lambda: scale_launch(64, num_warps=8), "num_warps: the spec has 4, the launch 8"),
    "block": (ROWS, lambda: rows_launch(64, block=(32, 32)), r"x_desc: the spec takes tensordesc<fp16\[64, 32\]>"),
    "not-a-descriptor": (ROWS, lambda: rows_launch(64, x_desc=Operand(0)), "x_desc: the spec takes a tensor, the"),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_a_spec_that_cannot_serve_a_launch_is_refused(toy_library, case):
    spec, make, message = MISMATCHES[case]
    with pytest.raises(Mismatch, match=message):
        AotLaunch(make(), toy_library, _index(toy_library, spec), -1)
    runner = prepare(make(), -1, toy_library, _index(toy_library, spec))
    assert isinstance(runner, JitLaunch) and runner.path == "jit" and spec in runner.reason


def test_prepare_without_a_spec_takes_the_jit(toy_library):
    runner = prepare(scale_launch(64), -1, toy_library, None)
    assert runner.path == "jit" and "no compiled spec" in runner.reason
    assert prepare(scale_launch(64), -1, toy_library, _index(toy_library, SCALE)).path == "aot"


def test_zero_filled_operands_are_filled_by_the_runtime(toy_library, rng, no_gpu):
    aot = AotLaunch(scale_launch(64, zero=(1,)), toy_library, _index(toy_library, SCALE), -1)
    with pytest.raises(KernelError, match="libcuda.so.1|cuInit") as info:  # the fill comes first
        aot(_scale_tensors(rng, 64))
    assert info.value.status == 3


@pytest.mark.interpreter
def test_the_jit_launch_zero_fills_first(rng):
    x, y = _scale_tensors(rng, 64)
    JitLaunch(scale_launch(64, zero=(1,)))((x, y))
    assert torch.equal(y[:16], torch.zeros(16)) and torch.allclose(y[16:], 0.5 * x)


@pytest.mark.interpreter
def test_the_jit_launch_computes(rng):
    n = 300
    x, y = _scale_tensors(rng, n)
    JitLaunch(scale_launch(n))((x, y))
    np.testing.assert_allclose(y[16:].numpy(), 0.5 * x.numpy(), rtol=1e-6)
    assert torch.isnan(y[:16]).all()  # nothing written before the offset
    src, out = torch.randn(100, 32).half(), torch.full((100, 32), float("nan")).half()
    JitLaunch(rows_launch(100))((src, out))
    assert torch.equal(out, src)


def test_an_empty_jit_launch_does_nothing():
    JitLaunch(scale_launch(0))((torch.empty(0), torch.empty(16)))  # grid (0,): Triton is never called
