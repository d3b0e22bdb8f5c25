"""Argument checks shared by the TensorFlow frontend.

Static facts (dtype, rank, a known dimension) are checked when the op is built and raise
``TypeError`` / ``ValueError``.  Dimensions unknown at that time (a ``None`` in a placeholder or a
``tf.function`` input signature) become assertions that raise ``tf.errors.InvalidArgumentError``
when the graph runs -- a wrong size must never reach a reshape that could silently succeed.
"""
import numbers
import re

import numpy as np

from .._checks import check_epsilon
from . import tf

#: Floating dtypes every op of the frontend accepts.
FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)
_FLOAT_NAMES = "float32, float16 or bfloat16"


def float_dtype(value, name):
    """``value`` (a ``tf.DType``, numpy dtype or name) as one of :data:`FLOAT_DTYPES`."""
    try:
        dtype = tf.as_dtype(value)
    except TypeError as exc:
        raise TypeError(f"{name} must be a dtype, one of {_FLOAT_NAMES}; got {value!r}") from exc
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be one of {_FLOAT_NAMES}; got {dtype.name}")
    return dtype


def tensor_like(value):
    """``value`` as a tensor or TensorFlow variable if it is one -- Keras 3's variables (what
    ``add_weight`` makes) and other objects TensorFlow converts as tensors read as tensors -- else None."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    if hasattr(value, "__tf_tensor__"):
        return tf.convert_to_tensor(value)
    return value if tf.is_tensor(value) else None


def holds_tensors(value):
    """Whether ``value`` is a tensor (see :func:`tensor_like`) or a list / tuple holding one."""
    if isinstance(value, (list, tuple)):
        return any(holds_tensors(v) for v in value)
    return tensor_like(value) is not None


def float_tensor(value, name):
    """``value`` as a tensor whose dtype is one of :data:`FLOAT_DTYPES`."""
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a tensor of {_FLOAT_NAMES}; could not convert "
                        f"{type(value).__name__}: {exc}") from exc
    if tensor.dtype.base_dtype not in FLOAT_DTYPES:  # base: a v1 reference tensor is fine too
        raise TypeError(f"{name} must have dtype {_FLOAT_NAMES}; got {tensor.dtype.name}")
    if tensor.dtype != tensor.dtype.base_dtype:  # a v1 reference tensor (an assign's output): its value
        tensor = tf.identity(tensor)
    return tensor


def parameter_tensor(value, name):
    """A parameter (gain, bias, ...) as a float tensor: numpy arrays and Python lists of numbers are
    converted to float32 (the ops compute in float32 anyway; numpy's default float64 is not a
    frontend dtype), tensors must already have a float dtype of the frontend."""
    if isinstance(value, (np.ndarray, list, tuple)) and not holds_tensors(value):
        try:
            array = np.asarray(value)
        except ValueError as exc:  # a ragged list
            raise ValueError(f"{name} must be a tensor or an array of numbers; got a list that is not one: "
                             f"{exc}") from None
        if array.dtype.kind in "fiu":
            value = array.astype(np.float32)
    return float_tensor(value, name)


def same_dtype(a, b, name_a, name_b):
    """``a`` and ``b`` of one dtype (a v1 graph's reference dtype ``float32_ref`` counts as ``float32``)."""
    da, db = a.dtype.base_dtype, b.dtype.base_dtype
    if da != db:
        raise TypeError(f"{name_a} and {name_b} must have the same dtype; got {name_a} {da.name} and {name_b} {db.name}")


def op_name(name, default):
    """The name (scope) of ops being built: ``name`` if given (a non-empty str), else ``default``."""
    if name is None:
        return default
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str or None; got {name!r}")
    return name


#: float32's smallest normal number: TensorFlow's CPU kernels flush subnormal ones to zero.
FLOAT32_TINY = 2.0**-126


def positive_float(value, name):
    """``value`` (an epsilon) as a float: positive and finite, also in float32; a subnormal one
    counts as :data:`FLOAT32_TINY` (flushed to zero, it would divide by zero)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number; got {type(value).__name__}")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be > 0 and finite; got {value}")
    return max(check_epsilon(value, name), FLOAT32_TINY)


def _shape_text(shape):
    """A shape as Python writes the tuple: ``(2,)``, ``(2, None)``, ``()``."""
    dims = ["None" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def shape_assertions(tensor, expected, name, *, rank_hint=""):
    """Check ``tensor`` against ``expected`` (a tuple of ints, ``None`` = any size).

    Raises ``ValueError`` for what is wrong already at build time and returns the runtime
    assertions (possibly none) for what is not known yet.
    """
    want = _shape_text(expected)
    static = tensor.shape
    if static.rank is not None and static.rank != len(expected):
        raise ValueError(f"{name} must have rank {len(expected)}, shape {want}{rank_hint}; "
                         f"got rank {static.rank} with shape {_shape_text(static.as_list())}")
    runtime = []
    if static.rank is None:  # graphs only: an eager tensor always knows its shape
        runtime.append(tf.debugging.assert_rank(
            tensor, len(expected), message=f"{name} must have rank {len(expected)}, "
                                           f"shape {want}{rank_hint}"))
    dims = static.as_list() if static.rank is not None else [None] * len(expected)
    for axis, (got, size) in enumerate(zip(dims, expected)):
        if size is None:
            continue
        if got is not None:
            if got != size:
                raise ValueError(f"{name} must have shape {want}{rank_hint}; got shape "
                                 f"{_shape_text(dims)} (dimension {axis} is {got}, expected {size})")
        else:
            # the rank check should come first, but Grappler may drop that order: a shape padded
            # with zeros never fails to slice (a missing dimension fails this check, naming it)
            shape = tf.shape(tensor) if static.rank is not None else tf.pad(tf.shape(tensor), [[0, len(expected)]])
            with tf.control_dependencies(runtime):
                runtime.append(tf.debugging.assert_equal(
                    shape[axis], tf.constant(size, tf.int32),
                    message=f"{name} must have shape {want}{rank_hint}; dimension {axis} "
                            f"must be {size}"))
    if runtime:  # XLA compiles the assertions to nothing: an op it cannot compile for another shape
        got = tf.shape(tensor) if static.rank is not None else tf.pad(tf.shape(tensor), [[0, len(expected)]])
        want_dims = tf.stack([got[axis] if size is None else tf.constant(size, tf.int32)
                              for axis, size in enumerate(expected)]) if expected else tf.zeros([0], tf.int32)
        with tf.control_dependencies(runtime):
            runtime.append(_probe(tensor, want_dims, f"{name} must have shape {want}"))
    return runtime


def shape_one_of(tensor, shapes, message):
    """The run-time assertion that ``tensor`` (of unknown rank) has one of ``shapes`` (tuples of
    ints): its rank and every size, compared on its shape padded with zeros (which never fails to
    slice, whatever the rank)."""
    width = max(map(len, shapes))
    got = tf.pad(tf.shape(tensor, out_type=tf.int64), [[0, width]])[:width]
    rank = tf.rank(tensor)
    matches = [tf.logical_and(tf.equal(rank, len(s)),
                              tf.reduce_all(tf.equal(got, tf.constant(list(s) + [0] * (width - len(s)), tf.int64))))
               for s in shapes]
    return tf.debugging.assert_equal(tf.reduce_any(tf.stack(matches)), True, message=message)


def check_shape(tensor, expected, name, *, rank_hint="", static_rank=False):
    """``tensor`` checked against ``expected`` (:func:`shape_assertions`: errors now for what is
    known, assertions for the rest) and, inside ``tf.function`` where sizes are left to run time,
    by ``tf.ensure_shape`` too: there Grappler refines unknown sizes from the ops that follow (a
    scatter, a matmul) and folds the assertions away; ``EnsureShape`` reads the real shape.  (In
    ``tf.compat.v1`` graphs the assertions hold, and an ``EnsureShape`` would pre-empt their
    messages.)  ``static_rank``: a tensor of unknown rank gets its rank (an ``EnsureShape`` of
    unknown sizes, whose error names ``<name>_must_have_rank_<n>``), for ops that a ``tf.compat.v1``
    graph may run beside the assertions (a ``tf.cond``'s branches)."""
    assertions = shape_assertions(tensor, expected, name, rank_hint=rank_hint)
    if static_rank and tensor.shape.rank is None and not tf.inside_function():
        with tf.control_dependencies(assertions):
            out = _named(tensor, node_name(f"{name} must have rank {len(expected)}"))
        return tf.ensure_shape(out, [None] * len(expected))
    if not tf.inside_function() or tensor.shape.rank is not None and all(
            e is None or d is not None for d, e in zip(tensor.shape.as_list(), expected)):
        return checked(tensor, assertions)
    with tf.control_dependencies(assertions):  # its error names the argument: "Shape of tensor <name> ..."
        out = _named(tensor, node_name(name))
    return tf.ensure_shape(out, list(expected))


def _named(tensor, name):
    """``tensor`` through an op named ``name`` that Grappler keeps (a Snapshot: an Identity is
    removed, and errors about it then name the caller's tensor), with the identity's gradient."""
    @tf.custom_gradient
    def snapshot(t):
        return tf.raw_ops.Snapshot(input=t, name=name), lambda dy: dy

    return snapshot(tensor)


def node_name(text):
    """``text`` as an op name (errors of an op name it)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def same_trailing(tensor, like, name, like_name):
    """``tensor``, failing at run time unless its shape after axis 0 is ``like``'s: a concat after
    zero rows of ``like`` (data, not an assertion: Grappler and XLA keep it), plus an assertion whose
    message names the arguments where assertions run."""
    message = f"{name} must have {like_name}"
    assertion = tf.debugging.assert_equal(tf.shape(tensor)[1:], tf.shape(like)[1:], message=message)
    with tf.control_dependencies([assertion]):
        return tf.concat([like[:0], tensor], 0, name=node_name(message))


def shape_guard(tensor, expected, message):
    """``tensor``, failing when the graph runs unless its shape is ``expected`` (an int32 vector of its
    rank): an assertion whose error is ``message``, and an op XLA cannot compile unless the shapes
    match (it compiles assertions to nothing, so a wrong size would broadcast silently there): two
    empty tensors of the two shapes concatenated, named after ``message``."""
    assertion = tf.debugging.assert_equal(tf.shape(tensor), expected, message=message)
    with tf.control_dependencies([assertion]):
        probe = _probe(tensor, expected, message)
    return checked(tensor, [assertion, probe])


def _probe(tensor, expected, message):
    """Two empty tensors of ``tensor``'s shape and of ``expected`` (an int32 vector) concatenated,
    named after ``message``: an op that fails -- when XLA compiles it too -- unless they agree."""
    empty = lambda shape: tf.zeros(tf.concat([shape, [0]], 0), tf.int8)  # noqa: E731
    return tf.concat([empty(tf.shape(tensor)), empty(expected)], -1, name=node_name(message))


def checked(tensor, assertions):
    """``tensor``, made to depend on ``assertions`` when there are any."""
    assertions = [a for a in assertions if a is not None]
    if not assertions:
        return tensor
    with tf.control_dependencies(assertions):
        return tf.identity(tensor)
