"""TensorFlow internals of the ``blocksparse`` frontend (private).

Importing this package imports TensorFlow and checks its version, so that every public module
that needs TensorFlow fails the same clear way when it is missing or too old.
"""
from .._version import MIN_TF, tf_minor

_INSTALL_HINT = ("install it with `pip install blocksparse[tensorflow]` "
                 "(or `pip install blocksparse[tensorflow-cpu]` for the CPU-only build)")


def _import_tensorflow():
    try:
        import tensorflow as tf
    except ModuleNotFoundError as exc:
        if exc.name != "tensorflow":  # TensorFlow is there but one of its own imports failed
            raise
        raise ImportError(f"blocksparse's TensorFlow frontend needs TensorFlow >= "
                          f"{MIN_TF[0]}.{MIN_TF[1]}, which is not installed; {_INSTALL_HINT}") from exc
    found = getattr(tf, "__version__", "unknown")
    parsed = tf_minor(found)
    if parsed is None or parsed < MIN_TF:
        raise ImportError(f"blocksparse's TensorFlow frontend needs TensorFlow >= "
                          f"{MIN_TF[0]}.{MIN_TF[1]}; found TensorFlow {found}. Upgrade TensorFlow, "
                          f"or {_INSTALL_HINT}")
    return tf


tf = _import_tensorflow()
