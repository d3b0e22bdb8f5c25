"""The transformer ops of the TensorFlow op library on a CPU-only machine: registration (tables and
scalars in host memory), shape inference (unknown batch and features), attr and shape errors
(InvalidArgument naming the argument, at trace or run time), the CPU kernels' answer, and
``BlocksparseTransformer``'s choice of the GPU ops where a GPU library with the family's kernels is
present (mocked: a GPU arch and the specs), the reference path otherwise.  Kernel numerics are
checked on a GPU (scripts/verify_transformer_aot.py)."""
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import kernels as registered, op_def_registry  # noqa: E402

from blocksparse._tf import dispatch, loader  # noqa: E402
from blocksparse._tf.transformer import backend, gpu  # noqa: E402
from blocksparse.ops.transformer import aot  # noqa: E402
from blocksparse.ops.transformer.lut import AttentionLayout  # noqa: E402
from blocksparse.testing import attention as ref  # noqa: E402
from blocksparse.transformer import BlocksparseTransformer  # noqa: E402
from tf_op_build import check_refused, fake_spec  # noqa: E402

OPS = ("BlocksparseTransformerNT", "BlocksparseTransformerXN", "BlocksparseTransformerSoftmax",
       "BlocksparseTransformerSoftmaxGrad")
HOST = {"BlocksparseTransformerNT": {"coords"},
        "BlocksparseTransformerXN": {"coords", "offsets", "block_ids"},
        "BlocksparseTransformerSoftmax": {"scale", "autoregress_at_key", "row_offsets", "coords", "mask_index",
                                          "mask_bits"},
        "BlocksparseTransformerSoftmaxGrad": {"scale", "row_offsets"}}
LAYOUT = AttentionLayout(np.tril(np.ones((4, 4))), 16, heads=2)   # 10 blocks, shared by both heads
NO_MASKS = np.zeros([0], np.int32)


def _attrs(lay=LAYOUT, **changes):
    return {**dict(block_size=lay.block_size, heads=lay.heads, lut_heads=lay.lut_heads, blocks=lay.blocks,
                   q_blocks=lay.QB, k_blocks=lay.KB), **changes}


def _nt(m, a=(2, 64, 32), b=(2, 64, 32), coords=LAYOUT.coords, **changes):
    return m.blocksparse_transformer_nt(tf.zeros(a), tf.zeros(b), coords, **_attrs(**changes))


def _xn(m, w=(2, 2, 10, 16, 16), x=(2, 64, 32), offsets=LAYOUT.row_offsets, trans=False, **changes):
    return m.blocksparse_transformer_xn(tf.zeros(w), tf.zeros(x), LAYOUT.coords, offsets, LAYOUT.col_blocks,
                                        trans=trans, **_attrs(**changes))


def _softmax(m, x=(2, 2, 10, 16, 16), scale=0.5, ar=0, index=NO_MASKS, bits=NO_MASKS, masked=False, **changes):
    return m.blocksparse_transformer_softmax(tf.zeros(x), scale, ar, LAYOUT.row_offsets, LAYOUT.coords, index,
                                             bits, masked=masked, autoregress=True, **_attrs(**changes))


def _softmax_grad(m, dy=(2, 2, 10, 16, 16), y=(2, 2, 10, 16, 16), **changes):
    return m.blocksparse_transformer_softmax_grad(tf.zeros(dy), tf.zeros(y), 0.5, LAYOUT.row_offsets,
                                                  **_attrs(**changes))


def test_the_ops_are_registered_with_tables_and_scalars_in_host_memory(op_library):
    for name in OPS:
        assert op_def_registry.get(name) is not None, name
        kernels = {k.device_type: k for k in registered.get_registered_kernels_for_op(name).kernel}
        assert set(kernels) == {"CPU", "GPU"}
        assert set(kernels["GPU"].host_memory_arg) == HOST[name] and not kernels["CPU"].host_memory_arg
    for wrapper in ("nt", "xn", "softmax", "softmax_grad"):
        assert callable(getattr(op_library.module, f"blocksparse_transformer_{wrapper}"))


def test_shapes_with_unknown_batch_and_features(op_library):
    m, at = op_library.module, _attrs()

    @tf.function(input_signature=[tf.TensorSpec((None, 64, None), tf.bfloat16)] * 2)
    def fn(q, k):
        w = m.blocksparse_transformer_nt(q, k, LAYOUT.coords, **at)
        y = m.blocksparse_transformer_softmax(w, 0.5, 0, LAYOUT.row_offsets, LAYOUT.coords, NO_MASKS, NO_MASKS,
                                              masked=False, autoregress=False, **at)
        dx = m.blocksparse_transformer_softmax_grad(y, y, 0.5, LAYOUT.row_offsets, **at)
        o = m.blocksparse_transformer_xn(dx, k, LAYOUT.coords, LAYOUT.row_offsets, LAYOUT.col_blocks, trans=False,
                                         **at)
        assert w.shape.as_list() == y.shape.as_list() == dx.shape.as_list() == [None, 2, 10, 16, 16]
        assert o.shape.as_list() == [None, 64, None] and o.dtype == tf.bfloat16
        return o

    fn.get_concrete_function()


def test_shapes_of_tn_with_known_sizes(op_library):
    lay = AttentionLayout(np.ones((2, 3, 5)), 32)   # per-head layout, ctx_q 96, ctx_k 160
    y = tf.function(lambda w, x: op_library.module.blocksparse_transformer_xn(
        w, x, lay.coords, lay.col_offsets, lay.col_blocks, trans=True, **_attrs(lay))).get_concrete_function(
        tf.TensorSpec((3, 2, 15, 32, 32), tf.float16), tf.TensorSpec((3, 96, 128), tf.float16)).outputs[0]
    assert y.shape.as_list() == [3, 160, 128]


BAD = {
    "block-size-8": (_nt, dict(block_size=8), "block_size must be one of 16, 32, 64, 128"),
    "lut-heads": (_nt, dict(lut_heads=3), "lut_heads must be 1 or heads = 2"),
    "blocks": (_nt, dict(blocks=17), r"blocks must be in \[1, q_blocks \* k_blocks\] = \[1, 16\]"),
    "a-ctx": (_nt, dict(a=(2, 48, 32)), r"a must have shape \(batch, ctx_q, heads \* head_dim\) = \(\?, 64, \?\)"),
    "b-rank": (_nt, dict(b=(2, 64)), r"b must have shape \(batch, ctx_k, heads \* head_dim\)"),
    "features-heads": (_nt, dict(a=(2, 64, 31), b=(2, 64, 31)), "31 features are not a positive multiple of heads"),
    "features-differ": (_nt, dict(b=(2, 64, 64)), "a and b must have the same features"),
    "batch-differs": (_nt, dict(b=(3, 64, 32)), "a and b must have the same batch size; got 2 and 3"),
    "coords": (_nt, dict(coords=LAYOUT.row_offsets), r"coords must have shape \(lut_heads, blocks, 2\)"),
    "w-blocks": (_xn, dict(w=(2, 2, 9, 16, 16)), r"w must have shape \(batch, heads, blocks, bs, bs\)"),
    "x-batch": (_xn, dict(x=(3, 64, 32)), "w and x must have the same batch size"),
    "tn-offsets": (_xn, dict(trans=True, offsets=np.zeros((1, 4), np.int32)),
                   r"offsets must have shape \(lut_heads, k_blocks \+ 1\) = \(1, 5\)"),
    "scale-rank": (_softmax, dict(scale=[0.5]), r"scale must have shape \(\); got shape \(1,\)"),
    "x-shape": (_softmax, dict(x=(2, 2, 10, 16, 8)), r"x must have shape \(batch, heads, blocks, bs, bs\)"),
    "mask-index": (_softmax, dict(masked=True), r"mask_index must have shape \(lut_heads, blocks\) = \(1, 10\)"),
    "mask-bits": (_softmax, dict(masked=True, index=-np.ones((1, 10), np.int32), bits=np.zeros((1, 16, 2), np.int32)),
                  r"mask_bits must have shape \(masks, bs, ceil\(bs / 32\)\) = \(\?, 16, 1\)"),
    "grad-batch": (_softmax_grad, dict(y=(1, 2, 10, 16, 16)), "dy and y must have the same batch size"),
}


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_refused(op_library, case, mode):
    """When the graph is built (shape functions) and in eager mode (the kernels): InvalidArgument."""
    check_refused(op_library.module, BAD[case], mode)


def test_sizes_unknown_until_run_time_are_checked_by_the_kernel(op_library):
    m = op_library.module
    fn = tf.function(lambda a, b: m.blocksparse_transformer_nt(a, b, LAYOUT.coords, **_attrs()),
                     input_signature=[tf.TensorSpec(None, tf.float32)] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="a and b must have the same batch size; got 2 and 1"):
        fn(tf.zeros([2, 64, 32]), tf.zeros([1, 64, 32]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="autoregress_at_key must be >= 0; got -3"):
        _softmax(m, ar=-3)


@pytest.mark.parametrize("build", [_nt, _xn, _softmax, _softmax_grad], ids=["nt", "xn", "softmax", "softmax_grad"])
def test_a_valid_call_on_the_cpu_says_the_op_runs_on_gpus(op_library, build):
    with pytest.raises(tf.errors.UnimplementedError, match="runs on GPUs only; on the CPU blocksparse"):
        build(op_library.module)


# ------------------------------------------------------------------------ dispatch

def _specs(dtype="bf16", block_size=32, bds=(64,)):
    """Manifest records of the family's sm_90 kernels for ``dtype`` (and float32's softmax) and ``block_size``,
    products of the head slices ``bds``."""
    return tuple(fake_spec("transformer", **aot.fields(s)) for s in aot.specializations((90,))
                 if s.block_size == block_size and (s.dtype == dtype or s.product.startswith("softmax") and
                                                    s.dtype == "fp32") and s.bd in (0, *bds))


def _attention_graph(bst, features=2 * 64, dtype=tf.bfloat16, softmax_dtype=None, jit=False):
    """The op types (and ops) of a tf.function computing attention and every gradient."""
    def fn(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            w = bst.masked_softmax(bst.query_key_op(q, k), scale=tf.constant(0.125), autoregress_at_key=0,
                                   dtype=softmax_dtype)
            loss = tf.reduce_sum(tf.cast(bst.weight_value_op(tf.cast(w, q.dtype), v), tf.float32))
        return tape.gradient(loss, [q, k, v])

    spec = [tf.TensorSpec((None, bst.ctx_q, features), dtype)] * 3
    graph = tf.function(fn, input_signature=spec, jit_compile=jit, autograph=False).get_concrete_function().graph
    return {op.type for op in graph.get_operations()}, graph.get_operations()


@pytest.fixture
def bst():
    return BlocksparseTransformer(ref.causal_layout(4), 32, heads=2, mask_callback=ref.diagonal_causal)


def test_attention_takes_the_gpu_ops_and_their_gradients(gpu_library_with, bst):
    gpu_library_with(*_specs())
    types, operations = _attention_graph(bst)
    assert set(OPS) <= types
    assert not {"UnsortedSegmentSum", "UnsortedSegmentMax"} & types   # nothing of the reference path
    xn = [op for op in operations if op.type == "BlocksparseTransformerXN"]
    assert {op.get_attr("trans") for op in xn} == {False, True}       # nn and tn
    softmax = next(op for op in operations if op.type == "BlocksparseTransformerSoftmax")
    assert softmax.get_attr("masked") and softmax.get_attr("autoregress") and softmax.get_attr("T") == tf.bfloat16
    for op in operations:   # every table comes straight from a host constant of the layout's
        if op.type in OPS:
            tables = [t for t in op.inputs if t.dtype == tf.int32 and t.op.type == "Const"]
            assert len(tables) == len(HOST[op.type] - {"scale"}), op.type
    coords = next(op for op in operations if op.type == "BlocksparseTransformerNT").inputs[2]
    np.testing.assert_array_equal(tf.get_static_value(coords), bst.layout.coords)


def test_a_softmax_into_another_dtype_runs_in_float32(gpu_library_with, bst):
    gpu_library_with(*_specs())
    _, operations = _attention_graph(bst, softmax_dtype=tf.float32)
    softmax = [op for op in operations if op.type.startswith("BlocksparseTransformerSoftmax")]
    assert softmax and all(op.get_attr("T") == tf.float32 for op in softmax)


def test_second_order_gradients_build_on_the_gpu_ops(gpu_library_with, bst):
    """The gradient ops have no registered gradient: the second order of the softmax takes its
    reference formula's, that of the products the products again."""
    gpu_library_with(*_specs())

    def fn(q, k):
        with tf.GradientTape() as outer:
            outer.watch([q, k])
            with tf.GradientTape() as inner:
                inner.watch(q)
                loss = tf.reduce_sum(tf.cast(bst.masked_softmax(bst.query_key_op(q, k), scale=0.5), tf.float32))
            total = tf.reduce_sum(tf.cast(inner.gradient(loss, q), tf.float32))
        return outer.gradient(total, [q, k])

    spec = tf.TensorSpec((None, bst.ctx_q, 2 * 64), tf.bfloat16)
    graph = tf.function(fn, input_signature=[spec, spec], autograph=False).get_concrete_function().graph
    assert set(OPS) <= {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("features", [2 * 24, None], ids=["head-dim-24", "unknown-features"])
def test_products_the_kernels_cannot_take_are_silently_the_reference_path(gpu_library_with, bst, monkeypatch,
                                                                        features):
    gpu_library_with(*_specs())
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")   # not even triton insists: no kernel exists
    with warnings.catch_warnings():
        warnings.simplefilter("error", loader.OpLibraryWarning)
        types, _ = _attention_graph(bst, features)
    assert not {"BlocksparseTransformerNT", "BlocksparseTransformerXN"} & types
    assert "BlocksparseTransformerSoftmax" in types


def test_a_head_slice_the_library_lacks_warns_and_takes_the_reference_path(gpu_library_with, bst, monkeypatch):
    gpu_library_with(*_specs(bds=(32,)))   # head_dim 64 needs the 64-wide slice
    loader.warn_once.reset()
    with pytest.warns(loader.OpLibraryWarning, match="transformer products of head_dim 64 on bfloat16 blocks of 32"):
        types, _ = _attention_graph(bst)
    assert not {"BlocksparseTransformerNT", "BlocksparseTransformerXN"} & types
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(dispatch.BackendUnavailableError, match="transformer products"):
        _attention_graph(bst)


def test_xla_a_cpu_scope_or_another_gpu_take_the_reference_path(gpu_library_with, bst):
    gpu_library_with(*_specs())
    assert not set(OPS) & _attention_graph(bst, jit=True)[0]
    with tf.device("/CPU:0"):
        assert not set(OPS) & _attention_graph(bst)[0]
    gpu_library_with(*_specs(), arch=80)   # the specs are sm_90 cubins
    loader.warn_once.reset()
    with pytest.warns(loader.OpLibraryWarning, match="sm_80"):
        assert not set(OPS) & _attention_graph(bst)[0]


def test_select(gpu_library_with, monkeypatch):
    lib = gpu_library_with(*_specs())
    assert backend.select(32, tf.bfloat16, 64).name == "tf-gpu-sm90"
    assert backend.select(32, tf.bfloat16).name == "tf-gpu-sm90"       # the softmax
    for args in [(8, tf.bfloat16, 64), (32, tf.float64, 64), (32, tf.bfloat16, 40), (32, tf.bfloat16, None)]:
        assert backend.select(*args) is backend.REFERENCE, args
    assert gpu.products(lib, 90, 32, tf.float16, 64) is None             # no float16 kernels here
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    assert backend.select(32, tf.bfloat16, 64) is backend.REFERENCE


def test_without_transformer_kernels_the_reference_path_serves(op_library, gpu_arch, bst):
    """A GPU but the real test library (no transformer kernels in it): the reference path."""
    gpu_arch(90)
    if any(s["family"] == "transformer" for s in op_library.specs):
        pytest.skip("this library holds transformer kernels")
    loader.warn_once.reset()
    with pytest.warns(loader.OpLibraryWarning):
        assert not set(OPS) & _attention_graph(bst)[0]


def test_eager_tables_are_host_tensors_made_once_per_layout():
    lay, other = AttentionLayout(np.ones((2, 2)), 16, heads=2), AttentionLayout(np.ones((2, 2)), 16, heads=2)
    first = gpu.host_tables(lay)
    assert gpu.host_tables(lay) is first and gpu.host_tables(other) is not first
    for name, tensor in first.items():
        assert tf.DeviceSpec.from_string(tensor.device).device_type == "CPU", name
    np.testing.assert_array_equal(first["col_blocks"].numpy(), lay.col_blocks)
