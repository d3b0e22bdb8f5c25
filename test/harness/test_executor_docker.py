"""The docker executor, on the exact SDK calls it makes (a recording fake client; no engine).

The same executor against a real engine: test_docker_engine.py."""
import io
import tarfile

import pytest
from types import SimpleNamespace

import requests

from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest

from harness.errors import ExecutorUnavailable
from harness.executors import CellJob, CellRun
from harness.executors.docker import DockerExecutor
from harness.interpreters import Interpreter
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
        self.id = "c0ffee0000000000"
        self.attrs = {}

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

    def reload(self):
        self.calls.append(("reload",))
        self.attrs = {"State": {"OOMKilled": self.client.oom}}

    def get_archive(self, path):
        self.calls.append(("get_archive", path))
        if path not in self.client.archives:
            raise NotFound(f"{path} not found")
        return self.client.archives[path], {"name": path}

    def remove(self, **kwargs):
        self.calls.append(("remove", kwargs))


class FakeImage:
    def __init__(self, tag, labels=None):
        self.tags, self.id = [tag], f"sha256:{abs(hash(tag)):x}"
        self.attrs = {"Config": {"Labels": labels or {}}}


class FakeClient:
    """The SDK calls the executor makes, recorded; images "exist" once built."""

    def __init__(self, *, build_chunks=None, status=0, archives=None, start_error=False,
                 oom=False, runtimes=("runc",), images=()):
        self.build_calls, self.created, self.removed_images = [], [], []
        self.status, self.start_error, self.oom = status, start_error, oom
        self.runtimes = runtimes
        self.images_by_tag = {BASE: FakeImage(BASE, {"org.blocksparse.python": "3.11"})}
        self.images_by_tag.update({t: FakeImage(t) for t in images})
        self.archives = archives if archives is not None else {
            "/cell/out/dist": tar_of({"blocksparse-2.21.0-py3-none-any.whl": b"wheel"}, "dist"),
            "/cell/out/reports": tar_of({"junit.xml": b"<xml/>", "outcomes.json": b"{}"},
                                        "reports")}
        self.build_chunks = build_chunks if build_chunks is not None else [
            {"stream": "Step 1/9 : FROM blocksparse-base:bookworm-0\n"},
            {"status": "Pulling fs layer", "id": "abc", "progressDetail": {"current": 1}},
            {"status": "Downloaded newer image", "id": "abc", "progressDetail": {}},
            {"stream": "Successfully built 1234\n"}]
        self.api = self.containers = self.images = self

    def ping(self):
        return True

    def info(self):
        return {"Runtimes": {r: {} for r in self.runtimes}}

    def get(self, tag):  # images.get
        if tag not in self.images_by_tag:
            raise ImageNotFound(tag)
        return self.images_by_tag[tag]

    def list(self, name=None):  # images.list
        return [i for t, i in self.images_by_tag.items() if t.startswith(f"{name}:")]

    def remove(self, tag):  # images.remove
        self.removed_images.append(tag)
        del self.images_by_tag[tag]

    def build(self, **kwargs):  # APIClient.build
        self.build_calls.append(kwargs)
        if not any("error" in c for c in self.build_chunks):
            self.images_by_tag[kwargs["tag"]] = FakeImage(kwargs["tag"])
        return iter(self.build_chunks)

    def create(self, image, **kwargs):  # containers.create
        container = FakeContainer(self, {"image": image, **kwargs})
        self.created.append(container)
        return container


BASE = "blocksparse-base:bookworm-0"


def no_python(version, log):
    return None, f"python{version} not found on PATH"


def executor_for(tmp_path, client, base="local", find_python=no_python):
    repo = tmp_path / "repo"
    (repo / "docker" / "generated").mkdir(parents=True, exist_ok=True)
    for py in ("3.11", "3.13"):
        (repo / "docker" / "generated" / f"Dockerfile.tf2.21-cu12.5-py{py}").write_text("FROM x\n")
    (tmp_path / "ca.crt").write_text("CERT")
    pip = {"cert": str(tmp_path / "ca.crt"), "default-timeout": "60",
           "extra-index-url": "file:///opt/simple https://mirror.example/simple"}
    executor = DockerExecutor(repo=repo, base=base, client_factory=lambda: client,
                              pip_config=lambda: pip, base_recipe=SimpleNamespace(tag=BASE),
                              find_python=find_python)
    return executor, io.StringIO()


@pytest.fixture
def job(cell, tmp_path):
    stage = tmp_path / "stage"
    (stage / "src" / "scripts").mkdir(parents=True)
    (stage / "src" / "scripts" / "run_cell.sh").write_text("#!/bin/bash\n")
    (stage / "known_failures.json").write_text('{"entries": []}')
    return CellJob(cell=cell, stage=stage, dist=tmp_path / "dist" / cell.name,
                   reports=tmp_path / "reports" / cell.name, pytest_args=("test/test_x.py",),
                   test_timeout=30, run_timeout=600)


def run(job, client, tmp_path, base="local", find_python=no_python):
    lines = []
    executor, out = executor_for(tmp_path, client, base, find_python)
    executor.check(out)
    return executor.run(job, lines.append), lines



def test_build_run_copy_out(job, tmp_path):
    client = FakeClient(status=1)
    result, lines = run(job, client, tmp_path)
    assert result == CellRun(returncode=1)
    (build,) = client.build_calls
    tag = build.pop("tag")
    assert tag.startswith("blocksparse-cell:tf2.21-cu12.5-py3.11-") and len(tag) == 50
    context = tarfile.open(fileobj=build.pop("fileobj"))
    assert sorted(context.getnames()) == ["Dockerfile", "pip/cert-1-ca.crt", "pip/pip.conf"]
    assert context.extractfile("Dockerfile").read() == b"FROM x\n"
    conf = context.extractfile("pip/pip.conf").read().decode()
    assert "cert = /etc/blocksparse/pip/cert-1-ca.crt\n" in conf and "file://" not in conf
    assert "extra-index-url = https://mirror.example/simple\n" in conf
    assert build == {"custom_context": True, "rm": True, "forcerm": True, "pull": False,
                     "decode": True, "buildargs": {"BASE_IMAGE": BASE, "TF_FLAVOR": "cpu"}}
    (container,) = client.created
    kwargs = container.kwargs
    assert kwargs["image"] == tag
    assert kwargs["command"] == ["bash", "/cell/src/scripts/run_cell.sh", "test/test_x.py"]
    assert kwargs["working_dir"] == "/cell/src"
    assert kwargs["device_requests"] == []  # the local base: no GPU
    assert kwargs["labels"] == {"blocksparse.cell": "tf2.21-cu12.5-py3.11",
                                "blocksparse.project": str((tmp_path / "repo").resolve())}
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
    assert lines[0] == "::cell-step:: image" and lines[1].startswith(f"docker: building {tag} ")
    assert lines[2:] == ["Step 1/9 : FROM blocksparse-base:bookworm-0",
                         "abc Downloaded newer image", "Successfully built 1234",
                         "::cell-step:: build", "building", "::cell-step:: test", "last"]


def test_same_recipe_reuses_the_image_a_new_one_replaces_it(job, tmp_path):
    client = FakeClient()
    run(job, client, tmp_path)
    (first,) = client.build_calls
    run(job, client, tmp_path)
    assert len(client.build_calls) == 1  # nothing rebuilt, nothing installed
    assert client.created[-1].kwargs["image"] == first["tag"]
    # Another base image id is another recipe: built anew, the old image goes.
    client.images_by_tag[BASE].id = "sha256:another"
    _, lines = run(job, client, tmp_path)
    assert len(client.build_calls) == 2 and client.removed_images == [first["tag"]]
    assert f"docker: removed {first['tag']} (an older recipe of this cell)" in lines


def test_cuda_base_pulls_and_attaches_the_gpus(job, tmp_path):
    client = FakeClient(runtimes=("runc", "nvidia"))
    executor, out = executor_for(tmp_path, client, base="auto")
    executor.check(out)
    assert executor.base == "cuda" and "docker: base cuda" in out.getvalue()
    executor.run(job, lambda line: None)
    (build,) = client.build_calls
    assert build["buildargs"] == {} and build["pull"] is True
    assert client.created[0].kwargs["device_requests"] == [
        DeviceRequest(count=-1, capabilities=[["gpu"]])]


def test_auto_without_nvidia_runtime_takes_the_local_base(tmp_path):
    executor, out = executor_for(tmp_path, FakeClient())
    executor.base = "auto"
    executor.check(out)
    assert executor.base == "local" and "no nvidia runtime" in out.getvalue()
    assert "file:///opt/simple is on this machine's disk" in out.getvalue()


def test_compile_only_cell_gets_no_gpu(tmp_path, job):
    (cell,) = make_cells({"status": "compile-only"})
    job = CellJob(cell=cell, stage=job.stage, dist=job.dist, reports=job.reports)
    client = FakeClient(runtimes=("nvidia",))
    run(job, client, tmp_path, base="cuda")
    kwargs = client.created[0].kwargs
    assert kwargs["device_requests"] == [] and kwargs["environment"]["CELL_COMPILE_ONLY"] == "1"


def test_python_the_local_base_lacks_is_skipped_without_one_to_copy(tmp_path, job):
    (cell,) = make_cells({"python": ["3.13"]})
    job = CellJob(cell=cell, stage=job.stage, dist=job.dist, reports=job.reports)
    client = FakeClient()
    result, _ = run(job, client, tmp_path)
    assert result.skipped == ("Python 3.13 is not in the local base image, and python3.13 not "
                              "found on PATH; DOCKER_BASE=cuda builds it from "
                              "nvidia/cuda:12.5.1-devel-ubuntu22.04")
    assert client.build_calls == [] and client.created == []


def test_python_of_this_machine_is_copied_into_a_derived_base(tmp_path, job):
    (cell,) = make_cells({"python": ["3.13"]})
    job = CellJob(cell=cell, stage=job.stage, dist=job.dist, reports=job.reports)
    prefix = tmp_path / "pythons" / "3.13.0"
    for rel in ("bin/python3.13", "lib/python3.13/os.py", "lib/python3.13/site-packages/x.py",
                "lib/python3.13/test/test_os.py", "lib/libpython3.13.a", "include/Python.h"):
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text(rel)
    found = Interpreter("3.13", str(prefix / "bin" / "python3.13"), str(prefix))
    client = FakeClient()
    run(job, client, tmp_path, find_python=lambda version, log: (found, None))
    python_build, cell_build = client.build_calls
    context = tarfile.open(fileobj=python_build["fileobj"])
    assert sorted(context.getnames()) == ["Dockerfile", "python/bin/python3.13",
                                          "python/include/Python.h", "python/lib/python3.13/os.py"]
    dockerfile = context.extractfile("Dockerfile").read().decode()
    assert f"FROM {BASE}\nCOPY python/ {prefix}/\n" in dockerfile
    assert f"ln -sf {prefix}/bin/python3.13 /usr/local/bin/python3.13" in dockerfile
    assert python_build["tag"].startswith(f"{BASE}-py3.13-")
    assert cell_build["buildargs"] == {"BASE_IMAGE": python_build["tag"], "TF_FLAVOR": "cpu"}
    # made once: the next run reuses the derived base and the cell's image
    run(job, client, tmp_path, find_python=lambda version, log: (found, None))
    assert len(client.build_calls) == 2


def test_image_build_error(job, tmp_path):
    client = FakeClient(build_chunks=[{"stream": "Step 1/9\n"},
                                      {"error": "manifest for nvidia/cuda:12.5.9 not found"}])
    result, lines = run(job, client, tmp_path)
    assert result.setup_error == ("the image did not build: manifest for nvidia/cuda:12.5.9 "
                                  "not found")
    assert client.created == [] and lines[-1].startswith("manifest")


def test_no_tensorflow_release_for_the_python_is_skipped(job, tmp_path):
    client = FakeClient(build_chunks=[
        {"stream": "ERROR: No matching distribution found for tensorflow-cpu==2.21.*\n"},
        {"error": "The command '/bin/sh -c ...' returned a non-zero code: 1"}])
    result, _ = run(job, client, tmp_path)
    assert result.skipped == ("tensorflow-cpu==2.21.* has no release installable on Python 3.11 "
                              "(pip: no matching distribution)")


def test_no_gpu_runtime_is_a_setup_error_and_the_container_goes(job, tmp_path):
    client = FakeClient(start_error=True)
    result, _ = run(job, client, tmp_path)
    assert "the container did not start" in result.setup_error
    assert client.created[0].calls[-1] == ("remove", {"force": True})


def test_missing_outputs_are_skipped(job, tmp_path):
    client = FakeClient(status=10, archives={})
    result, _ = run(job, client, tmp_path)
    assert result.returncode == 10 and not job.dist.exists()


@pytest.mark.parametrize("status, oom, error", [
    (137, False, "the container was stopped by SIGKILL before the cell finished (docker kill "
                 "or stop, or the engine)"),
    (143, False, "the container was stopped by SIGTERM before the cell finished (docker kill "
                 "or stop, or the engine)"),
    (137, True, "the container ran out of memory and was killed (exit 137)"),
], ids=["kill", "stop", "oom"])
def test_killed_container_is_an_error_and_goes(job, tmp_path, status, oom, error):
    client = FakeClient(status=status, oom=oom)
    result, _ = run(job, client, tmp_path)
    assert result == CellRun(error=error)
    assert client.created[0].calls[-1] == ("remove", {"force": True})


def test_interrupt_removes_the_container(job, tmp_path, monkeypatch):
    def ctrl_c(self, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(FakeContainer, "logs", ctrl_c)
    client = FakeClient()
    with pytest.raises(KeyboardInterrupt):
        run(job, client, tmp_path)
    assert client.created[0].calls[-1] == ("remove", {"force": True})


def test_engine_lost_mid_run_stops_the_run(job, tmp_path, monkeypatch):
    def gone(self, **kwargs):
        raise requests.exceptions.ConnectionError("Connection aborted.")

    monkeypatch.setattr(FakeContainer, "logs", gone)
    with pytest.raises(ExecutorUnavailable, match="lost the Docker engine during cell "
                                                  "tf2.21-cu12.5-py3.11 .*make docker-engine"):
        run(job, FakeClient(), tmp_path)


def test_no_engine(tmp_path):
    def no_engine():
        raise DockerException("Error while fetching server API version")

    executor = DockerExecutor(repo=tmp_path, client_factory=no_engine)
    with pytest.raises(ExecutorUnavailable, match="no Docker engine answers .*make docker-engine"):
        executor.check(io.StringIO())
