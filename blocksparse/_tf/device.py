"""Where TensorFlow would run an op being built: the GPU's architecture, XLA, CPU device scopes.

Every op family's dispatcher asks these (through :mod:`.dispatch`) before it chooses the GPU path.
"""
from __future__ import annotations

from functools import lru_cache

from . import tf

__all__ = ["device_arch", "in_xla", "cpu_requested", "no_gpu_here"]


@lru_cache(maxsize=None)
def device_arch():
    """Compute capability (``10 * major + minor``) of the first GPU TensorFlow sees, or None."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability")
    return 10 * capability[0] + capability[1] if capability else None


def in_xla():
    """Whether ops are being built for XLA (``tf.function(jit_compile=True)``), where custom ops
    cannot run."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # a private module; without it assume no XLA
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def cpu_requested():
    """Whether the innermost ``tf.device`` scope asks for the CPU (the ops would land there)."""
    try:
        from tensorflow.python.eager import context

        name = context.context().device_name or ""  # eager scopes, also while tracing
        if not tf.executing_eagerly():
            stack = tf.compat.v1.get_default_graph()._device_function_stack
            innermost = next(iter(stack.peek_objs()), None)
            if innermost is not None:
                name = innermost.display_name
        return isinstance(name, str) and tf.DeviceSpec.from_string(name).device_type == "CPU"
    except Exception:  # private TensorFlow internals moved, or a device function: assume not
        return False


def no_gpu_here(arch):
    """Why ops built now cannot run on a GPU (``arch``: :func:`device_arch`), or None."""
    if arch is None:
        return "TensorFlow sees no GPU"
    if in_xla():
        return "XLA (jit_compile=True) cannot run custom ops"
    if cpu_requested():
        return "the ops are placed on the CPU (a tf.device scope)"
    return None
