"""The docker executor: the cell's rendered image, the script run in a container with the GPUs.

For each cell: build ``docker/generated/Dockerfile.<cell>`` (build context ``docker/``; the image
copies nothing in) and stream the build log; create a container with every GPU attached
(``DeviceRequest(count=-1, capabilities=[["gpu"]])``; compile-only cells get none); copy the
staged sources in; start it and stream its output; copy the wheel and the reports out; remove
it.  Copying in and out (rather than bind mounts) works with a remote engine too, and leaves the
files owned by the caller rather than by the container's root.
"""
import io
import tarfile
from pathlib import Path

from ..errors import ExecutorUnavailable
from . import SCRIPT, CellRun

__all__ = ["DockerExecutor", "image_tag", "CONTAINER_ROOT"]

#: Where the staged directory lands in the container: /cell/src, /cell/known_failures.json.
CONTAINER_ROOT = "/cell"
_OUT = f"{CONTAINER_ROOT}/out"
_CELL_PYTHON = "/opt/cell/bin/python"  # made by docker/partials/environment.j2


def image_tag(cell):
    """The local tag of a cell's image."""
    return f"blocksparse-matrix:{cell.name}"


def _from_env():
    import docker
    return docker.from_env()


def _tar_directory(path, arcname):
    """An in-memory tar of ``path`` stored under ``arcname``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(path), arcname=arcname)
    return buf.getvalue()


def _extract_contents(chunks, dest):
    """Unpack a ``get_archive`` stream (one top directory) into ``dest``, without that directory."""
    data = io.BytesIO(b"".join(chunks))
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=data) as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) < 2:
                continue
            member.name = str(Path(*parts[1:]))
            members.append(member)
        tar.extractall(dest, members=members, filter="data")


class _LineSplitter:
    """Re-cuts a stream of byte chunks into lines."""

    def __init__(self, log):
        self.log = log
        self.rest = ""

    def feed(self, chunk):
        text = self.rest + (chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk)
        *lines, self.rest = text.split("\n")
        for line in lines:
            self.log(line.rstrip("\r"))

    def close(self):
        if self.rest:
            self.log(self.rest)
            self.rest = ""


class DockerExecutor:
    """Runs cells in containers through the docker SDK.

    Parameters
    ----------
    repo : Path
        The project root (holds ``docker/generated/``).
    client_factory : callable
        Returns a docker client (default ``docker.from_env``); tests pass a recording fake.
    """

    name = "docker"

    def __init__(self, *, repo, client_factory=_from_env):
        self.repo = Path(repo)
        self._factory = client_factory
        self._client = None

    def client(self):
        if self._client is None:
            try:
                self._client = self._factory()
            except Exception as e:  # the SDK raises DockerException, or OSError underneath
                raise ExecutorUnavailable(f"EXECUTOR=docker: no Docker engine reachable ({e}); "
                                          f"EXECUTOR=local runs the cells here") from None
        return self._client

    def build_args(self, cell):
        """Keyword arguments of the image build (``APIClient.build``)."""
        return {"path": str(self.repo / "docker"),
                "dockerfile": f"generated/Dockerfile.{cell.name}",
                "tag": image_tag(cell), "rm": True, "forcerm": True, "pull": True,
                "decode": True}

    def container_args(self, job):
        """Keyword arguments of the container (``containers.create``)."""
        from docker.types import DeviceRequest
        cell = job.cell
        env = job.script_env(python=_CELL_PYTHON, src=f"{CONTAINER_ROOT}/src",
                             dist=f"{_OUT}/dist", reports=f"{_OUT}/reports",
                             known_failures=f"{CONTAINER_ROOT}/known_failures.json")
        gpus = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if cell.tested else []
        return {"image": image_tag(cell),
                "command": ["bash", f"{CONTAINER_ROOT}/src/{SCRIPT}", *job.pytest_args],
                "working_dir": f"{CONTAINER_ROOT}/src", "environment": env,
                "device_requests": gpus, "labels": {"blocksparse.cell": cell.name}}

    def _build(self, client, cell, log):
        """Build the image, streaming its log; an error message, or None."""
        lines = _LineSplitter(log)
        for chunk in client.api.build(**self.build_args(cell)):
            if "stream" in chunk:
                lines.feed(chunk["stream"])
            elif "error" in chunk:
                lines.close()
                log(chunk["error"])
                return f"the image did not build: {chunk['error'].strip()}"
            elif "status" in chunk and not chunk.get("progressDetail"):
                lines.feed(f"{chunk.get('id', '')} {chunk['status']}".strip() + "\n")
        lines.close()
        return None

    def run(self, job, log):
        from docker.errors import APIError, NotFound
        client = self.client()
        try:
            error = self._build(client, job.cell, log)
        except APIError as e:
            error = f"the image did not build: {e}"
        if error:
            return CellRun(setup_error=error)
        try:
            container = client.containers.create(**self.container_args(job))
        except APIError as e:
            return CellRun(setup_error=f"the container could not be created: {e}")
        try:
            container.put_archive("/", _tar_directory(job.stage, CONTAINER_ROOT.strip("/")))
            try:
                container.start()
            except APIError as e:
                return CellRun(setup_error=f"the container did not start: {e}")
            lines = _LineSplitter(log)
            for chunk in container.logs(stream=True, follow=True):
                lines.feed(chunk)
            lines.close()
            returncode = container.wait()["StatusCode"]
            for inside, outside in ((f"{_OUT}/dist", job.dist), (f"{_OUT}/reports", job.reports)):
                try:
                    chunks, _ = container.get_archive(inside)
                except NotFound:
                    continue  # the script stopped before writing there
                _extract_contents(chunks, outside)
            return CellRun(returncode=returncode)
        finally:
            container.remove(force=True)
