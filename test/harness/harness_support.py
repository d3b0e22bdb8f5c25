"""Shared pieces of the harness tests (import as ``from harness_support import ...``)."""
from pathlib import Path

from harness.matrix import parse_matrix

GOLDEN = Path(__file__).parent / "golden"

BUILD = {"tensorflow": "2.21", "cuda": "12.5", "cudnn": "9.3", "python": ["3.11"],
         "image": "nvidia/cuda:12.5.1-devel-ubuntu22.04"}

PINS = {"pytest": "pytest==8.4.2", "pytest-timeout": "pytest-timeout==2.4.0",
        "setuptools": "setuptools==80.9.0", "wheel": "wheel==0.45.1", "triton": "triton==3.6.0"}


def make_cells(*builds, **defaults):
    """Cells from build dicts (each overriding `BUILD`)."""
    data = {"builds": [{**BUILD, **b} for b in builds or [{}]]}
    if defaults:
        data["defaults"] = defaults
    return parse_matrix(data, source="test-matrix.yaml")
