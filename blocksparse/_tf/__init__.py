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


def _autograph_leaves_us_alone():
    """Tell AutoGraph not to convert blocksparse's own code inside a user's ``tf.function``: the
    library is graph code already, and converting it made one trace of a ``BlocksparseMatMul``
    with its gradient take ~14 s instead of ~0.7 s.  Uses AutoGraph's conversion rules (an
    internal list); where that is missing, AutoGraph converts as before -- slower, same graphs."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:  # pragma: no cover - TensorFlow moved its internals
        return
    rules = tuple(getattr(config, "CONVERSION_RULES", ()))
    if not any(isinstance(r, config.DoNotConvert) and getattr(r, "_prefix", None) == "blocksparse"
               for r in rules):
        config.CONVERSION_RULES = (config.DoNotConvert("blocksparse"),) + rules


_autograph_leaves_us_alone()
