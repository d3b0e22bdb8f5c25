"""What a cell environment holds: TensorFlow plus the few tools the cell script needs.

One list serves both executors (the local virtualenv and the Dockerfile), and the tools are
pinned to the versions of the development set in ``requirements/dev.txt``, so a cell runs the
same pytest as ``make test``.
"""
import re
from pathlib import Path

from .errors import ConfigError

__all__ = ["CELL_TOOLS", "FLAVORS", "read_pins", "tf_requirements", "cell_requirements",
           "unavailable_reason"]

#: Besides TensorFlow: the test runner, the timeout plugin, the wheel build backend
#: (``pip wheel --no-build-isolation`` builds with what the environment holds), and Triton, which
#: compiles the GPU kernels of the TensorFlow op library ahead of time (scripts/build_ops.py).
CELL_TOOLS = ("pytest", "pytest-timeout", "setuptools", "wheel", "triton")


# pip output that means the network failed, not that the release does not exist.
_NETWORK_TROUBLE = ("NewConnectionError", "ConnectTimeout", "ReadTimeout", "ProxyError",
                    "Temporary failure in name resolution", "SSLError")


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path, names=CELL_TOOLS):
    """``{name: "name==version"}`` for ``names``, read from a requirements file of pins."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found (the cell tools are pinned there)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as UTF-8 text ({type(e).__name__}: {e})") from None
    pins = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(#.*)?", line)
        if match:
            pins[_normal(match.group(1))] = f"{match.group(1)}=={match.group(2)}"
    missing = [n for n in names if _normal(n) not in pins]
    if missing:
        raise ConfigError(f"{path}: no '==' pin for {', '.join(missing)} (cells install these)")
    return {n: pins[_normal(n)] for n in names}


#: ``cpu``: TensorFlow's CPU build (the local executor, containers without a GPU).  ``cuda``:
#: TensorFlow with its CUDA wheels, the CUDA runtime and cuDNN held to the cell's versions.
FLAVORS = ("cpu", "cuda")


def tf_requirements(cell, flavor):
    """The pip requirements of ``cell``'s TensorFlow in ``flavor`` (one of `FLAVORS`)."""
    reqs = (cell.tf_requirement(flavor),)
    return reqs + tuple(cell.cuda_pins()) if flavor == "cuda" else reqs


def cell_requirements(cell, flavor, pins):
    """The pip requirements of ``cell``'s environment, in install order: TensorFlow, the tools."""
    return tf_requirements(cell, flavor) + tuple(pins[n] for n in CELL_TOOLS)


def unavailable_reason(tf_requirement, python, pip_output):
    """Why the cell is to be *skipped*, when pip's output says its TensorFlow has no release for
    its Python (and not that the network failed); else None."""
    name = tf_requirement.split("=")[0].split("[")[0]
    if f"No matching distribution found for {name}" in pip_output \
            and not any(word in pip_output for word in _NETWORK_TROUBLE):
        return (f"{tf_requirement} has no release installable on Python {python} "
                f"(pip: no matching distribution)")
    return None
