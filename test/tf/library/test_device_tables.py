"""How the GPU path's lookup tables reach the device, checked without a GPU: the GPU kernels take
every table in host memory (so TensorFlow copies none to the device at a step: each kernel uploads
a table once and keeps it, src/tf/device_tables.h); graphs (tf.function, v1) hold the tables as
constants feeding the ops directly; eager calls pass the same host tensors of a layout every step,
and two layouts (even of equal sizes, sharing one eager kernel) their own."""
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import kernels as registered, op_def_registry  # noqa: E402

from blocksparse._tf.matmul import backend, gpu  # noqa: E402
from blocksparse.layout import Layout  # noqa: E402
from blocksparse.matmul import BlocksparseMatMul  # noqa: E402

# two layouts of equal sizes (CB = 3, KB = 5, seven blocks): equal attrs, different tables
MASK_A = [[1, 0, 1, 1, 0], [0, 1, 0, 0, 1], [1, 1, 0, 0, 0]]
MASK_B = [[0, 1, 1, 0, 1], [1, 0, 0, 1, 0], [0, 0, 1, 0, 1]]
OPS = ("BlocksparseMatmul", "BlocksparseMatmulDX", "BlocksparseMatmulDW")


def _table_inputs(op_name):
    return [a.name for a in op_def_registry.get(op_name).input_arg if a.type == tf.int32.as_datatype_enum]


@pytest.mark.parametrize("op_name", OPS)
def test_gpu_kernels_take_every_table_in_host_memory(op_library, op_name):
    tables = _table_inputs(op_name)
    assert tables, op_name
    kernels = {k.device_type: k for k in registered.get_registered_kernels_for_op(op_name).kernel}
    assert set(kernels) == {"CPU", "GPU"}
    assert set(kernels["GPU"].host_memory_arg) == set(tables)
    assert not kernels["CPU"].host_memory_arg


def _check_tables_are_constants(graph_ops, layout, groups):
    """Each op's table inputs come straight from constants holding ``layout``'s tables."""
    seen = {name: 0 for name in OPS}
    for op in graph_ops:
        if op.type not in OPS:
            continue
        seen[op.type] += 1
        for tensor in op.inputs:
            if tensor.dtype != tf.int32:
                continue
            source = tensor.op
            assert source.type == "Const", (op.type, source.type)
            assert "GPU" not in source.device.upper()
        names = _table_inputs(op.type)
        values = {n: tf.get_static_value(op.inputs[[a.name for a in op.op_def.input_arg].index(n)].op.outputs[0])
                  for n in names}
        if op.type == "BlocksparseMatmulDW":
            np.testing.assert_array_equal(values["groups"], layout.updat_groups(groups["updat"]))
        else:
            kind = "fprop" if op.type == "BlocksparseMatmul" else "bprop"
            lut = getattr(layout, kind)(None, group=groups[kind])
            np.testing.assert_array_equal(values["headers"], lut.headers)
            np.testing.assert_array_equal(values["entries"], lut.entries)
    assert seen == {name: 1 for name in OPS}, seen


def _groups(library, axis=1):
    return {p: library.group(90, p, "bf16", 32, axis) for p in ("fprop", "bprop", "updat")}


@pytest.fixture
def on_gpu(op_library, gpu_arch, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
    if op_library.group(90, "fprop", "bf16", 32, 1) is None:
        pytest.skip("this library has no bf16 / 32 kernels for sm_90")
    gpu_arch(90)
    return op_library


def test_a_tf_function_feeds_the_ops_constant_tables(on_gpu):
    bsmm = BlocksparseMatMul(MASK_A, block_size=32, impl="kernels")
    w = tf.Variable(tf.zeros(bsmm.w_shape, tf.bfloat16))

    @tf.function(input_signature=[tf.TensorSpec((None, bsmm.C), tf.bfloat16)])
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = bsmm(x, w)
        return (y, *tape.gradient(y, [x, w]))

    graph = step.get_concrete_function().graph
    _check_tables_are_constants(graph.get_operations(), bsmm.layout, _groups(on_gpu))


def test_a_v1_graph_feeds_the_ops_constant_tables(on_gpu):
    bsmm = BlocksparseMatMul(MASK_B, block_size=32, impl="kernels")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.bfloat16, (None, bsmm.C))
        w = tf.compat.v1.placeholder(tf.bfloat16, bsmm.w_shape)
        y = bsmm(x, w)
        tf.gradients(tf.reduce_sum(y), [x, w])
    _check_tables_are_constants(graph.get_operations(), bsmm.layout, _groups(on_gpu))


class _Recorder:
    """Stands in for the op wrappers: records the table arguments of each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **attrs):
        self.calls.append([a for a in args if isinstance(a, tf.Tensor) and a.dtype == tf.int32])
        return tf.zeros((1,))


def test_eager_calls_pass_each_layout_s_own_host_tables_every_step(on_gpu, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(on_gpu.module, "blocksparse_matmul", recorder)
    layout_a, layout_b = Layout(np.array(MASK_A), 32), Layout(np.array(MASK_B), 32)
    products = gpu.products(on_gpu, 90, layout_a, 1, tf.bfloat16)
    x, w = tf.zeros((4, layout_a.C), tf.bfloat16), tf.zeros(layout_a.w_shape, tf.bfloat16)
    for layout in (layout_a, layout_b, Layout(np.array(MASK_A), 32), layout_b):  # an equal layout: its tables
        products.fprop(x, w, layout, 1)
    first, other, again, other_again = recorder.calls
    assert len(first) == 5  # fprop headers / entries, bprop headers / entries, updat groups
    assert all(a is b for a, b in zip(first, again)) and all(a is b for a, b in zip(other, other_again))
    assert not any(a is b for a, b in zip(first, other))
    assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(first, other))
    for tensor in first + other:
        assert tf.DeviceSpec.from_string(tensor.device).device_type == "CPU"
    groups = _groups(on_gpu)
    lut = layout_b.fprop(None, group=groups["fprop"])
    np.testing.assert_array_equal(other[0].numpy(), lut.headers)
    np.testing.assert_array_equal(other[1].numpy(), lut.entries)
    np.testing.assert_array_equal(other[4].numpy(), layout_b.updat_groups(groups["updat"]))


@pytest.mark.parametrize("kind", ["fprop", "bprop", "updat"])
def test_host_tables_are_keyed_by_layout_kind_and_group(kind):
    layout_a, layout_b = Layout(np.array(MASK_A), 32), Layout(np.array(MASK_B), 32)
    a = gpu.host_tables(layout_a, kind, 1)
    assert gpu.host_tables(Layout(np.array(MASK_A), 32), kind, 1) is a
    assert gpu.host_tables(layout_b, kind, 1) is not a
    assert gpu.host_tables(layout_a, kind, 2) is not a
    assert gpu.host_tables(Layout(np.array(MASK_A), 64), kind, 1) is not a
    with tf.Graph().as_default():  # building a graph: numpy arrays, which become constants
        arrays = gpu.host_tables(layout_a, kind, 1)
    assert all(isinstance(t, np.ndarray) and t.dtype == np.int32 for t in arrays)
    for tensor, array in zip(a, arrays):
        np.testing.assert_array_equal(tensor.numpy(), array)


def test_backend_products_reach_the_host_tables(on_gpu):
    """The products the dispatcher hands out are the GPU path's (the ones checked above)."""
    layout = Layout(np.array(MASK_A), 32)
    assert backend.select(layout, 1, tf.bfloat16).name == "tf-gpu-sm90"


def test_the_kernels_table_cache_in_cpp(tmp_path):
    """src/tf/device_tables.h, compiled against this TensorFlow with stand-ins for the GPU
    allocation and the upload: uploads once per table, finds a table by buffer and by contents,
    keeps layouts of equal shapes apart, evicts the oldest past its bound."""
    import shutil
    import subprocess

    from tf_op_build import ROOT

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    from blocksparse.aot import native

    binary = tmp_path / "device_tables_test"
    command = [cxx, "-std=c++17", "-O1", *tf.sysconfig.get_compile_flags(), f"-I{ROOT / 'src' / 'tf'}",
               f"-I{native.RUNTIME_DIR}", str(Path(__file__).with_name("native") / "device_tables_test.cc"),
               "-o", str(binary), *tf.sysconfig.get_link_flags()]
    built = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    lib_dir = next(f[2:] for f in tf.sysconfig.get_link_flags() if f.startswith("-L"))
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60,
                         env={"LD_LIBRARY_PATH": lib_dir})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.count("ok ") == 10 and "FAIL" not in ran.stdout, ran.stdout
