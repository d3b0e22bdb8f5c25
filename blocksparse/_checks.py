"""Argument checks shared by every layer (no framework import): user mistakes become
``TypeError`` / ``ValueError`` naming the argument, with what was expected and what was given."""
import numbers

import numpy as np

__all__ = ["check_bool", "check_epsilon", "check_int", "check_minibatch"]


def check_bool(value, name):
    """Return ``value`` as a ``bool`` after checking it is one (Python's or numpy's).

    >>> check_bool("no", "use_bias")
    Traceback (most recent call last):
    ...
    TypeError: use_bias must be a bool; got 'no' of type str
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {value!r} of type {type(value).__name__}")
    return bool(value)


def check_int(value, name, minimum=1, maximum=None, *, allow_none=False):
    """Return ``value`` as an ``int`` after checking it is one in ``[minimum, maximum]`` (or None
    with ``allow_none``).

    >>> check_int(3, "heads")
    3
    >>> check_int(0, "heads")
    Traceback (most recent call last):
    ...
    ValueError: heads must be >= 1; got 0
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int{' or None' if allow_none else ''}; got {value!r} "
                        f"of type {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{upper}; got {int(value)}")
    return int(value)


def check_epsilon(value, name="epsilon"):
    """Return ``value`` as a float after checking it is a real number that stays positive and
    finite in float32, where the kernels add it (one that rounds to 0 would divide by zero).

    >>> check_epsilon(1e-50)
    Traceback (most recent call last):
    ...
    ValueError: epsilon must be a positive float32 number (in [1.4e-45, 3.4e+38]); got 1e-50
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {value!r} of type {type(value).__name__}")
    if isinstance(value, np.generic):  # a float16 scalar would overflow comparing with the bounds
        value = float(value)
    # plain Python (torch.compile traces it): float32 rounds 2**-150 and less to 0, 2**128 - 2**103 and more to inf
    if not 2.0**-150 < value < 2.0**128 - 2.0**103:
        raise ValueError(f"{name} must be a positive float32 number (in [1.4e-45, 3.4e+38]); got {value}")
    return float(value)


def check_minibatch(N):
    """``N`` of a shape helper: None (unknown), an int >= 0, or a framework's scalar tensor (e.g.
    TensorFlow's ``tf.shape(x)[0]``, passed through as it is).

    >>> check_minibatch(1.5)
    Traceback (most recent call last):
    ...
    TypeError: N must be an int or None; got 1.5 of type float
    """
    if not isinstance(N, numbers.Number) and "int" in str(getattr(N, "dtype", "")) \
            and len(getattr(N, "shape", (None,))) == 0:
        return N
    return check_int(N, "N", 0, allow_none=True)
