"""The TensorFlow op library on a CPU-only machine: it builds against the installed TensorFlow,
loads and registers its ops; shape inference (traced tf.functions, unknown N), attr and input
errors (InvalidArgument, at trace or at run time), the CPU kernels' answer; the dispatcher's
choices; the loader's one warning; build_info().  Kernel numerics are checked on a GPU machine
(scripts/verify_aot.py)."""
import json
import shutil
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import op_def_registry  # noqa: E402

import blocksparse  # noqa: E402
from blocksparse import _manifest  # noqa: E402
from blocksparse._tf import dispatch, loader as ops  # noqa: E402
from blocksparse._tf.matmul import backend  # noqa: E402
from blocksparse.layout import Layout  # noqa: E402
from blocksparse.matmul import BlocksparseMatMul, group_param_grads  # noqa: E402

# CB = 3, KB = 5, seven blocks; every row and column holds one
MASK = [[1, 0, 1, 1, 0], [0, 1, 0, 0, 1], [1, 1, 0, 0, 0]]
OPS = ("BlocksparseMatmul", "BlocksparseMatmulDX", "BlocksparseMatmulDW")


def _attrs(layout, feature_axis, **changes):
    return {**dict(block_size=layout.block_size, axis=feature_axis, blocks=layout.blocks,
                   c_blocks=layout.CB, k_blocks=layout.KB), **changes}


def _tables(layout, group=1, updat_group=1):
    f, b = layout.fprop(None, group), layout.bprop(None, group)
    return dict(headers=f.headers, entries=f.entries, dx_headers=b.headers, dx_entries=b.entries,
                dw_groups=layout.updat_groups(updat_group).astype(np.int32))


def _call(lib, kind, layout, feature_axis, a, b, tables=None, **attr_changes):
    """The raw op of ``kind`` on ``a``, ``b``: (x, w), (dy, w) or (x, dy)."""
    t = {**_tables(layout), **(tables or {})}
    attrs = _attrs(layout, feature_axis, **attr_changes)
    if kind == "fprop":
        return lib.module.blocksparse_matmul(a, b, t["headers"], t["entries"], t["dx_headers"],
                                             t["dx_entries"], t["dw_groups"], **attrs)
    if kind == "bprop":
        return lib.module.blocksparse_matmul_dx(a, b, t["dx_headers"], t["dx_entries"], **attrs)
    return lib.module.blocksparse_matmul_dw(a, b, t["dw_groups"], **attrs)


def _activations(layout, axis, n, features):
    return (n, features) if axis == 1 else (features, n)


def _inputs(layout, kind, axis, n):
    """Shapes of the two inputs of ``kind``."""
    C, K = layout.C, layout.K
    if kind == "fprop":
        return _activations(layout, axis, n, C), layout.w_shape
    if kind == "bprop":
        return _activations(layout, axis, n, K), layout.w_shape
    return _activations(layout, axis, n, C), _activations(layout, axis, n, K)


def _graph_op_types(concrete):
    return [op.type for op in concrete.graph.get_operations()]


# ------------------------------------------------------------------------ loading


def test_library_loads_and_registers_its_ops(op_library):
    for name in OPS:
        assert op_def_registry.get(name) is not None, name
    for wrapper in ("blocksparse_matmul", "blocksparse_matmul_dx", "blocksparse_matmul_dw"):
        assert callable(getattr(op_library.module, wrapper))
    assert op_library.archs and set(op_library.archs) <= {80, 86, 89, 90, 100, 120}
    assert ops.built_for(op_library.path) == tf.__version__


# ------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("kind", ["fprop", "bprop", "updat"])
def test_shape_inference_with_unknown_tokens(op_library, kind, axis, dtype):
    lay = Layout(MASK, 16)
    a, b = _inputs(lay, kind, axis, None)
    fn = tf.function(lambda x, y: _call(op_library, kind, lay, axis, x, y),
                     input_signature=[tf.TensorSpec(a, dtype), tf.TensorSpec(b, dtype)])
    out = fn.get_concrete_function().structured_outputs
    expected = {"fprop": _activations(lay, axis, None, lay.K),
                "bprop": _activations(lay, axis, None, lay.C), "updat": lay.w_shape}[kind]
    assert tuple(out.shape.as_list()) == tuple(expected)
    assert out.dtype == (tf.float32 if kind == "updat" else dtype)


def test_shape_inference_with_unknown_rank(op_library):
    lay = Layout(MASK, 32)
    fn = tf.function(lambda x, w: _call(op_library, "fprop", lay, 0, x, w),
                     input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.float32)])
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [lay.K, None]


def test_shape_inference_with_known_tokens(op_library):
    lay = Layout(MASK, 16)
    fn = tf.function(lambda x, dy: _call(op_library, "updat", lay, 1, x, dy),
                     input_signature=[tf.TensorSpec((None, lay.C)), tf.TensorSpec((6, lay.K))])
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == list(lay.w_shape)


# --------------------------------------------------------------- attr / input errors

LAY16 = Layout(MASK, 16)  # C = 48, K = 80
BAD = {
    "x-features": ("fprop", {"a": (4, 40)}, {},
                   r"x must have shape \(N, C\) with C = 48 for axis = 1; got shape \[4,40\]"),
    "x-rank": ("fprop", {"a": (4, 48, 1)}, {}, r"x must have rank 2"),
    "w-shape": ("fprop", {"b": (7, 16, 8)}, {},
                r"w must have shape \(blocks, block_size, block_size\) = \(7, 16, 16\)"),
    "dy-features": ("bprop", {"a": (4, 48)}, {}, r"dy must have shape \(N, K\) with K = 80"),
    "dw-tokens": ("updat", {"a": (4, 48), "b": (5, 80)}, {},
                  r"x and dy must have the same number of tokens N; got 4 and 5"),
    "block-size": ("fprop", {}, {"block_size": 24}, r"block_size must be one of 16, 32, 64, 128"),
    "axis": ("bprop", {}, {"axis": 2}, r"axis must be 1 \(activations \(N, C\)\) or 0"),
    "blocks": ("updat", {}, {"blocks": 16}, r"blocks must be in \[1, c_blocks \* k_blocks\] = \[1, 15\]"),
    "headers": ("fprop", {"headers": np.zeros((3, 3), np.int32)}, {},
                r"headers must have 4 columns; got 3"),
    "entries": ("bprop", {"dx_entries": np.zeros((3, 1), np.int32)}, {},
                r"entries must have 1 \+ G columns \(G >= 1\); got 1"),
    "groups": ("updat", {"dw_groups": np.zeros((3, 4), np.int32)}, {},
               r"groups must have 1 \+ 2G columns \(G >= 1\); got 4"),
    "gradient-table": ("fprop", {"dw_groups": np.zeros((0, 3), np.int32)}, {},
                       r"dw_groups must have at least one row"),
}


def _bad_call(lib, case):
    kind, shapes, attrs = BAD[case][:3]
    a_shape, b_shape = _inputs(LAY16, kind, 1, 4)
    a = tf.zeros(shapes.get("a", a_shape))
    b = tf.zeros(shapes.get("b", b_shape))
    tables = {k: v for k, v in shapes.items() if k not in ("a", "b")}
    return lambda a=a, b=b: _call(lib, kind, LAY16, 1, a, b, tables=tables, **attrs)


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused_when_the_graph_is_built(op_library, case):
    with pytest.raises(ValueError, match=BAD[case][3]):
        tf.function(_bad_call(op_library, case)).get_concrete_function()


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_invalid_argument_in_eager_mode(op_library, case):
    with pytest.raises(tf.errors.InvalidArgumentError, match=BAD[case][3]):
        _bad_call(op_library, case)()


def test_sizes_unknown_until_run_time_are_checked_by_the_kernel(op_library):
    """With no static shape the shape function cannot see the error; the kernel does."""
    lay = LAY16
    fn = tf.function(lambda x, w: _call(op_library, "fprop", lay, 0, x, w),
                     input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"x must have shape \(C, N\) with C = 48 for axis = 0; got shape \[40,3\]"):
        fn(tf.zeros((40, 3)), tf.zeros(lay.w_shape))


@pytest.mark.parametrize("kind", ["fprop", "bprop", "updat"])
def test_a_valid_call_on_the_cpu_says_the_op_runs_on_gpus(op_library, kind):
    a, b = _inputs(LAY16, kind, 1, 3)
    with pytest.raises(tf.errors.UnimplementedError, match="runs on GPUs only; on the CPU blocksparse"):
        _call(op_library, kind, LAY16, 1, tf.zeros(a), tf.zeros(b))


# ------------------------------------------------------------------------ dispatch


def _no_library_warnings(record):
    return [w for w in record if issubclass(w.category, ops.OpLibraryWarning)] == []


def test_on_the_cpu_the_reference_path_serves(op_library, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
    lay = Layout(MASK, 32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert backend.select(lay, 1, tf.bfloat16) is backend.REFERENCE
        bsmm = BlocksparseMatMul(MASK, block_size=32)
        w = np.random.default_rng(0).standard_normal(bsmm.w_shape).astype(np.float32)
        x = np.random.default_rng(1).standard_normal((5, bsmm.C)).astype(np.float32)
        np.testing.assert_allclose(bsmm(x, w).numpy(), x @ lay.dense(w), rtol=1e-5, atol=1e-5)
    assert _no_library_warnings(record)


def test_triton_backend_without_a_gpu_says_so(op_library, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(backend.BackendUnavailableError, match="TensorFlow sees no GPU"):
        backend.select(Layout(MASK, 32), 1, tf.bfloat16)


def _gpu_graph(bsmm, dtype, tokens=None):
    """Trace forward and gradients of ``bsmm`` (ops are built, not run)."""
    w = tf.Variable(tf.zeros(bsmm.w_shape, dtype))

    @tf.function(input_signature=[tf.TensorSpec(bsmm.i_shape(tokens), dtype)])
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = bsmm(x, w)
        return (y, *tape.gradient(y, [x, w]))

    return step.get_concrete_function()


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("arch", [90, 86])
def test_on_a_gpu_the_ops_are_built_with_the_kernels_tables(op_library, gpu_arch, monkeypatch,
                                                           arch, axis):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
    if op_library.group(arch, "fprop", "bf16", 32, axis) is None:
        pytest.skip(f"this library has no kernels for sm_{arch}")
    gpu_arch(arch)
    bsmm = BlocksparseMatMul(MASK, block_size=32, feature_axis=axis, impl="kernels")
    products = backend.select(bsmm.layout, axis, tf.bfloat16)
    assert products.name == f"tf-gpu-sm{arch}"
    concrete = _gpu_graph(bsmm, tf.bfloat16)
    y, dx, dw = concrete.structured_outputs
    assert y.shape.as_list() == list(bsmm.o_shape(None)) and dx.shape.as_list() == list(bsmm.i_shape(None))
    assert dw.shape.as_list() == list(bsmm.w_shape)
    types = _graph_op_types(concrete)
    for name in OPS:
        assert types.count(name) == 1, (name, types)
    graph_ops = {op.type: op for op in concrete.graph.get_operations()}
    fprop, updat = graph_ops["BlocksparseMatmul"], graph_ops["BlocksparseMatmulDW"]
    assert {a: fprop.get_attr(a) for a in ("block_size", "axis", "blocks", "c_blocks", "k_blocks")} \
        == _attrs(bsmm.layout, axis)
    g = {p: op_library.group(arch, p, "bf16", 32, axis) for p in ("fprop", "bprop", "updat")}
    assert fprop.inputs[3].shape.as_list()[1] == 1 + g["fprop"]
    assert fprop.inputs[5].shape.as_list()[1] == 1 + g["bprop"]
    assert updat.inputs[2].shape.as_list()[1] == 1 + 2 * g["updat"]


@pytest.mark.parametrize("arch", [100, 103, 120, 130])
def test_a_newer_gpu_without_cubins_builds_the_ops_on_the_ptx_tables(op_library, gpu_arch, monkeypatch, arch):
    """No cubin serves sm_{arch}: the tables are built with the G of the compute_80 PTX, the kernels
    the runtime then picks (the driver JIT-compiles them)."""
    if not op_library.ptx or any(s["arch"] == arch for s in op_library.specs):
        pytest.skip(f"this library has no PTX, or cubins for sm_{arch}")
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
    gpu_arch(arch)
    for axis in (1, 0):
        for product in ("fprop", "bprop", "updat"):
            ptx = {s["group"] for s in op_library.specs if s["target"] == "compute_80"
                   and (s["product"], s["dtype"], s["block_size"], s["axis"]) == (product, "bf16", 32, axis)}
            assert len(ptx) == 1 and op_library.group(arch, product, "bf16", 32, axis) == ptx.pop()
        assert backend.select(Layout(MASK, 32), axis, tf.bfloat16).name == f"tf-gpu-sm{arch}"


def test_gpu_path_honours_dw_dtype(op_library, gpu_arch):
    gpu_arch(90)
    bsmm = BlocksparseMatMul(MASK, block_size=32, impl="kernels")
    w = tf.Variable(tf.zeros(bsmm.w_shape, tf.bfloat16))

    @tf.function(input_signature=[tf.TensorSpec((None, bsmm.C), tf.bfloat16)])
    def grads(x):
        with tf.GradientTape() as tape:
            y = bsmm(x, w, dw_dtype=tf.bfloat16)
        return tape.gradient(y, w)

    assert grads.get_concrete_function().structured_outputs.dtype == tf.bfloat16


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32], ids=lambda d: d.name)
def test_registered_gradient_of_the_raw_op(op_library, dtype):
    lay = Layout(MASK, 32)

    @tf.function(input_signature=[tf.TensorSpec((None, lay.C), dtype),
                                  tf.TensorSpec(lay.w_shape, dtype)])
    def grads(x, w):
        y = _call(op_library, "fprop", lay, 1, x, w)
        return tf.gradients(y, [x, w])

    concrete = grads.get_concrete_function()
    dx, dw = concrete.structured_outputs
    assert dx.shape.as_list() == [None, lay.C] and dx.dtype == dtype
    assert dw.shape.as_list() == list(lay.w_shape) and dw.dtype == dtype
    types = _graph_op_types(concrete)
    assert types.count("BlocksparseMatmulDX") == 1 and types.count("BlocksparseMatmulDW") == 1
    # the float32 kernels read the weight's blocks transposed, as the JIT launcher passes them
    dx_op = next(op for op in concrete.graph.get_operations() if op.type == "BlocksparseMatmulDX")
    w_source = dx_op.inputs[1].op
    if dtype == tf.float32:
        assert w_source.type == "Transpose"
        assert tf.get_static_value(w_source.inputs[1]).tolist() == [0, 2, 1]
    else:
        assert w_source.type == "Placeholder"


def test_group_param_grads_merges_gpu_products(op_library, gpu_arch):
    gpu_arch(90)
    bsmm = BlocksparseMatMul(MASK, block_size=32, impl="kernels")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.bfloat16, (None, bsmm.C))
        w = tf.compat.v1.placeholder(tf.bfloat16, bsmm.w_shape)
        loss = tf.reduce_sum(bsmm(x, w)) + tf.reduce_sum(bsmm(x * 2, w)) + tf.reduce_sum(bsmm(x, w))
        grad = tf.gradients(loss, w)[0]
        before = [op.type for op in graph.get_operations()].count("BlocksparseMatmulDW")
        merged = group_param_grads(grad, group_size=8)
        after = [op.type for op in graph.get_operations()].count("BlocksparseMatmulDW")
    assert before == 3 and after == 4  # one merged product of the three uses
    assert merged.dtype == tf.float32 and merged.shape.as_list() == list(bsmm.w_shape)


def test_xla_takes_the_reference_path(op_library, gpu_arch):
    gpu_arch(90)
    bsmm = BlocksparseMatMul(MASK, block_size=32)
    fn = tf.function(lambda x, w: bsmm(x, w), jit_compile=True,
                     input_signature=[tf.TensorSpec((None, bsmm.C)), tf.TensorSpec(bsmm.w_shape)])
    assert not set(OPS) & set(_graph_op_types(fn.get_concrete_function()))


def test_block_size_8_takes_the_reference_path_even_with_triton(op_library, gpu_arch, monkeypatch):
    gpu_arch(90)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    assert backend.select(Layout(MASK, 8), 1, tf.float32) is backend.REFERENCE


def test_a_gpu_without_kernels_warns_once_and_uses_the_reference_path(op_library, gpu_arch,
                                                                      monkeypatch):
    ops.warn_once.reset()
    gpu_arch(75)  # older than any target: neither a cubin nor the PTX serves it
    lay = Layout(MASK, 32)
    with pytest.warns(ops.OpLibraryWarning, match=r"no kernels for this GPU \(sm_75\)"):
        assert backend.select(lay, 1, tf.bfloat16) is backend.REFERENCE
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert backend.select(lay, 0, tf.bfloat16) is backend.REFERENCE
    assert _no_library_warnings(record)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(backend.BackendUnavailableError, match="sm_75"):
        backend.select(lay, 1, tf.bfloat16)


def test_missing_kernels_for_a_dtype_fall_back(op_library, gpu_arch, monkeypatch):
    """The test build holds bf16 kernels of block size 32 only (a wheel holds them all)."""
    if op_library.group(90, "fprop", "fp16", 64, 1) is not None:
        pytest.skip("this library has the fp16 / 64 kernels")
    ops.warn_once.reset()
    gpu_arch(90)
    with pytest.warns(ops.OpLibraryWarning, match="float16 blocks of 64"):
        assert backend.select(Layout(MASK, 64), 1, tf.float16) is backend.REFERENCE


# ------------------------------------------------------------- the loader's warning


@pytest.fixture
def library_at(monkeypatch, gpu_arch):
    """Point BLOCKSPARSE_TF_OPS at a path; pretend there is a GPU (so that auto tries to load)."""
    gpu_arch(90)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")

    def use(path):
        monkeypatch.setenv("BLOCKSPARSE_TF_OPS", str(path))
        return path

    return use


def _select_twice_warns_once(match):
    lay = Layout(MASK, 32)
    with pytest.warns(ops.OpLibraryWarning, match=match) as first:
        assert backend.select(lay, 1, tf.bfloat16) is backend.REFERENCE
    assert len([w for w in first if issubclass(w.category, ops.OpLibraryWarning)]) == 1
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert backend.select(lay, 0, tf.float32) is backend.REFERENCE
    assert _no_library_warnings(again)
    return str(first[0].message)


def test_missing_library_warns_once(library_at, tmp_path):
    path = library_at(tmp_path / "missing" / "_tf_ops.so")
    message = _select_twice_warns_once("it is not installed")
    assert str(path) in message and "reference path" in message and "make compile" in message


def test_library_for_another_tensorflow_is_not_loaded(op_library_path, library_at, tmp_path):
    major, minor = tf.__version__.split(".")[:2]
    other = f"{major}.{int(minor) + 1}.0"
    data = op_library_path.read_bytes()
    stamp = f"blocksparse-tf-version={tf.__version__}\n".encode()
    assert stamp in data
    copy = tmp_path / "_tf_ops.so"
    copy.write_bytes(data.replace(stamp, f"blocksparse-tf-version={other}\n".encode()))
    library_at(copy)
    message = _select_twice_warns_once(f"built for TensorFlow {other}")
    assert f"this is TensorFlow {tf.__version__}" in message
    assert f"blocksparse[tensorflow]~={major}.{minor}.0" in message


def test_a_file_without_the_stamp_is_not_loaded(library_at, tmp_path):
    path = tmp_path / "_tf_ops.so"
    path.write_bytes(b"\x7fELF not really")
    library_at(path)
    _select_twice_warns_once("not a blocksparse op library")


def test_a_library_that_fails_to_load_is_reported(library_at, tmp_path):
    path = tmp_path / "_tf_ops.so"
    path.write_bytes(f"garbage blocksparse-tf-version={tf.__version__}\n".encode())
    library_at(path)
    _select_twice_warns_once("could not be loaded")


def test_triton_backend_says_why_the_library_is_unavailable(library_at, tmp_path, monkeypatch):
    library_at(tmp_path / "nowhere.so")
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(backend.BackendUnavailableError, match="it is not installed"):
        backend.select(Layout(MASK, 32), 1, tf.float32)


def test_reference_backend_never_loads_the_library(monkeypatch, gpu_arch):
    gpu_arch(90)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    monkeypatch.setattr(ops, "load", lambda path: pytest.fail("the library was loaded"))
    assert backend.select(Layout(MASK, 32), 1, tf.float32) is backend.REFERENCE


# ------------------------------------------------------------------------ build_info


def test_build_info_of_a_source_tree(monkeypatch, tmp_path):
    monkeypatch.setattr(_manifest, "MANIFEST", tmp_path / "_build_info.json")
    info = blocksparse.build_info()
    assert info["compiled"] is False and info["version"] == blocksparse.__version__
    assert "make compile" in info["reason"]


def test_build_info_of_a_build(op_library, monkeypatch):
    manifest = op_library.path.replace("_tf_ops.so", "_build_info.json")
    monkeypatch.setattr(_manifest, "MANIFEST", type(_manifest.MANIFEST)(manifest))
    info = blocksparse.build_info()
    assert info["compiled"] is True and info["tensorflow"] == tf.__version__
    major, minor = (int(p) for p in tf.__version__.split(".")[:2])
    assert info["tensorflow_window"] == f">={major}.{minor},<{major}.{minor + 1}"
    assert info["archs"] == [f"sm_{a}" for a in op_library.archs]
    assert info["ptx"] == [f"compute_{a}" for a in op_library.ptx]
    assert [s["name"] for s in info["specializations"]] == [s["name"] for s in op_library.specs]
    serving = blocksparse.build_info(arch=130)["serving"]  # a GPU no cubin serves
    assert serving["image"] == ("ptx" if op_library.ptx else None)
    assert info["platform_tag"].startswith("manylinux_2_") and info["cuda"].startswith("12.")
    assert info["library_bytes"] > info["cubin_bytes"] > 0
    if shutil.which("git") and info["git_revision"]:
        assert len(info["git_revision"]) == 40
    info["archs"].append("changed")  # a copy: the next call is unaffected
    assert json.loads(open(manifest).read())["archs"] == blocksparse.build_info()["archs"]


def test_a_cpu_device_scope_takes_the_reference_path(op_library, gpu_arch, monkeypatch):
    gpu_arch(90)
    lay = Layout(MASK, 32)
    with tf.device("/cpu:0"):
        assert backend.select(lay, 1, tf.bfloat16) is backend.REFERENCE
    assert backend.select(lay, 1, tf.bfloat16).name == "tf-gpu-sm90"
    bsmm = BlocksparseMatMul(MASK, block_size=32)

    def traced(x, w):
        with tf.device("/device:CPU:0"):
            return bsmm(x, w)

    fn = tf.function(traced, input_signature=[tf.TensorSpec((None, bsmm.C), tf.bfloat16),
                                              tf.TensorSpec(bsmm.w_shape, tf.bfloat16)])
    assert not set(OPS) & set(_graph_op_types(fn.get_concrete_function()))
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with tf.device("/cpu:0"), pytest.raises(backend.BackendUnavailableError, match="on the CPU"):
        backend.select(lay, 1, tf.bfloat16)
