"""Graph helpers of the original's examples: find the ops behind a gradient, order ops.

Both work on graphs (``tf.compat.v1`` graphs, ``tf.function`` bodies); eager execution has no
ops to find or order.
"""
import re

__all__ = ["add_control_input", "get_parents"]


def _stands_for(op, op_type):
    """``op`` has type ``op_type``, or is the ``Identity`` that marks such a product on the
    reference path (named ``op_type``, see :mod:`.autodiff`)."""
    if op.type == op_type:
        return True
    name = op.name.rsplit("/", 1)[-1]
    return op.type == "Identity" and re.fullmatch(rf"{re.escape(op_type)}(_\d+)?", name) is not None


def get_parents(op, op_type):
    """The ops of ``op_type`` that ``op`` depends on through data inputs, nearest first; the
    search does not go past them.  ``[op]`` itself when it has that type."""
    if _stands_for(op, op_type):
        return [op]
    found, seen, wave = [], {op}, [op]
    while wave:
        following = []
        for current in wave:
            for parent in (t.op for t in current.inputs):
                if parent in seen:
                    continue
                seen.add(parent)
                (found if _stands_for(parent, op_type) else following).append(parent)
        wave = following
    return found


def _depends_on(op, target):
    """Whether ``op`` depends on ``target`` through data or control inputs."""
    seen, stack = {op}, [op]
    while stack:
        current = stack.pop()
        if current is target:
            return True
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return False


def add_control_input(op, control_input):
    """Make ``op`` wait for ``control_input`` (both ops of one graph), refusing a cycle."""
    if control_input in op.control_inputs:
        return
    if _depends_on(control_input, op):
        raise ValueError(f"add_control_input: {control_input.name!r} depends on {op.name!r}, so "
                         f"making {op.name!r} wait for it would deadlock the graph")
    op._add_control_input(control_input)  # TensorFlow's own way to edit a built op's inputs
