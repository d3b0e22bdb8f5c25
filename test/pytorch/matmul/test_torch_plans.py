"""The matmul family's launch plans: which compiled spec a GPU call gets (planned here for an sm_90 /
sm_80 target with the session's kernel library, on CPU tensors), that its packed arguments are
what the JIT passes for the same launch, the updat split and its atomics, when the JIT serves
instead, the plan cache, and the two call paths (eager autograd function, custom ops under
torch.compile) giving identical results through the kernels (Triton's interpreter)."""
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from launch_checks import assert_packed_like_jit  # noqa: E402

from blocksparse.aot.abi import KernelLibrary  # noqa: E402
from blocksparse.layout import Layout  # noqa: E402
from blocksparse.ops.matmul import configs  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402
from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul  # noqa: E402
from blocksparse.torch._launch import DeviceInfo  # noqa: E402
from blocksparse.torch._matmul import ops, plan, products  # noqa: E402


@pytest.fixture(scope="module")
def kernels(kernel_library_path):
    """The session's kernel library: bf16, block size 32, sm_80 and sm_90."""
    lib = KernelLibrary(kernel_library_path)
    if not any(s["dtype"] == "bf16" and s["block_size"] == 32 for s in lib.specs):
        pytest.skip("the kernel library under test has no bf16 / 32 kernels")
    return lib


def _operands(rng, lay, kind, n, axis, dtype=torch.bfloat16):
    """The two inputs of ``kind`` as the products take them, and the tensors of the call."""
    def act(features):
        return torch.from_numpy(rng.standard_normal((n, features) if axis == 1 else (features, n))).to(dtype)
    w = torch.from_numpy(rng.standard_normal(lay.w_shape)).to(dtype)
    return {"fprop": (act(lay.C), w), "bprop": (act(lay.K), w), "updat": (act(lay.C), act(lay.K))}[kind]


def _plan(kernels, lay, kind, a, b, axis, arch=90, precision="ieee", aligned=True):
    dw_dtype = b.dtype if kind == "updat" else None
    return plan._build(plan.LayoutState(lay), kind, a, b, axis, precision, dw_dtype, aligned,
                       target=(kernels, DeviceInfo(arch, 132)))


def _call_tensors(p, a, b):
    out = torch.empty(p.out_shape, dtype=p.out_dtype)
    tensors = (a, b.transpose(1, 2).contiguous() if p.pretranspose else b, out)
    if p.scratch is not None:  # split reductions finished in the kernel: the call's zeroed scratch
        tensors += (a, torch.zeros(p.scratch[0]), torch.zeros(p.scratch[1], dtype=torch.int32))
    return tensors


def _splits(spec):
    """Whether a spec reduces split products (float32 atomics, or in the kernel)."""
    return bool(spec["atomic"] or spec.get("ticket"))


def _packed(p, tensors):
    for word, index in p.runner.slots:
        p.runner._words[word] = tensors[index].data_ptr()
    return p.runner


@pytest.mark.parametrize("kind", ["fprop", "bprop", "updat"])
@pytest.mark.parametrize("axis, n, arch, kernel", [
    (1, 40, 90, "tma"), (0, 48, 90, "tma"), (0, 13, 90, "ptr"), (1, 40, 80, "ptr"), (0, 16, 86, "ptr"),
    (1, 40, 100, "ptx"), (0, 13, 130, "ptx")],
    ids=["nc-sm90", "cn-aligned-sm90", "cn-unaligned-sm90", "nc-sm80", "cn-sm86", "nc-sm100-ptx", "cn-sm130-ptx"])
def test_a_gpu_call_gets_a_compiled_spec_packed_as_the_jit_launch(kernels, rng, kind, axis, n, arch, kernel):
    if kernel == "ptx" and (not kernels.ptx or arch in kernels.archs):
        pytest.skip(f"the kernel library under test has no PTX, or cubins for sm_{arch}")
    lay = Layout(random_layout(rng, 4, 3, 0.5, empty_cols=1), 32)
    a, b = _operands(rng, lay, kind, n, axis)
    p = _plan(kernels, lay, kind, a, b, axis, arch)
    assert p.path == "aot", p.runner.reason
    spec = kernels.specs[p.runner.spec_index]
    assert (spec["product"], spec["dtype"], spec["block_size"], spec["axis"]) == (kind, "bf16", 32, axis)
    has_tma = any(s["tma"] for s in kernels.specs if (s["product"], s["axis"], s["arch"]) == (kind, axis, 90))
    want = "compute_80" if kernel == "ptx" else "sm_90a" if arch >= 90 else "sm_80"
    assert spec["target"] == want and spec["tma"] == (kernel == "tma" and has_tma)
    assert spec["group"] == p.config.G and _splits(spec) == (p.split > 1 or p.max_segment is not None)
    tensors = _call_tensors(p, a, b)
    assert_packed_like_jit(_packed(p, tensors), tensors)


class _SpecList:
    """The lookup of a kernel library (:meth:`KernelLibrary.find`) over the specs the build would
    compile, without building it: each spec's recorded fields, served on its own arch only."""

    def __init__(self, archs, **filters):
        from blocksparse.ops.matmul.aot import fields

        self.specs = [dict(fields(s), family="matmul", arch=s.arch, name=s.name)
                      for s in configs.aot_specializations(archs, **filters)]

    def find(self, family, arch, **fields):
        found = [i for i, s in enumerate(self.specs)
                 if s["family"] == family and s["arch"] == arch and all(s[k] == v for k, v in fields.items())]
        return found[0] if found else None


@pytest.mark.parametrize("arch", [90, 80])
def test_a_float32_pointer_updat_takes_the_spec_compiled_for_multiples_of_16_tokens(arch):
    """An (N, F) float32 updat reduces over tokens on a pointer kernel: where N is a multiple of 16
    it runs the ``n16`` twin (``N`` hinted, as the JIT specialises it), otherwise the plain spec;
    16-bit updats have no such twin (the hint made them slower at low density)."""
    lib = _SpecList((80, 90), dtypes=("fp32", "bf16"), block_sizes=(32,))
    for dtype, n, wide in ((torch.float32, 8192, True), (torch.float32, 8190, False), (torch.float32, 64, True),
                           (torch.float32, 40, False), (torch.bfloat16, 8192, False)):
        index = plan._aot_spec(lib, arch, "updat", dtype, 32, 1, tma=False, atomic=False, n=n)
        spec = lib.specs[index]
        assert (spec["product"], spec["axis"], spec["kernel"]) == ("updat", 1, "updat_kernel"), spec["name"]
        assert spec["n16"] is wide and spec["max_tokens"] == (configs.SMALL_N if n <= configs.SMALL_N else 0)
        assert spec["dtype"] == ("fp32" if dtype == torch.float32 else "bf16")
    # 16-bit (F, N) pointer kernels keep theirs
    index = plan._aot_spec(lib, 90, "updat", torch.bfloat16, 32, 0, tma=False, atomic=False, n=8192)
    assert lib.specs[index]["n16"] and lib.specs[index]["axis"] == 0


@pytest.mark.parametrize("kind", ["fprop", "bprop", "updat"])
@pytest.mark.parametrize("n", [64, configs.SMALL_N, configs.SMALL_N + 8], ids=lambda n: f"n{n}")
def test_few_token_calls_get_the_few_token_specs_with_the_jit_s_tile(kernels, rng, kind, n):
    """N = 64 plans run the few-token spec, with the tile of the JIT path's tables for 64 tokens (the
    JIT's regrouping of structured layouts aside, as for every compiled spec) and the split or
    table segments the JIT computes for that tile; past SMALL_N the many-token spec."""
    lay = Layout(random_layout(rng, 8, 6, 0.5), 32)
    a, b = _operands(rng, lay, kind, n, 1)
    p = _plan(kernels, lay, kind, a, b, 1)
    assert p.path == "aot", p.runner.reason
    spec = kernels.specs[p.runner.spec_index]
    few = [s for s in kernels.specs if s["max_tokens"] and (s["product"], s["arch"]) == (kind, 90)]
    assert few, "the kernel library has no few-token spec for this product"
    assert spec["max_tokens"] == (configs.SMALL_N if n <= configs.SMALL_N else 0)
    if n <= configs.SMALL_N:
        if kind == "updat":
            tile = configs.updat_config(32, n, tma=True)
            part, got = configs.updat_split(tile, n, lay.updat_groups(tile.G).shape[0], 132), p.split
        else:
            tile = configs.xprop_config(32, n, tma=True)
            part, got = plan._xprop_segments(lay, kind, tile, n, 132, True, plan._min_run(a.dtype)), p.max_segment
        assert p.config == tile and spec["config"] == dataclasses.asdict(tile)
        assert got == part
    assert _splits(spec) == (p.split > 1 or p.max_segment is not None)
    tensors = _call_tensors(p, a, b)
    assert_packed_like_jit(_packed(p, tensors), tensors)


def test_updat_splits_tokens_into_the_ticket_spec(kernels, rng, monkeypatch):
    lay = Layout(random_layout(rng, 4, 4, 0.5), 32)
    for n, split in ((64, False), (8192, True)):
        x, dy = _operands(rng, lay, "updat", n, 1)
        p = _plan(kernels, lay, "updat", x, dy, 1)
        spec = kernels.specs[p.runner.spec_index]
        assert (p.split > 1) is split and spec["ticket"] is split and not spec["atomic"]
        if split:  # finished in the kernel, in the weight's dtype: one launch, no zero fill, no cast
            assert p.out_dtype == torch.bfloat16 and not p.zero and p.cast_to is None and p.launches == 1
            assert p.scratch == (lay.blocks * 32 * 32, lay.updat_groups(p.config.G).shape[0] * p.config.G)
            tensors = _call_tensors(p, x, dy)
            assert_packed_like_jit(_packed(p, tensors), tensors)
            monkeypatch.setattr(plan, "TICKETS", False)  # float32 atomics: zero-filled, cast after
            p = _plan(kernels, lay, "updat", x, dy, 1)
            spec = kernels.specs[p.runner.spec_index]
            assert spec["atomic"] and not spec["dw16"] and p.out_dtype == torch.float32 and p.zero
            assert p.cast_to == torch.bfloat16 and p.launches == 3 and p.scratch is None
            monkeypatch.setattr(plan, "TICKETS", True)
        else:  # the spec that writes the weight's 16-bit dtype itself: one launch
            assert spec["dw16"] and p.out_dtype == torch.bfloat16 and not p.zero and p.cast_to is None
            assert p.launches == 1
            twin = kernels.find("matmul", 90, **{k: spec[k] for k in ("product", "dtype", "block_size", "axis",
                                                                      "kernel", "atomic", "max_tokens", "n16")},
                                dw16=False)
            assert twin is not None and kernels.specs[twin]["config"] == spec["config"]
            tensors = _call_tensors(p, x, dy)
            assert_packed_like_jit(_packed(p, tensors), tensors)


def test_updat_writes_float32_where_the_gradient_is_float32(kernels, rng):
    """A float32 weight gradient (asked for by the caller) never takes a 16-bit-writing spec: a
    split one takes float32 atomics, not the ticket spec (which writes the activations' dtype)."""
    lay = Layout(random_layout(rng, 4, 4, 0.5), 32)
    for n in (64, 8192):
        x, dy = _operands(rng, lay, "updat", n, 1)
        p = plan._build(plan.LayoutState(lay), "updat", x, dy, 1, "ieee", torch.float32, True,
                        target=(kernels, DeviceInfo(90, 132)))
        spec = kernels.specs[p.runner.spec_index]
        assert not spec["dw16"] and not spec["ticket"] and p.out_dtype == torch.float32 and p.cast_to is None
        assert p.launches == (1 if n == 64 else 2)  # + the zero fill of the split one


@pytest.mark.parametrize("kind", ["fprop", "bprop"])
def test_few_token_reductions_split_only_long_runs(kernels, rng, kind):
    """A split reduction (finished in the kernel: one launch) only where one program would run at
    least SPLIT_MIN_RUN blocks in series; a shorter run is one program per group."""
    need = plan.SPLIT_MIN_RUN[False]
    for run, split in ((need - 1, False), (need, True)):
        # every output group of the product runs `run` blocks: a full layout `run` blocks deep
        grid = (run, 2) if kind == "fprop" else (2, run)
        lay = Layout(np.ones(grid, dtype=np.int32), 32)
        a, b = _operands(rng, lay, kind, 64, 1)
        p = _plan(kernels, lay, kind, a, b, 1)
        spec = kernels.specs[p.runner.spec_index]
        assert (p.max_segment is not None) is split and spec["ticket"] is split and not spec["atomic"]
        assert not p.zero and p.launches == 1 and (p.scratch is not None) is split
    # float32 programs are slower per block: they split shorter runs; the interpreter splits any
    assert plan._min_run(torch.float32) < plan._min_run(torch.bfloat16)
    assert plan._min_run(torch.bfloat16, interpret=True) == 1


def test_the_split_threshold_can_be_set(kernels, rng, monkeypatch):
    """BLOCKSPARSE_SPLIT_MIN_RUN (for CUDA-graph callers): 1 splits a run the default leaves whole;
    anything but a positive integer is refused, naming the variable."""
    lay = Layout(np.ones((8, 2), dtype=np.int32), 32)  # 8-block runs: whole by default
    a, b = _operands(rng, lay, "fprop", 64, 1)
    assert _plan(kernels, lay, "fprop", a, b, 1).max_segment is None
    monkeypatch.setenv("BLOCKSPARSE_SPLIT_MIN_RUN", "1")
    p = _plan(kernels, lay, "fprop", a, b, 1)
    assert p.max_segment is not None and kernels.specs[p.runner.spec_index]["ticket"]
    for bad in ("0", "-3", "many", "1.5"):
        monkeypatch.setenv("BLOCKSPARSE_SPLIT_MIN_RUN", bad)
        with pytest.raises(ValueError, match="BLOCKSPARSE_SPLIT_MIN_RUN must be a positive integer"):
            _plan(kernels, lay, "fprop", a, b, 1)


@pytest.mark.parametrize("case", ["no-dtype", "no-arch", "strided", "unaligned", "tf32-float32"])
def test_the_jit_serves_what_no_spec_does(kernels, rng, case):
    lay = Layout(random_layout(rng, 4, 3, 0.5), 32)
    dtype = torch.float16 if case == "no-dtype" else torch.float32 if case == "tf32-float32" else torch.bfloat16
    x, w = _operands(rng, lay, "fprop", 64, 1, dtype)
    if case == "strided":
        x = torch.cat([x, x], dim=1)[:, :lay.C]  # a column slice: the specs assume dense rows
    p = _plan(kernels, lay, "fprop", x, w, 1, arch=75 if case == "no-arch" else 90,
              precision="tf32" if case == "tf32-float32" else "ieee", aligned=case != "unaligned")
    assert p.path == "jit" and "no compiled spec" in p.runner.reason


def test_a_spec_compiled_for_other_constexprs_is_not_used(kernels, rng):
    """bf16 products compiled with IEEE precision serve TF32 requests (TF32 concerns float32
    only); a launch that really differs falls back to the JIT, saying why."""
    from blocksparse.torch._launch import prepare

    lay = Layout(random_layout(rng, 4, 3, 0.5), 32)
    x, w = _operands(rng, lay, "fprop", 64, 1)
    p = _plan(kernels, lay, "fprop", x, w, 1)
    launch = p.runner.launch
    changed = type(launch)(launch.kernel, launch.grid, launch.args, {**launch.constexprs, "PRECISION": "tf32"},
                           launch.num_warps, launch.num_stages)
    runner = prepare(changed, -1, kernels, p.runner.spec_index)
    assert runner.path == "jit" and "PRECISION" in runner.reason


def test_plans_are_cached_per_call_shape(rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    lay = Layout(random_layout(rng, 3, 2, 0.6), 16)
    handle = plan.handle(lay, lay)
    state = plan.state(handle)
    x, w = (torch.randn(5, lay.C), torch.randn(lay.w_shape))
    first = products.plan_of("fprop", x, w, handle, 1, "ieee")
    assert products.plan_of("fprop", x.clone(), w.clone(), handle, 1, "ieee") is first
    assert products.plan_of("fprop", torch.randn(6, lay.C), w, handle, 1, "ieee") is not first
    assert products.plan_of("fprop", x.double().float(), w, handle, 1, "tf32") is not first
    assert products.plan_of("fprop", x.half(), w.half(), handle, 1, "tf32") is \
        products.plan_of("fprop", x.half(), w.half(), handle, 1, "ieee")  # one plan: TF32 is float32's
    assert first.path == "jit" and first.launches >= 1
    keys = [k for k in state.plans if k[0] == "fprop"]
    assert len(keys) == len(set(keys)) >= 3


# ------------------------------------------------------------------- the two call paths

def _triton(monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_eager_and_compiled_calls_give_identical_results(rng, monkeypatch, dtype):
    _triton(monkeypatch)
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 3, 0.7), 16)
    x = torch.from_numpy(rng.standard_normal((5, bsmm.C))).to(dtype).requires_grad_()
    w = torch.from_numpy(rng.standard_normal(bsmm.w_shape) / 4).to(dtype).requires_grad_()
    dy = torch.from_numpy(rng.standard_normal((5, bsmm.K))).to(dtype)

    def step(forward):
        y = forward(x, w)
        return (y, *torch.autograd.grad(y, (x, w), dy))

    eager = step(bsmm)
    compiled = step(torch.compile(lambda x, w: bsmm(x, w), fullgraph=True, backend="aot_eager"))
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    refs = dense_products(bsmm.layout, *(t.detach().double().numpy() for t in (x, w, dy)), 1)
    for got, ref in zip(eager, refs):
        assert rel_error(got, ref) < tolerance(dtype)


def test_eager_calls_bypass_the_dispatcher(rng, monkeypatch):
    def refuse(*args):
        raise AssertionError("the custom op was called eagerly")

    monkeypatch.setattr(ops, "matmul_op", refuse)
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 2, 0.7), 16)
    x, w = torch.randn(3, bsmm.C, dtype=torch.float64), torch.randn(bsmm.w_shape, dtype=torch.float64)
    assert bsmm(x, w).grad_fn is None                       # no gradient wanted: no autograd at all
    y = bsmm(x.requires_grad_(), w)
    assert type(y.grad_fn).__name__ == "MatmulFunctionBackward"
    y.sum().backward()
    assert rel_error(x.grad, np.ones((3, bsmm.K)) @ bsmm.layout.dense(w.numpy()).T) < 1e-12


def test_double_backward(rng):
    """gx = dy @ W.T with dy = 1 (3 tokens): d(sum gx) / dW is 3 on every element of every block."""
    bsmm = BlocksparseMatMul(random_layout(rng, 2, 2, 0.7), 16)
    x = torch.randn(3, bsmm.C, dtype=torch.float64, requires_grad=True)
    w = torch.randn(bsmm.w_shape, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(bsmm(x, w).sum(), x, create_graph=True)
    gx.sum().backward()
    assert x.grad is None and torch.equal(w.grad, torch.full(bsmm.w_shape, 3.0, dtype=torch.float64))


@pytest.mark.interpreter
def test_autocast_through_the_kernels(rng, monkeypatch):
    _triton(monkeypatch)
    lin = BlocksparseLinear(random_layout(rng, 2, 2, 0.7), block_size=16, bias=False)
    x = torch.from_numpy(rng.standard_normal((4, 32))).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    ref = x.bfloat16().double().numpy() @ lin.layout.dense(lin.weight.detach().bfloat16().double().numpy())
    assert rel_error(y, ref) < tolerance(torch.bfloat16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(1024, 1024), (1024, 1025), (8, 3)])  # words; an odd count; small
def test_a_broadcast_scalar_is_made_dense_exactly(rng, dtype, shape):
    torch = pytest.importorskip("torch")
    value = torch.tensor(float(rng.uniform(-2.0, 2.0)), dtype=getattr(torch, dtype))
    t = value.expand(*shape)  # the gradient of a sum(): every stride 0
    dense = products._strided(t)
    assert dense.is_contiguous() and dense.dtype == t.dtype and dense.shape == t.shape
    assert torch.equal(dense, torch.full(shape, value.item(), dtype=t.dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_broadcast_scalar_s_column_sums_are_one_multiply(rng, dtype):
    torch = pytest.importorskip("torch")
    from blocksparse.torch._reduce import column_sums

    value = torch.tensor(float(rng.uniform(-2.0, 2.0)), dtype=getattr(torch, dtype))
    t = value.expand(1000, 7)
    want = torch.full((7,), value.double().item() * 1000, dtype=torch.float64).to(t.dtype)
    assert torch.equal(column_sums(t), want) and torch.equal(column_sums(t), t.contiguous().double().sum(0).to(t.dtype))
