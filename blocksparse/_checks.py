"""Argument checks shared by every layer (no framework import): user mistakes become
``TypeError`` / ``ValueError`` naming the argument, with what was expected and what was given."""
import numbers

__all__ = ["check_int"]


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
