"""Where the op library's build script is, whether this machine can run it, manifest records of
kernels a library does not hold, and the check that an op refuses bad input (shared by the tests of
this folder; import as ``from tf_op_build import ...``)."""
import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = ROOT / "scripts" / "build_ops.py"
#: What the test build compiles: both archs, TMA and pointer kernels, one dtype and block size.
TEST_BUILD = ("--archs", "sm_80,sm_90", "--dtypes", "bf16", "--block-sizes", "32")


def can_build():
    """Whether this machine can build the op library: the sources, Triton, compilers."""
    return (BUILD_SCRIPT.is_file() and importlib.util.find_spec("triton") is not None
            and any(shutil.which(c) for c in ("c++", "g++")) and shutil.which("objdump"))


def fake_spec(family, product, **fields):
    """A manifest record of a ``family`` kernel with these fields, an sm_90 cubin (for
    ``gpu_library_with``)."""
    return {"family": family, "product": product, "arch": 90, "image": "cubin", "target": "sm_90a", "shared": 0,
            "name": f"{family}_{product}", **fields}


def check_refused(module, case, mode):
    """``case`` is ``(build, changes, message)``: ``build(module, **changes)`` fails naming the bad
    input (``message``, a regex) when a ``tf.function`` is traced (``mode`` "graph": the shape
    function, a ``ValueError`` or ``InvalidArgumentError``), or run eagerly ("eager": the kernel's
    ``InvalidArgumentError``)."""
    import pytest
    import tensorflow as tf

    build, changes, message = case
    if mode == "graph":
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=message):
            tf.function(lambda: build(module, **changes)).get_concrete_function()
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            build(module, **changes)
