"""The docker executor, on the exact SDK calls it makes (a recording fake client; no engine)."""
import io
import tarfile

import pytest
from docker.errors import APIError, DockerException, NotFound
from docker.types import DeviceRequest

from harness.errors import ExecutorUnavailable
from harness.executors import CellJob
from harness.executors.docker import DockerExecutor, image_tag
from harness_support import make_cells


def tar_of(files, top):
    """What get_archive streams: the directory ``top`` holding ``files``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return [raw[:100], raw[100:]]  # in more than one chunk, as the SDK streams it


class FakeContainer:
    def __init__(self, client, kwargs):
        self.client, self.kwargs = client, kwargs
        self.calls = []

    def put_archive(self, path, data):
        self.calls.append(("put_archive", path))
        self.client.put = tarfile.open(fileobj=io.BytesIO(data))
        return True

    def start(self):
        self.calls.append(("start",))
        if self.client.start_error:
            raise APIError("could not select device driver \"\" with capabilities: [[gpu]]")

    def logs(self, **kwargs):
        self.calls.append(("logs", kwargs))
        return iter([b"::cell-step:: bu", b"ild\nbuilding\n::cell-", b"step:: test\nlast"])

    def wait(self):
        self.calls.append(("wait",))
        return {"StatusCode": self.client.status}

    def get_archive(self, path):
        self.calls.append(("get_archive", path))
        if path not in self.client.archives:
            raise NotFound(f"{path} not found")
        return self.client.archives[path], {"name": path}

    def remove(self, **kwargs):
        self.calls.append(("remove", kwargs))


class FakeClient:
    def __init__(self, *, build_chunks=None, status=0, archives=None, start_error=False):
        self.build_calls, self.created = [], []
        self.status, self.start_error = status, start_error
        self.archives = archives if archives is not None else {
            "/cell/out/dist": tar_of({"blocksparse-2.21.0-py3-none-any.whl": b"wheel"}, "dist"),
            "/cell/out/reports": tar_of({"junit.xml": b"<xml/>", "outcomes.json": b"{}"},
                                        "reports")}
        self.build_chunks = build_chunks if build_chunks is not None else [
            {"stream": "Step 1/9 : FROM nvidia/cuda:12.5.1-devel-ubuntu22.04\n"},
            {"status": "Pulling fs layer", "id": "abc", "progressDetail": {"current": 1}},
            {"status": "Downloaded newer image", "id": "abc", "progressDetail": {}},
            {"stream": "Successfully built 1234\n"}]
        self.api = self
        self.containers = self

    def build(self, **kwargs):  # APIClient.build
        self.build_calls.append(kwargs)
        return iter(self.build_chunks)

    def create(self, image, **kwargs):  # containers.create
        container = FakeContainer(self, {"image": image, **kwargs})
        self.created.append(container)
        return container


@pytest.fixture
def job(cell, tmp_path):
    stage = tmp_path / "stage"
    (stage / "src" / "scripts").mkdir(parents=True)
    (stage / "src" / "scripts" / "run_cell.sh").write_text("#!/bin/bash\n")
    (stage / "known_failures.json").write_text('{"entries": []}')
    return CellJob(cell=cell, stage=stage, dist=tmp_path / "dist" / cell.name,
                   reports=tmp_path / "reports" / cell.name, pytest_args=("test/test_x.py",),
                   test_timeout=30, run_timeout=600)


def run(job, client, tmp_path):
    lines = []
    executor = DockerExecutor(repo=tmp_path / "repo", client_factory=lambda: client)
    return executor.run(job, lines.append), lines


def test_build_run_copy_out(job, tmp_path):
    client = FakeClient(status=1)
    result, lines = run(job, client, tmp_path)
    assert result.returncode == 1 and result.setup_error is None
    assert client.build_calls == [{
        "path": str(tmp_path / "repo" / "docker"),
        "dockerfile": "generated/Dockerfile.tf2.21-cu12.5-py3.11",
        "tag": "blocksparse-matrix:tf2.21-cu12.5-py3.11", "rm": True, "forcerm": True,
        "pull": True, "decode": True}]
    (container,) = client.created
    kwargs = container.kwargs
    assert kwargs["image"] == image_tag(job.cell) == "blocksparse-matrix:tf2.21-cu12.5-py3.11"
    assert kwargs["command"] == ["bash", "/cell/src/scripts/run_cell.sh", "test/test_x.py"]
    assert kwargs["working_dir"] == "/cell/src"
    assert kwargs["device_requests"] == [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    assert kwargs["environment"] == {
        "CELL": "tf2.21-cu12.5-py3.11", "CELL_PYTHON": "/opt/cell/bin/python",
        "CELL_SRC": "/cell/src", "CELL_DIST": "/cell/out/dist",
        "CELL_REPORTS": "/cell/out/reports", "CELL_KNOWN_FAILURES": "/cell/known_failures.json",
        "CELL_COMPILE_ONLY": "0", "CELL_TEST_TIMEOUT": "30", "CELL_RUN_TIMEOUT": "600",
        "BLOCKSPARSE_CUDA_ARCHS": "sm_80,sm_90"}
    assert [c[0] for c in container.calls] == ["put_archive", "start", "logs", "wait",
                                               "get_archive", "get_archive", "remove"]
    assert container.calls[0] == ("put_archive", "/")
    assert sorted(client.put.getnames()) == ["cell", "cell/known_failures.json", "cell/src",
                                             "cell/src/scripts", "cell/src/scripts/run_cell.sh"]
    assert container.calls[2] == ("logs", {"stream": True, "follow": True})
    assert container.calls[-1] == ("remove", {"force": True})
    assert (job.dist / "blocksparse-2.21.0-py3-none-any.whl").read_bytes() == b"wheel"
    assert (job.reports / "junit.xml").read_bytes() == b"<xml/>"
    # Build output and container output, re-cut into lines; progress bars left out.
    assert lines == ["Step 1/9 : FROM nvidia/cuda:12.5.1-devel-ubuntu22.04",
                     "abc Downloaded newer image", "Successfully built 1234",
                     "::cell-step:: build", "building", "::cell-step:: test", "last"]


def test_compile_only_cell_gets_no_gpu(tmp_path, job):
    (cell,) = make_cells({"status": "compile-only"})
    job = CellJob(cell=cell, stage=job.stage, dist=job.dist, reports=job.reports)
    client = FakeClient()
    run(job, client, tmp_path)
    kwargs = client.created[0].kwargs
    assert kwargs["device_requests"] == [] and kwargs["environment"]["CELL_COMPILE_ONLY"] == "1"


def test_image_build_error(job, tmp_path):
    client = FakeClient(build_chunks=[{"stream": "Step 1/9\n"},
                                      {"error": "manifest for nvidia/cuda:12.5.9 not found"}])
    result, lines = run(job, client, tmp_path)
    assert result.setup_error == ("the image did not build: manifest for nvidia/cuda:12.5.9 "
                                  "not found")
    assert client.created == [] and lines[-1].startswith("manifest")


def test_no_gpu_runtime_is_a_setup_error_and_the_container_goes(job, tmp_path):
    client = FakeClient(start_error=True)
    result, _ = run(job, client, tmp_path)
    assert "the container did not start" in result.setup_error
    assert client.created[0].calls[-1] == ("remove", {"force": True})


def test_missing_outputs_are_skipped(job, tmp_path):
    client = FakeClient(status=10, archives={})
    result, _ = run(job, client, tmp_path)
    assert result.returncode == 10 and not job.dist.exists()


def test_no_engine(job, tmp_path):
    def no_engine():
        raise DockerException("Error while fetching server API version")

    executor = DockerExecutor(repo=tmp_path, client_factory=no_engine)
    with pytest.raises(ExecutorUnavailable, match="no Docker engine reachable .*EXECUTOR=local"):
        executor.run(job, lambda line: None)
