"""The native linear op (``blocksparse/torch/csrc/linear.cpp``) on the CPU, with a stand-in for the
kernel library's runtime (``stand_in.py``): a C function that records each launch and computes a known function
of the pointers it was given.  Checks the op's plumbing -- which record each product runs, that
each operand's pointer lands in its slot, allocation, zero fill, casts, the bias and its gradient,
``needs_input_grad``, errors -- and that the backward is a C++ node.  The kernels themselves are
checked against float64 on the GPU (``test/pytorch/matmul/test_torch_aot_gpu.py``).

Also: :func:`blocksparse.torch._native.add_record` packs exactly the arguments an ahead-of-time
launch of the toy family holds."""
import ctypes
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.torch import _native  # noqa: E402
from stand_in import expected as _expected, record as _record  # noqa: E402


def test_forward_backward_bias_and_the_cpp_node(native, rng):
    x = torch.from_numpy(rng.standard_normal((4, 6))).float().requires_grad_()
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float().requires_grad_()
    bias = torch.from_numpy(rng.standard_normal(5)).float().requires_grad_()
    ids = (_record(native, 2, (4, 5), 20, 24, zero=True), _record(native, 3, (4, 6), 24, 20),
           _record(native, 4, (3, 2, 2), 12, 24))
    memsets = ctypes.c_int.in_dll(native, "n_memsets").value
    y = torch.ops.blocksparse_native.linear(x, w, bias, *ids)
    assert ctypes.c_int.in_dll(native, "n_memsets").value == memsets + 1  # the zero fill of the fprop output
    assert (ctypes.c_uint64 * 64).in_dll(native, "memset_counts")[memsets % 64] == 20  # float32 words
    torch.testing.assert_close(y, _expected(x, w, 2, (4, 5)) + bias.detach())
    assert type(y.grad_fn).__name__ == "CppFunction"  # a C++ autograd::Function node
    dy = torch.from_numpy(rng.standard_normal((4, 5))).float()
    dx, dw, db = torch.autograd.grad(y, (x, w, bias), dy)
    torch.testing.assert_close(dx, _expected(dy, w, 3, (4, 6)))
    torch.testing.assert_close(dw, _expected(x, dy, 4, (3, 2, 2)))
    torch.testing.assert_close(db, dy.sum(0))


def test_only_the_gradients_asked_for_are_launched(native, rng):
    x = torch.from_numpy(rng.standard_normal((4, 6))).float()  # no gradient: no bprop
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float().requires_grad_()
    ids = (_record(native, 5, (4, 5), 20, 24), _record(native, 6, (4, 6), 24, 20),
           _record(native, 7, (3, 2, 2), 12, 24))
    y = torch.ops.blocksparse_native.linear(x, w, None, *ids)
    count = ctypes.c_int.in_dll(native, "n_launches").value
    (dw,) = torch.autograd.grad(y, (w,), torch.ones(4, 5))
    launched = (ctypes.c_int * 64).in_dll(native, "launches")
    assert ctypes.c_int.in_dll(native, "n_launches").value == count + 1 and launched[count % 64] == 7
    torch.testing.assert_close(dw, _expected(x, torch.ones(1), 7, (3, 2, 2)))


def test_a_strided_gradient_is_made_dense_first(native, rng):
    x = torch.from_numpy(rng.standard_normal((4, 6))).float().requires_grad_()
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float()
    ids = (_record(native, 2, (4, 5), 20, 24), _record(native, 3, (4, 6), 24, 20), _record(native, 4, (3, 2, 2), 12, 24))
    y = torch.ops.blocksparse_native.linear(x, w, None, *ids)
    dy = torch.from_numpy(rng.standard_normal((5, 4))).float().t()  # not contiguous
    (dx,) = torch.autograd.grad(y, (x,), dy)
    torch.testing.assert_close(dx, _expected(dy.contiguous(), w, 3, (4, 6)))


@pytest.mark.parametrize("tokens", [4, 1 << 18, 209717])  # small; made dense as 8-byte words; an odd count
def test_a_broadcast_gradient_is_made_dense(native, rng, tokens):
    x = torch.from_numpy(rng.standard_normal((tokens, 6))).float().requires_grad_()
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float()
    ids = (_record(native, 2, (tokens, 5), tokens * 5, tokens * 6),
           _record(native, 3, (tokens, 6), tokens * 6, tokens * 5), _record(native, 4, (3, 2, 2), 12, tokens * 6))
    bias = torch.from_numpy(rng.standard_normal(5)).float().requires_grad_()
    y = torch.ops.blocksparse_native.linear(x, w, bias, *ids)
    scale = float(rng.uniform(0.5, 2.0))
    dx, db = torch.autograd.grad(y.sum() * scale, (x, bias))  # the gradient of sum(): every stride 0
    torch.testing.assert_close(dx, _expected(torch.full((tokens, 5), scale), w, 3, (tokens, 6)))
    torch.testing.assert_close(db.double(), torch.full((5,), scale * tokens, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size, large", [(96, False), (192, False), (96, True), (384, True)])
def test_a_refined_weight_is_reblocked_and_its_gradient_back(native, rng, block_size, large, dtype):
    """With a factor (a refinement the kernel library does not compile packed), the op hands the
    kernels the refined weight (compared with the Python re-blocking,
    :meth:`LinearDispatch.kernel_weight`) and returns the gradient of the coarse one --
    exactly, whether the copies move elements (small weights) or 8-byte words (weights of 2^20
    elements or more, rows of 16 or 32 elements of 2 or 4 bytes) -- also for a weight that does not
    start on an 8-byte boundary of its storage."""
    from blocksparse.layout import Layout
    from blocksparse.torch._portable.dispatch import for_layout

    side = -(-1024 // block_size) * 2 if large else 0  # a mask of 2^20+ elements in blocks
    mask = np.ones((side, side), dtype=bool) if large else rng.random((3, 2)) < 0.6
    mask[0, 0] = True
    dispatch = for_layout(Layout(mask, block_size, any_block_size=True))
    assert dispatch.refinement.layout.packing == 1
    factor = dispatch.refinement.factor
    s = block_size // factor
    coarse = dispatch.layout.blocks
    n = coarse * factor * factor
    base = torch.from_numpy(rng.standard_normal(coarse * block_size * block_size + 1)).to(dtype)
    for offset in (0, 1):  # the second view starts one element into its storage
        w = base[offset:offset + coarse * block_size * block_size].view(coarse, block_size, block_size)
        w = w.detach().requires_grad_()
        assert (w.numel() >= 2**20) == large
        x = torch.from_numpy(rng.standard_normal((4, 6))).to(dtype)
        words = n * s * s * w.element_size() // 4  # the stand-in copies float32 words
        ids = (_record(native, 2, (n, s, s), words, 24, copy=True, dtype=dtype),
               _record(native, 3, (4, 6), 24, words, dtype=dtype),
               _record(native, 4, (n, s, s), words, 24, copy=True, dtype=dtype))
        y = torch.ops.blocksparse_native.linear(x, w, None, *ids, factor)
        torch.testing.assert_close(y, dispatch.kernel_weight(w.detach()), rtol=0, atol=0)
        dense = dispatch.bsmm.layout.dense(y.detach().float().numpy())  # the refined layout's reading: the coarse weight
        np.testing.assert_array_equal(dense, dispatch.layout.dense(w.detach().float().numpy()))
        dy = torch.from_numpy(rng.standard_normal((n, s, s))).to(dtype)
        (dw,) = torch.autograd.grad(y, (w,), dy)
        (expected,) = torch.autograd.grad(dispatch.kernel_weight(w), (w,), dy)  # the Python re-blocking's
        torch.testing.assert_close(dw, expected, rtol=0, atol=0)


def test_a_bad_refinement_factor_is_refused(native):
    x, w = torch.ones(4, 6), torch.ones(3, 4, 4)
    ids = (_record(native, 2, (4, 5), 20, 24),) * 3
    with pytest.raises(RuntimeError, match="multiple of factor 3"):
        torch.ops.blocksparse_native.linear(x, w, None, *ids, 3)
    with pytest.raises(RuntimeError, match="factor must be >= 1"):
        torch.ops.blocksparse_native.linear(x, w, None, *ids, 0)


def test_the_output_is_cast_where_the_record_says(native, rng):
    x = torch.from_numpy(rng.standard_normal((4, 6))).float()
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float()
    ids = (_record(native, 2, (4, 5), 20, 24, cast_to=torch.float64), 0, 0)
    y = torch.ops.blocksparse_native.linear(x, w, None, *ids)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, _expected(x, w, 2, (4, 5)).double())
    bias = torch.from_numpy(rng.standard_normal(5)).float()  # added in the cast's pass
    y = torch.ops.blocksparse_native.linear(x, w, bias, *ids)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, _expected(x, w, 2, (4, 5)).double() + bias.double())
    # float32 sums to bfloat16 with a bfloat16 bias: the sum rounded once
    ids = (_record(native, 2, (4, 5), 20, 24, cast_to=torch.bfloat16), 0, 0)
    y = torch.ops.blocksparse_native.linear(x, w, bias.bfloat16(), *ids)
    exact = _expected(x, w, 2, (4, 5)).double() + bias.bfloat16().double()
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, exact.bfloat16(), rtol=0, atol=0)


def test_errors_name_what_failed(native, rng):
    x, w = torch.ones(4, 6), torch.ones(3, 2, 2)
    bad = _record(native, 99, (4, 5), 20, 24)
    with pytest.raises(RuntimeError, match="kernel launch failed: boom"):
        torch.ops.blocksparse_native.linear(x, w, None, bad, bad, bad)
    with pytest.raises(RuntimeError, match="unknown launch record"):
        torch.ops.blocksparse_native.linear(x, w, None, 10**6, 0, 0)
    with pytest.raises(RuntimeError, match="words must be"):
        torch.ops.blocksparse_native.add_record(1, 1, 0, [1, 1, 1], torch.zeros(3), 1, [], [1], torch.float32,
                                                False, None, False)
    with pytest.raises(RuntimeError, match="slot"):
        torch.ops.blocksparse_native.add_record(1, 1, 0, [1, 1, 1], torch.zeros(3, dtype=torch.int64), 1, [5, 0],
                                                [1], torch.float32, False, None, False)


def test_add_record_packs_what_the_ahead_of_time_launch_holds(native, toy_library):
    """A record of a real prepared launch (the toy family's scale kernel) holds its spec, grid and
    argument words, with the operand slots of the launch."""
    pytest.importorskip("triton")
    import toy_family

    from blocksparse.torch._launch import AotLaunch, KernelLaunch, Operand
    from blocksparse.torch._matmul.plan import Plan

    launch = KernelLaunch(toy_family.scale_kernel, (8,), {"X": Operand(0, torch.float32), "Y": Operand(2, torch.float32),
                                                           "N": 1000, "offset": 16, "alpha": 0.5}, {"BLOCK": 128},
                          num_warps=4, num_stages=1)
    spec = next(i for i, s in enumerate(toy_library.specs) if s["name"] == "scale_b128_sm90")
    runner = AotLaunch(launch, toy_library, spec, 0)
    plan = Plan("fprop", None, runner, torch.device("cpu"), (1016,), torch.float32)
    before = _native.add_record(plan)
    assert _native.add_record(plan) == before + 1  # ids in order of registration
    # run the record with the stand-in: it reads word 0 as a count, so only check it was packed as
    # the launch holds it -- the same words, the slots of X and Y
    words = np.frombuffer(bytes(memoryview(runner.args)), dtype=np.uint64)
    assert words.size == len(toy_library.specs[spec]["params"]) * 12
    assert sorted(index for _, index in runner.slots) == [0, 2]


def test_records_need_every_product_served_ahead_of_time():
    class P:
        def __init__(self, path):
            self.path, self.runner = path, object()

    fprop = P("jit")
    assert _native.records(fprop, lambda: (P("aot"), P("aot"))) is None
    assert fprop.native is False  # decided once per plan
    assert _native.records(fprop, lambda: pytest.fail("asked again")) is None


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_TORCH_NATIVE", "off")
    assert not _native.available()


def test_an_older_torch_serves_the_python_path(monkeypatch):
    """Below MIN_TORCH the op is not built (its C++ API lacks the stream handle): not available,
    no warning, nothing compiled."""
    monkeypatch.setattr(_native, "MIN_TORCH", (99, 0))
    monkeypatch.setattr(_native, "build", lambda cache=None: pytest.fail("built on an unsupported torch"))
    monkeypatch.setattr(_native, "_state", {})
    assert not _native.supported()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native.available() is False


# ---------------------------------------------------------------------------- the layers' fast path
def _fast_setup(native, rng, n=4):
    x = torch.from_numpy(rng.standard_normal((n, 6))).float()
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float().requires_grad_()
    bias = torch.from_numpy(rng.standard_normal(5)).float().requires_grad_()
    ids = (_record(native, 2, (n, 5), n * 5, n * 6, zero=True), _record(native, 3, (n, 6), n * 6, n * 5),
           _record(native, 4, (3, 2, 2), 12, n * 6))
    return x, w, bias, ids


def test_fast_path_runs_a_stored_call_kind_as_the_op_does(native, rng):
    x, w, bias, ids = _fast_setup(native, rng)
    fast = _native.FastPath(out_features=5)
    assert fast(x, w, bias) is None  # nothing stored: no layer id yet
    fast.store(x, w, bias, ids)
    y = fast(x, w, bias)
    assert type(y.grad_fn).__name__ == "CppFunction"
    torch.testing.assert_close(y, torch.ops.blocksparse_native.linear(x, w, bias, *ids), rtol=0, atol=0)
    torch.testing.assert_close(y, _expected(x, w, 2, (4, 5)) + bias.detach())
    dy = torch.from_numpy(rng.standard_normal((4, 5))).float()
    dw, db = torch.autograd.grad(y, (w, bias), dy)
    torch.testing.assert_close(dw, _expected(x, dy, 4, (3, 2, 2)))
    torch.testing.assert_close(db, dy.sum(0))
    # new values of the same kind: the same records, the new pointers
    x2 = torch.from_numpy(rng.standard_normal((4, 6))).float()
    torch.testing.assert_close(fast(x2, w, bias), _expected(x2, w, 2, (4, 5)) + bias.detach())


def test_fast_path_takes_leading_dims_as_tokens(native, rng):
    x, w, bias, ids = _fast_setup(native, rng, n=6)
    fast = _native.FastPath(out_features=5)
    fast.store(x, w, bias, ids)
    x3 = torch.from_numpy(rng.standard_normal((2, 3, 6))).float()
    y = fast(x3, w, bias)
    assert y.shape == (2, 3, 5)
    torch.testing.assert_close(y.reshape(6, 5), _expected(x3.reshape(6, 6), w, 2, (6, 5)) + bias.detach())
    assert fast(x3.reshape(3, 2, 6)[:, :1], w, bias) is None  # 3 tokens: another kind


def test_fast_path_misses_every_call_of_another_kind(native, rng, monkeypatch):
    """Each thing a plan depends on is part of the kind: a call differing in any gives None
    (Python plans it), never the stored records."""
    x, w, bias, ids = _fast_setup(native, rng)
    fast = _native.FastPath(out_features=5)
    fast.store(x, w, bias, ids)
    assert fast(x, w, bias) is not None
    misses = {
        "tokens": lambda: fast(x[:3], w, bias),
        "x dtype": lambda: fast(x.double(), w, bias),
        "w dtype": lambda: fast(x, w.detach().double(), bias),
        "w shape": lambda: fast(x, torch.ones(4, 2, 2, requires_grad=True), bias),
        "features": lambda: fast(torch.ones(4, 7), w, bias),
        "integer x": lambda: fast(torch.ones(4, 6, dtype=torch.int64), w, bias),
        "0-d x": lambda: fast(torch.tensor(1.0), w, bias),
    }
    with torch.no_grad():
        misses["no_grad"] = fast(x, w, bias)
    misses["no gradient asked"] = fast(x, w.detach(), bias.detach())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        misses["autocast"] = fast(x, w, bias)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not tf32
        misses["tf32"] = fast(x, w, bias)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    for name, value in (("BLOCKSPARSE_BACKEND", "reference"), ("BLOCKSPARSE_TORCH_NATIVE", "off")):
        monkeypatch.setenv(name, value)
        misses[name] = fast(x, w, bias)
        monkeypatch.delenv(name)
    for name, got in misses.items():
        got = got() if callable(got) else got
        assert got is None, f"a call of another kind ({name}) took the stored records"
    assert fast(x, w, bias) is not None  # the stored kind still hits
    fast.clear()
    assert fast(x, w, bias) is None


def test_fast_path_entries_are_per_layer(native, rng):
    x, w, bias, ids = _fast_setup(native, rng)
    one, other = _native.FastPath(out_features=5), _native.FastPath(out_features=5)
    one.store(x, w, bias, ids)
    other.store(x, w, bias, (_record(native, 7, (4, 5), 20, 24), *ids[1:]))
    torch.testing.assert_close(one(x, w, bias), _expected(x, w, 2, (4, 5)) + bias.detach())
    torch.testing.assert_close(other(x, w, bias), _expected(x, w, 7, (4, 5)) + bias.detach())
    other.clear()
    assert other(x, w, bias) is None and one(x, w, bias) is not None
    with pytest.raises(RuntimeError, match="unknown layer"):
        torch.ops.blocksparse_native.fast_store(x, w, bias, 10**6, *ids, 1, 5)


def _store_stand_ins(native, layer, x):
    """Enter stand-in records for ``layer``'s calls like ``x`` (4 x 8, one 8 x 8 block) into its fast
    path, as its first eager call of a kind does on a GPU; the stand-ins' result."""
    ids = (_record(native, 2, (4, 8), 32, 32), _record(native, 3, (4, 8), 32, 32), _record(native, 4, (1, 8, 8), 64, 32))
    layer._dispatch._fast.store(x, layer.weight, layer.bias, ids)
    return _expected(x, layer.weight, 2, (4, 8)) + layer.bias.detach()


def test_a_layer_runs_stored_kinds_through_its_fast_path(native, rng):
    """The layer's wiring, with stand-in records entered by hand (on a GPU, its first eager call of
    a kind enters them): the forward returns the fast path's result for a stored kind, a subclass
    input takes the planned way, and changing ``impl`` forgets the kinds."""
    from blocksparse.torch import BlocksparseLinear

    layer = BlocksparseLinear(np.ones((1, 1)), 8, impl="reference")
    x = torch.from_numpy(rng.standard_normal((4, 8))).float()
    reference = layer(x)
    stand_in = _store_stand_ins(native, layer, x)
    torch.testing.assert_close(layer(x), stand_in)
    torch.testing.assert_close(layer(x.reshape(2, 2, 8)), stand_in.reshape(2, 2, 8))

    class Sub(torch.Tensor):
        pass

    torch.testing.assert_close(layer(x.as_subclass(Sub)).as_subclass(torch.Tensor), reference)
    layer.impl = "reference"
    torch.testing.assert_close(layer(x), reference)


def test_a_cost_model_changed_later_empties_the_fast_path(native, rng):
    """Stored kinds were planned under the layer's cost model: a margin set on it since makes the
    next call planned anew (not the stored records)."""
    from blocksparse.dispatch import CostModel, Table
    from blocksparse.torch import BlocksparseLinear

    times = {"dense": 1.0, "reference": 5.0}
    rows = [{"tokens": 4, "in_features": 8, "out_features": 8, "block_size": 8, "density": 1.0,
             "dtype": "float32", "fwd_ms": times, "fwdbwd_ms": times}]
    model = CostModel(Table.from_dict({"format": 1, "framework": "torch", "device": "cpu", "rows": rows}))
    layer = BlocksparseLinear(np.ones((1, 1)), 8, cost_model=model)
    x = torch.from_numpy(rng.standard_normal((4, 8))).float()
    planned = layer(x)
    stand_in = _store_stand_ins(native, layer, x)
    torch.testing.assert_close(layer(x), stand_in)
    model.margin = 0.0
    torch.testing.assert_close(layer(x), planned)
    torch.testing.assert_close(layer(x), planned)  # and stays so: the stored kinds are gone


def test_a_record_whose_kernel_adds_the_bias_gets_it_and_adds_nothing_after(native, rng):
    """fused_bias: the bias (cast to the input's dtype) is the launch's operand 3, and the op adds
    no bias of its own; such a record refuses a call without one."""
    x = torch.from_numpy(rng.standard_normal((4, 6))).float().requires_grad_()
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float()
    bias = torch.from_numpy(rng.standard_normal(5)).requires_grad_()  # float64: cast for the kernel
    words = torch.tensor([20, 0, 0, 0, 24, 0], dtype=torch.int64)
    fused = torch.ops.blocksparse_native.add_record(
        _native._address(native.fake_launch), _native._address(native.fake_memset), 2, [3, 1, 1], words, 6,
        [1, 0, 2, 3, 3, 2], [4, 5], torch.float32, False, None, False, True)  # word 2 <- the bias
    ids = (fused, _record(native, 3, (4, 6), 24, 20), _record(native, 4, (3, 2, 2), 12, 24))
    y = torch.ops.blocksparse_native.linear(x, w, bias, *ids)
    # the stand-in computes in * spec + (operand in word 2)[0]: the bias's first element, once
    torch.testing.assert_close(y, _expected(x, bias.detach().float(), 2, (4, 5)))
    (db,) = torch.autograd.grad(y, (bias,), torch.ones(4, 5))
    assert db.dtype == torch.float64
    torch.testing.assert_close(db, torch.full((5,), 4.0, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="adds a bias; none was given"):
        torch.ops.blocksparse_native.linear(x, w, None, *ids)
    with pytest.raises(RuntimeError, match="out of range"):  # operand 3 only where the kernel adds the bias
        torch.ops.blocksparse_native.add_record(1, 1, 0, [1, 1, 1], words, 6, [2, 3], [1], torch.float32,
                                                False, None, False)


def test_a_record_on_transposed_inputs_gets_dense_transposed_copies(native, rng):
    """transpose_inputs (float32 (C, N) updat): both operands reach the launch as (N, F) copies."""
    x = torch.from_numpy(rng.standard_normal((6, 4))).float()       # (C, N)
    dy = torch.from_numpy(rng.standard_normal((5, 4))).float()      # (K, N)
    words = torch.tensor([12, 0, 0, 0, 24, 0], dtype=torch.int64)
    rid = torch.ops.blocksparse_native.add_record(
        _native._address(native.fake_launch), _native._address(native.fake_memset), 3, [3, 1, 1], words, 6,
        [1, 0, 2, 1, 3, 2], [3, 2, 2], torch.float32, False, None, False, False, True)
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float().requires_grad_()
    fprop = _record(native, 2, (5, 4), 20, 24)
    y = torch.ops.blocksparse_native.linear(x, w, None, fprop, 0, rid)
    (dw,) = torch.autograd.grad(y, (w,), dy)
    # the stand-in reads the input in launch order: element i of the (N, C) copy, plus dy's first
    # element of the (N, K) copy
    want = _expected(x.t().contiguous(), dy.t().contiguous(), 3, (3, 2, 2))
    torch.testing.assert_close(dw, want)
    assert not torch.allclose(want, _expected(x, dy, 3, (3, 2, 2)))  # the order shows


def test_a_ticket_record_gets_zeroed_scratch_kept_per_stream(native, rng):
    """Split reductions finished in the kernel: operands 4 and 5 are a zeroed float32 workspace and
    int32 counters of at least the record's sizes, the same ones call after call (the kernels leave
    them zero); no zero fill, no cast."""
    words = torch.tensor([20, 0, 0, 0, 24, 0, 0, 0, 5000, 300], dtype=torch.int64)
    ids = [torch.ops.blocksparse_native.add_record(
        _native._address(native.fake_ticket_launch), _native._address(native.fake_memset), spec, [1, 1, 1], words,
        10, [1, 0, 2, 1, 3, 2, 6, 4, 7, 5], [4, 5], torch.float32, False, None, False, False, False, 5000, 300)
        for spec in (2, 3, 5)]
    x = torch.from_numpy(rng.standard_normal((4, 6))).float()
    w = torch.from_numpy(rng.standard_normal((3, 2, 2))).float()
    memsets = ctypes.c_int.in_dll(native, "n_memsets").value
    y = torch.ops.blocksparse_native.linear(x, w, None, *ids)
    torch.testing.assert_close(y, _expected(x, w, 2, (4, 5)))
    first = ctypes.c_uint64.in_dll(native, "last_ws").value
    torch.ops.blocksparse_native.linear(x, w, None, *ids)
    assert ctypes.c_uint64.in_dll(native, "last_ws").value == first  # kept for the stream
    assert ctypes.c_int.in_dll(native, "dirty_scratch").value == 0
    assert ctypes.c_int.in_dll(native, "n_memsets").value == memsets  # nothing filled
    with pytest.raises(RuntimeError, match="out of range"):  # operands 4 and 5 only with scratch sizes
        torch.ops.blocksparse_native.add_record(1, 1, 0, [1, 1, 1], words, 10, [6, 4], [1], torch.float32,
                                                False, None, False)
    with pytest.raises(RuntimeError, match="both be positive"):
        torch.ops.blocksparse_native.add_record(1, 1, 0, [1, 1, 1], words, 10, [6, 4], [1], torch.float32,
                                                False, None, False, False, False, 10, 0)


@pytest.mark.parametrize("block_size, fine", [(48, 16), (256, 128)])
def test_packed_refinements_need_no_copies(block_size, fine):
    """Blocks of 48 and 256 run on their refined layout packed (the kernel library compiles those
    packings): the kernels take the layer's weight itself, and the op gets no factor to copy by."""
    from blocksparse.layout import Layout
    from blocksparse.ops.matmul.configs import AOT_PACKINGS
    from blocksparse.torch._portable.dispatch import for_layout

    assert block_size // fine in AOT_PACKINGS[fine]
    dispatch = for_layout(Layout(np.eye(3, dtype=bool), block_size, any_block_size=True))
    lay = dispatch.bsmm.layout
    assert (lay.block_size, lay.packing, lay.w_shape) == (fine, block_size // fine, dispatch.layout.w_shape)
    w = torch.randn(dispatch.layout.w_shape)
    assert dispatch.kernel_weight(w) is w and dispatch._copy_factor == 1 and dispatch._fast.factor == 1
