"""Fixtures of the harness tests (development only: cells never run these)."""
import os
import shutil

import pytest

from harness_support import PINS, make_cells

#: Set (as .ci/run does) to make a missing engine a failure instead of a skip.
REQUIRE_DOCKER = "BLOCKSPARSE_REQUIRE_DOCKER"


def pytest_configure(config):
    config.addinivalue_line("markers", "docker: needs a Docker Engine and the local base image "
                                       "(or root and debootstrap to make it): make docker-engine")


@pytest.fixture
def cell():
    """One supported cell: tf2.21-cu12.5-py3.11."""
    return make_cells()[0]


@pytest.fixture
def pins():
    return dict(PINS)


@pytest.fixture(scope="session")
def engine():
    """A docker client of a running engine that has (or can make) the local base image."""
    import docker
    from docker.errors import ImageNotFound

    from harness.docker_base import host_recipe
    from harness.errors import ExecutorUnavailable

    def unavailable(why):
        if os.environ.get(REQUIRE_DOCKER) == "1":
            pytest.fail(f"{REQUIRE_DOCKER}=1 but {why}")
        pytest.skip(why)

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:  # noqa: BLE001 -- any failure means no usable engine
        unavailable(f"no Docker engine answers ({e}): make docker-engine")
    try:
        client.images.get(host_recipe().tag)
    except ImageNotFound:
        if shutil.which("debootstrap") is None or os.geteuid() != 0:
            unavailable("no local base image, and no root + debootstrap to make it")
    except ExecutorUnavailable as e:
        unavailable(str(e))
    return client
