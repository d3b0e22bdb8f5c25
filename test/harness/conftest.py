"""Fixtures of the harness tests (development only: cells never run these)."""
import pytest

from harness_support import PINS, make_cells


@pytest.fixture
def cell():
    """One supported cell: tf2.21-cu12.5-py3.11."""
    return make_cells()[0]


@pytest.fixture
def pins():
    return dict(PINS)
