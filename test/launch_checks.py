"""What the launch-layer tests share (import as ``from launch_checks import ...``): the check that
a prepared ahead-of-time launch passes exactly what the JIT launch of the same description passes."""
import math


def assert_packed_like_jit(aot, tensors):
    """Every ``bsk_arg`` of ``aot`` (an AotLaunch whose slots hold ``tensors``' pointers) equals
    the keyword argument Triton gets for the same launch on ``tensors``; every other keyword is a
    constexpr or compile option the spec was compiled with."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from blocksparse.torch._launch import JitLaunch

    spec = aot.kernels.specs[aot.spec_index]
    kwargs = JitLaunch(aot.launch).kwargs(tensors)
    for i, p in enumerate(spec["params"]):
        arg, value = aot.args[i], kwargs.pop(p["name"])
        if p["kind"] == "tensor":
            assert isinstance(value, TensorDescriptor), p["name"]
            assert arg.value.ptr == value.base.data_ptr(), p["name"]
            assert list(arg.shape[:arg.rank]) == list(value.shape), p["name"]
            assert list(arg.strides[:arg.rank]) == list(value.strides), p["name"]
            assert list(value.block_shape) == [int(d) for d in p["type"].split("[")[1].rstrip("]>").split(",")]
        elif p["kind"] == "ptr":
            assert arg.value.ptr == (0 if value is None else value.data_ptr()), p["name"]
        elif p["kind"] == "f32":
            assert math.isclose(arg.value.f32, value, rel_tol=1e-7), p["name"]
        else:
            assert getattr(arg.value, p["kind"]) == value, p["name"]
    assert kwargs.pop("num_warps") == spec["num_warps"] and kwargs.pop("num_stages") == spec["num_stages"]
    assert kwargs == {k: spec["constexprs"][k] for k in kwargs}, "arguments the spec neither takes nor fixes"
    assert set(spec["constexprs"]) == set(kwargs)
