"""The norms and LSTM ops of the TensorFlow op library on a CPU-only machine: registration, shape
inference (unknown N), attr and shape errors (InvalidArgument at trace or run time), the CPU
kernels' answer, and the frontends' choice of the GPU ops where a GPU library with the family's
kernels is present (mocked: a GPU arch and the specs).  Kernel numerics are checked on a GPU."""
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import op_def_registry  # noqa: E402

from blocksparse import lstm, norms  # noqa: E402
from blocksparse._tf import dispatch, loader  # noqa: E402
from tf_op_build import check_refused, fake_spec as _spec  # noqa: E402

OPS = ("BlocksparseLayerNorm", "BlocksparseLayerNormGrad", "BlocksparseLstmGates", "BlocksparseLstmGatesGrad")


def _op_types(concrete):
    return {op.type for op in concrete.graph.get_operations()}


def _ln_attrs(**changes):
    return {**dict(axis=1, segments=1, epsilon=1e-6, relu=False), **changes}


def _lstm_attrs(**changes):
    return {**dict(forget_bias=1.0, has_bias=False), **changes}


def test_the_ops_are_registered(op_library):
    for name in OPS:
        assert op_def_registry.get(name) is not None, name
    for wrapper in ("blocksparse_layer_norm", "blocksparse_layer_norm_grad", "blocksparse_lstm_gates",
                    "blocksparse_lstm_gates_grad"):
        assert callable(getattr(op_library.module, wrapper))


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_layer_norm_shapes_with_unknown_tokens(op_library, axis):
    m = op_library.module
    shape = (None, 64) if axis == 1 else (64, None)

    @tf.function(input_signature=[tf.TensorSpec(shape, tf.bfloat16)])
    def fn(x):
        y, mean, rstd = m.blocksparse_layer_norm(x, tf.ones([64]), tf.zeros([64]), **_ln_attrs(axis=axis, segments=4))
        dx, dg, db = m.blocksparse_layer_norm_grad(y, x, tf.ones([64]), tf.zeros([64]), mean, rstd,
                                                    **_ln_attrs(axis=axis, segments=4))
        assert y.shape.as_list() == list(shape) and y.dtype == tf.bfloat16
        assert mean.shape.as_list() == rstd.shape.as_list() == [4, None]
        assert dx.shape.as_list() == list(shape) and dg.shape.as_list() == db.shape.as_list() == [64]
        return y

    fn.get_concrete_function()


@pytest.mark.parametrize("num_gates", [1, 4], ids=["merged", "four"])
def test_lstm_gates_shapes_with_unknown_tokens(op_library, num_gates):
    m = op_library.module
    width = 4 * 32 if num_gates == 1 else 32

    @tf.function(input_signature=[tf.TensorSpec((None, 32), tf.float16), tf.TensorSpec((None, width), tf.float16)])
    def fn(c, h):
        gates = [h] * num_gates
        bias = tf.zeros([128])
        c_next, h_next = m.blocksparse_lstm_gates(c, gates, bias, **_lstm_attrs(has_bias=True))
        out = m.blocksparse_lstm_gates_grad(c, gates, bias, c_next, h_next, **_lstm_attrs(has_bias=True))
        assert c_next.shape.as_list() == h_next.shape.as_list() == [None, 32]
        assert out[0].shape.as_list() == [None, 32]
        assert [t.shape.as_list() for t in out[1]] == [[None, width]] * num_gates   # the dgates list
        assert out[-1].shape.as_list() == [128] and out[-1].dtype == tf.float32
        return c_next

    fn.get_concrete_function()


def _layer_norm(m, x=(8, 64), g=64, b=64, **attrs):
    return m.blocksparse_layer_norm(tf.ones(x, tf.bfloat16), tf.ones([g]), tf.zeros([b]), **_ln_attrs(**attrs))


def _lstm(m, c=(8, 32), gates=((8, 128),), bias=0, **attrs):
    return m.blocksparse_lstm_gates(tf.zeros(c), [tf.zeros(s) for s in gates], tf.zeros([bias]),
                                    **_lstm_attrs(**attrs))


BAD = {
    "ln-axis-2": (_layer_norm, dict(axis=2), "axis must be 1"),
    "ln-segments-0": (_layer_norm, dict(segments=0), "segments must be >= 1"),
    "ln-epsilon-0": (_layer_norm, dict(epsilon=0.0), "epsilon must be > 0"),
    "ln-segments-divide": (_layer_norm, dict(segments=3), "multiple of segments = 3"),
    "ln-rank-3": (_layer_norm, dict(x=(2, 8, 64)), r"x must have shape \(N, C\)"),
    "ln-g-size": (_layer_norm, dict(g=32), r"g must have shape \(C,\) = \(64,\)"),
    "ln-b-size-axis0": (_layer_norm, dict(axis=0, x=(64, 8), b=8), r"b must have shape \(C,\) = \(64,\)"),
    "lstm-gates-width": (_lstm, dict(gates=((8, 96),)), r"gates must have shape \(N, 4K\)"),
    "lstm-gates-tokens": (_lstm, dict(gates=((8, 32),) * 3 + ((9, 32),)), r"gates must have shape \(N, K\)"),
    "lstm-three-gates": (_lstm, dict(gates=((8, 32),) * 3), "num_gates must be 1"),
    "lstm-bias-size": (_lstm, dict(bias=64, has_bias=True), r"bias must have shape \(4K,\) = \(128,\)"),
    "lstm-bias-without-flag": (_lstm, dict(bias=128), r"bias must have shape \(0,\)"),
}


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_refused(op_library, case, mode):
    """When the graph is built (shape functions) and in eager mode (the kernels): InvalidArgument."""
    check_refused(op_library.module, BAD[case], mode)


def test_the_grad_ops_check_their_statistics(op_library):
    m, x = op_library.module, tf.ones([8, 64], tf.bfloat16)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"mean must have shape \(segments, N\)"):
        m.blocksparse_layer_norm_grad(x, x, tf.ones([64]), tf.ones([64]), tf.ones([2, 8]), tf.ones([1, 8]),
                                      **_ln_attrs())
    with pytest.raises(tf.errors.InvalidArgumentError, match="dh_next must have the shape of c"):
        m.blocksparse_lstm_gates_grad(tf.zeros([8, 32]), [tf.zeros([8, 128])], tf.zeros([0]), tf.zeros([8, 32]),
                                      tf.zeros([4, 32]), **_lstm_attrs())


def test_sizes_unknown_until_run_time_are_checked_by_the_kernel(op_library):
    fn = tf.function(lambda x, g: op_library.module.blocksparse_layer_norm(x, g, g, **_ln_attrs(segments=2)),
                     input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"g must have shape \(C,\) = \(6,\)"):
        fn(tf.ones([4, 6]), tf.ones([5]))


@pytest.mark.parametrize("build", [_layer_norm, _lstm], ids=["layer_norm", "lstm_gates"])
def test_a_valid_call_on_the_cpu_says_the_op_runs_on_gpus(op_library, build):
    with pytest.raises(tf.errors.UnimplementedError, match="runs on GPUs only; on the CPU blocksparse"):
        build(op_library.module)


# ------------------------------------------------------------------------ dispatch

LN_SPECS = tuple(_spec("norms", p, dtype="bf16", axis=a, relu=False, aligned=True) for p in ("fwd", "bwd")
                 for a in (1, 0))
LSTM_SPECS = tuple(_spec("lstm", p, dtype="bf16", has_bias=b) for p in ("fwd", "bwd") for b in (False, True))


def _layer_norm_graph(shape=(None, 64), axis=-1, relu=False, dtype=tf.bfloat16, jit=False):
    def fn(x, g, b):
        with tf.GradientTape() as tape:
            tape.watch([x, g, b])
            y = norms.layer_norm(x, g, b, axis=axis, relu=relu, segments=2)
            loss = tf.reduce_sum(tf.cast(y, tf.float32))
        return y, tape.gradient(loss, [x, g, b])

    c = shape[axis]
    spec = [tf.TensorSpec(shape, dtype), tf.TensorSpec([c]), tf.TensorSpec([c], tf.float16)]
    return _op_types(tf.function(fn, input_signature=spec, jit_compile=jit, autograph=False).get_concrete_function())


@pytest.mark.parametrize("shape,axis", [((None, 64), -1), ((None, 5, 64), 2), ((64, None), 0), ((64, 5, None), 0)],
                         ids=["NC", "NTC", "CN", "CTN"])
def test_layer_norm_takes_the_gpu_op_and_its_gradient(gpu_library_with, shape, axis):
    gpu_library_with(*LN_SPECS)
    types = _layer_norm_graph(shape, axis)
    assert {"BlocksparseLayerNorm", "BlocksparseLayerNormGrad"} <= types


def test_layer_norm_without_kernels_for_the_call_warns_and_takes_the_reference_path(gpu_library_with,
                                                                                   monkeypatch):
    gpu_library_with(*LN_SPECS)
    loader.warn_once.reset()
    with pytest.warns(loader.OpLibraryWarning, match="layer_norm of bfloat16 features last"):
        types = _layer_norm_graph(relu=True)  # no relu kernels in this library
    assert not set(OPS) & types
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    with pytest.raises(dispatch.BackendUnavailableError, match="layer_norm"):
        _layer_norm_graph(relu=True)


@pytest.mark.parametrize("case", ["rows-not-16", "middle-axis"])
def test_layer_norm_the_kernels_cannot_take_is_silently_the_reference_path(gpu_library_with, monkeypatch, case):
    gpu_library_with(*LN_SPECS)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")  # not even triton insists: no kernel exists
    shape, axis = {"rows-not-16": ((None, 40), -1), "middle-axis": ((None, 64, 3), 1)}[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error", loader.OpLibraryWarning)
        assert not set(OPS) & _layer_norm_graph(shape, axis)


def test_layer_norm_under_xla_or_on_the_cpu_takes_the_reference_path(gpu_library_with):
    gpu_library_with(*LN_SPECS)
    assert not set(OPS) & _layer_norm_graph(jit=True)
    with tf.device("/CPU:0"):
        assert not set(OPS) & _layer_norm_graph()


def test_layer_norm_on_a_gpu_the_library_was_not_built_for(gpu_library_with):
    gpu_library_with(*LN_SPECS, arch=80)   # the specs are sm_90 ones
    loader.warn_once.reset()
    with pytest.warns(loader.OpLibraryWarning, match="sm_80"):
        assert not set(OPS) & _layer_norm_graph()


def _lstm_graph(merged=True, bias=False, k=32):
    def fn(c, *gates):
        with tf.GradientTape() as tape:
            tape.watch([c, *gates])
            b = tf.zeros([4 * k], tf.float16) if bias else None
            c_next, h_next = lstm.fused_lstm_gates(c, *gates, bias=b, forget_bias=1.0)
            loss = tf.reduce_sum(tf.cast(h_next, tf.float32))
        return tape.gradient(loss, [c, *gates])

    gates = [tf.TensorSpec((None, 4 * k), tf.bfloat16)] if merged else [tf.TensorSpec((None, k), tf.bfloat16)] * 4
    signature = [tf.TensorSpec((None, k), tf.bfloat16), *gates]
    return tf.function(fn, input_signature=signature, autograph=False).get_concrete_function()


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_lstm_gates_take_the_gpu_op_and_its_gradient(gpu_library_with, merged, bias):
    gpu_library_with(*LSTM_SPECS)
    concrete = _lstm_graph(merged, bias)
    assert {"BlocksparseLstmGates", "BlocksparseLstmGatesGrad"} <= _op_types(concrete)
    op = next(o for o in concrete.graph.get_operations() if o.type == "BlocksparseLstmGates")
    assert op.get_attr("num_gates") == (1 if merged else 4) and op.get_attr("has_bias") == bias


def test_lstm_gates_of_k_not_a_multiple_of_16_take_the_reference_path(gpu_library_with):
    gpu_library_with(*LSTM_SPECS)
    assert not set(OPS) & _op_types(_lstm_graph(k=24))


def test_without_a_gpu_library_the_reference_path_is_unchanged(op_library, gpu_arch):
    """A GPU but the real test library (no norms / LSTM kernels in it): the reference path."""
    gpu_arch(90)
    if any(s["family"] in ("norms", "lstm") for s in op_library.specs):
        pytest.skip("this library holds norms / LSTM kernels")
    loader.warn_once.reset()
    with pytest.warns(loader.OpLibraryWarning):
        assert not set(OPS) & _layer_norm_graph()
    assert not set(OPS) & _op_types(_lstm_graph())
