"""The generic C runtime (src/runtime/) of the toy family's library, through ctypes, without a GPU:
spec queries and keys, every check bsk_launch makes before it touches the GPU (argument count,
kinds, tensor ranks and strides, the alignment a kernel was compiled for), and clean errors where
a launch needs the driver."""
import ctypes

import numpy as np
import pytest

from blocksparse.aot.abi import ABI_VERSION, ARG_KINDS, BskArg, KernelError

SCALE, ROWS = "scale_b128_sm90", "rows_b64_sm90"


def _index(lib, name):
    return next(i for i, s in enumerate(lib.specs) if s["name"] == name)


def _arg(kind, value=0, shape=(), strides=()):
    arg = BskArg(kind=ARG_KINDS[kind], rank=len(shape))
    if kind == "tensor":
        arg.value.ptr = value
    else:
        setattr(arg.value, kind, value)
    for d, (size, stride) in enumerate(zip(shape, strides)):
        arg.shape[d], arg.strides[d] = size, stride
    return arg


def _scale_args(**changes):
    """Valid arguments of the scale kernel: X, Y (16-byte aligned), N, offset (a multiple of 16), alpha."""
    values = {"X": _arg("ptr", 1 << 20), "Y": _arg("ptr", 2 << 20), "N": _arg("i32", 1000),
              "offset": _arg("i64", 32), "alpha": _arg("f32", 0.5), **changes}
    return list(values.values())


def _rows_args(**changes):
    values = {"x_desc": _arg("tensor", 1 << 20, (256, 32), (32, 1)), "Y": _arg("ptr", 2 << 20),
              "stride_y": _arg("i32", 32), "n_rows": _arg("i64", 256), **changes}
    return list(values.values())


def test_the_library_describes_itself(toy_library):
    lib = toy_library
    assert lib.manifest["abi"] == ABI_VERSION and lib.archs == (80, 90)
    assert [s["name"] for s in lib.specs] == ["scale_b128_sm80", SCALE, ROWS]
    rows = _index(lib, ROWS)
    assert (lib.key(rows, "op"), lib.key(rows, "block"), lib.key(rows, "tile"), lib.key(rows, "nope")) == \
        ("rows", 64, None, None)
    assert lib.find("toy", 90, op="scale") == _index(lib, SCALE)   # the newest arch serving sm_90
    assert lib.find("toy", 89, op="scale") == 0                    # sm_80 kernels run on sm_89
    assert lib.find("toy", 80, op="rows") is None                  # rows needs sm_90
    assert lib.find("toy", 100, op="scale") is None                # no sm_10x kernels, no PTX
    assert lib.find("matmul", 90) is None
    assert [s["target"] for s in lib.specs] == ["sm_80", "sm_90a", "sm_90a"]
    assert [lib.rank(i, 90) for i in range(3)] == [0, 1090, 1090] and lib.rank(3, 90) == 0


CHECKS = [
    ("count", SCALE, _scale_args()[:4], "takes 5 arguments; got 4"),
    ("kind", SCALE, _scale_args(N=_arg("i64", 1000)), r"argument 2 \(N\) must be a i32; got kind 3 \(i64\)"),
    ("pointer-alignment", SCALE, _scale_args(Y=_arg("ptr", (2 << 20) + 8)),
     "Y must be a device address aligned to 16; got 0x200008"),
    ("int-multiple", SCALE, _scale_args(offset=_arg("i64", 40)), "offset must be a multiple of 16; got value 0x28"),
    ("rank", ROWS, _rows_args(x_desc=_arg("tensor", 1 << 20, (256, 32, 1), (32, 1, 1))),
     "tensor x_desc must have 2 dimensions; got 3"),
    ("inner-stride", ROWS, _rows_args(x_desc=_arg("tensor", 1 << 20, (256, 32), (1, 256))),
     "x_desc must have an innermost stride of 1; got 256"),
    ("huge-shape", ROWS, _rows_args(x_desc=_arg("tensor", 1 << 20, (1 << 31, 32), (32, 1))),
     r"shape\[0\] = 2147483648 .* shapes must be in \[0, 2\^31\)"),
]


@pytest.mark.parametrize("case, spec, args, message", CHECKS, ids=[c[0] for c in CHECKS])
def test_launch_checks_arguments_before_the_gpu(toy_library, case, spec, args, message):
    with pytest.raises(KernelError, match=message) as info:
        toy_library.launch(_index(toy_library, spec), (8, 1, 1), args)
    assert info.value.status == 1


def test_launch_refuses_an_unknown_spec(toy_library):
    with pytest.raises(KernelError, match="no spec 7 \\(this build has 3\\)"):
        toy_library.launch(7, (1, 1, 1), _scale_args())


def test_a_valid_launch_without_a_driver_says_so(toy_library):
    if _have_gpu():
        pytest.skip("a GPU is present")
    for spec, args in ((SCALE, _scale_args()), (ROWS, _rows_args())):
        with pytest.raises(KernelError, match="libcuda.so.1|cuInit") as info:
            toy_library.launch(_index(toy_library, spec), (8, 1, 1), args)
        assert info.value.status == 3


def test_an_empty_grid_launches_nothing(toy_library):
    toy_library.launch(_index(toy_library, SCALE), (0, 1, 1), _scale_args())  # not even the driver


def test_device_and_memset_without_a_driver(toy_library):
    if _have_gpu():
        pytest.skip("a GPU is present")
    with pytest.raises(KernelError, match="libcuda.so.1|cuInit") as info:
        toy_library.device()
    assert info.value.status == 3
    with pytest.raises(KernelError, match="aligned to 4 bytes; got 0x2") as info:
        toy_library.memset32(2, 0, 16)
    assert info.value.status == 1
    toy_library.memset32(1 << 20, 0, 0)  # nothing to fill


def test_upload_checks_its_addresses_before_the_driver(toy_library):
    table = np.arange(6, dtype=np.int32)
    with pytest.raises(KernelError, match="must not be NULL; got 0x0") as info:
        toy_library.upload(0, table)
    assert info.value.status == 1
    toy_library.upload(1 << 20, table[:0])  # nothing to copy
    if not _have_gpu():
        with pytest.raises(KernelError, match="libcuda.so.1|cuInit") as info:
            toy_library.upload(1 << 20, table)
        assert info.value.status == 3


def test_the_raw_entry_takes_prebuilt_arguments(toy_library):
    """The launch layer's entry converts nothing: byref()s of its arrays, a c_void_p stream."""
    args = (BskArg * 5)(*_scale_args(N=_arg("i64", 3)))
    grid = (ctypes.c_uint * 3)(1, 1, 1)
    message = ctypes.create_string_buffer(256)
    status = toy_library.raw_launch(_index(toy_library, SCALE), ctypes.byref(grid), ctypes.byref(args), 5,
                                    ctypes.c_void_p(), message, 256)
    assert status == 1 and b"argument 2 (N) must be a i32" in message.value


def _have_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
