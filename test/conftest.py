"""Shared fixtures.

Random inputs are fresh on every run but reproducible: the run's base seed is printed in the
header and can be replayed with ``BLOCKSPARSE_TEST_SEED=<seed> make test``.
"""
import os
import secrets
import zlib

import numpy as np
import pytest

BASE_SEED = int(os.environ.get("BLOCKSPARSE_TEST_SEED") or secrets.randbits(32))


def pytest_report_header(config):
    return f"blocksparse test seed: BLOCKSPARSE_TEST_SEED={BASE_SEED}"


@pytest.fixture
def rng(request):
    """A numpy Generator for this test: the run's base seed mixed with the test id."""
    return np.random.default_rng([BASE_SEED, zlib.crc32(request.node.nodeid.encode())])
