"""Every environment variable blocksparse reads, in one place.

``BLOCKSPARSE_BACKEND``  ``auto`` (default) | ``triton`` | ``reference`` -- which implementation
    serves the ops.  ``auto`` takes the fast GPU path where it can run (a CUDA device and the
    kernels available) and the reference path (framework ops only) everywhere else.  ``triton``
    insists on the kernels (an error if they cannot run; with ``TRITON_INTERPRET=1`` they run on
    CPU tensors through Triton's interpreter).  ``reference`` always takes the reference path.
``BLOCKSPARSE_TF_OPS``  path of the compiled TensorFlow op library to load instead of the one
    shipped in the wheel (development and tests).
``TRITON_INTERPRET``  Triton's own switch; read here only to know that kernels may run on CPU.
"""
import os

BACKENDS = ("auto", "triton", "reference")


def backend():
    """The requested backend, validated."""
    value = os.environ.get("BLOCKSPARSE_BACKEND", "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"BLOCKSPARSE_BACKEND must be one of {BACKENDS}; got {value!r}")
    return value


def triton_interpret():
    """True when Triton's interpreter is switched on (kernels run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0", "false", "False")


def tf_ops_path():
    """Override for the compiled TensorFlow op library, or None."""
    return os.environ.get("BLOCKSPARSE_TF_OPS") or None
