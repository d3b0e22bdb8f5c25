"""What a cell environment holds: TensorFlow plus the few tools the cell script needs.

One list serves both executors (the local virtualenv and the Dockerfile), and the tools are
pinned to the versions of the development set in ``requirements/dev.txt``, so a cell runs the
same pytest as ``make test``.
"""
import re
from pathlib import Path

from .errors import ConfigError

__all__ = ["CELL_TOOLS", "read_pins", "cell_requirements"]

#: Besides TensorFlow: the test runner, the timeout plugin, the wheel build backend
#: (``pip wheel --no-build-isolation`` builds with what the environment holds), and Triton, which
#: compiles the GPU kernels of the TensorFlow op library ahead of time (scripts/build_ops.py).
CELL_TOOLS = ("pytest", "pytest-timeout", "setuptools", "wheel", "triton")


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path, names=CELL_TOOLS):
    """``{name: "name==version"}`` for ``names``, read from a requirements file of pins."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found (the cell tools are pinned there)") from None
    pins = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(#.*)?", line)
        if match:
            pins[_normal(match.group(1))] = f"{match.group(1)}=={match.group(2)}"
    missing = [n for n in names if _normal(n) not in pins]
    if missing:
        raise ConfigError(f"{path}: no '==' pin for {', '.join(missing)} (cells install these)")
    return {n: pins[_normal(n)] for n in names}


def cell_requirements(cell, flavor, pins):
    """The pip requirements of ``cell``'s environment, in install order.

    ``flavor="cpu"``: TensorFlow's CPU build (the local executor).  ``flavor="cuda"``: TensorFlow
    with its CUDA wheels, the CUDA runtime and cuDNN held to the cell's versions (containers).
    """
    reqs = [cell.tf_requirement(flavor)]
    if flavor == "cuda":
        reqs += cell.cuda_pins()
    return tuple(reqs) + tuple(pins[n] for n in CELL_TOOLS)
