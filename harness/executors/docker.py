"""The docker executor: the cell's rendered image, the script run in a container.

`check` (before the run writes anything): a Docker engine must answer, and the base is chosen:
``cuda`` builds each Dockerfile from its CUDA devel image and attaches every GPU; ``local``
builds it from the Debian base of `harness.docker_base` (made when missing; a cell whose
Python it lacks gets this machine's ``python3.X`` copied into a derived base) with
``TF_FLAVOR=cpu``, for machines without registry or GPU; ``auto`` takes ``cuda`` when the
engine has the ``nvidia`` runtime, else ``local``.

Per cell: the image is tagged ``blocksparse-cell:<cell>-<hash>``, the hash of everything it is
built from (the Dockerfile, the build arguments, the base image's id, the pip settings), and
reused when present -- a second run installs nothing; a new build removes the cell's older
images.  The build context is made here: the generated Dockerfile plus ``pip/`` (this machine's
pip settings, `harness.pip_settings`).  Then a container (labelled ``blocksparse.cell``): the
staged sources are copied in, the script runs and its output is streamed, the wheel and the
reports are copied out, and the container is removed -- also when the cell fails, is killed
(``docker kill``, out of memory: an ``error`` naming it), or the run is interrupted (Ctrl-C).
Copying rather than bind mounts works with a remote engine too, and leaves the files owned by
the caller rather than by the container's root.
"""
import hashlib
import io
import json
import tarfile
from pathlib import Path

from ..environment import tf_requirements, unavailable_reason
from ..errors import ExecutorUnavailable
from ..interpreters import find_python
from ..pip_settings import host_config, pip_context
from . import SCRIPT, STEP_MARKER, CellRun, signal_text

__all__ = ["DockerExecutor", "BASES", "CELL_REPOSITORY", "LABEL", "PROJECT_LABEL",
           "CONTAINER_ROOT", "image_tag", "tar_files"]

BASES = ("auto", "local", "cuda")
CELL_REPOSITORY = "blocksparse-cell"
#: Every container the executor makes carries these labels: the cell's name, and the project
#: root it was run from (so that concurrent runs of two checkouts can tell theirs apart).
LABEL, PROJECT_LABEL = "blocksparse.cell", "blocksparse.project"
#: Where the staged directory lands in the container: /cell/src, /cell/known_failures.json.
CONTAINER_ROOT = "/cell"
_OUT = f"{CONTAINER_ROOT}/out"
_CELL_PYTHON = "/opt/cell/bin/python"  # made by docker/partials/environment.j2
_ENGINE_HELP = ("start one with `make docker-engine` (installs Debian's docker.io and starts "
                "dockerd; as root), or use EXECUTOR=local")


def image_tag(cell, recipe_hash):
    """The tag of a cell's image built from the recipe whose hash is ``recipe_hash``."""
    return f"{CELL_REPOSITORY}:{cell.name}-{recipe_hash[:12]}"


def _from_env():
    import docker
    return docker.from_env(timeout=600)


def tar_files(files):
    """An in-memory tar of ``{name: bytes}`` (sorted, fixed metadata: the same files give the
    same bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


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
    work_dir : Path
        Scratch space (``.matrix``): the base image's root file system is made there.
    pins : dict
        Unused here (the rendered Dockerfile holds them); accepted like the local executor.
    base : str
        One of `BASES` (``DOCKER_BASE``).
    client_factory, pip_config, base_recipe, find_python
        The docker client (default ``docker.from_env``), this machine's pip settings, the base
        image's recipe and the interpreter lookup; tests pass fakes.
    """

    name = "docker"

    def __init__(self, *, repo, work_dir=None, pins=None, base="auto", client_factory=_from_env,
                 pip_config=host_config, base_recipe=None, find_python=find_python):
        if base not in BASES:
            raise ValueError(f"base must be one of {', '.join(BASES)}; got {base!r}")
        self.repo = Path(repo)
        self.work_dir = Path(work_dir) if work_dir else self.repo / ".matrix"
        self.base = base
        self._factory = client_factory
        self._pip_config = pip_config
        self._base_recipe = base_recipe
        self._find_python = find_python
        self._client = None
        self._base_tag = None      # the local base image (base == "local")
        self._pip = None

    def client(self):
        if self._client is None:
            try:
                client = self._factory()
                client.ping()
            except Exception as e:  # the SDK raises DockerException, or OSError underneath
                raise ExecutorUnavailable(f"EXECUTOR=docker: no Docker engine answers ({e}); "
                                          f"{_ENGINE_HELP}") from None
            self._client = client
        return self._client

    def check(self, out):
        """The engine answers; the base is chosen (and made, for ``local``, when missing)."""
        client = self.client()
        if self.base == "auto":
            runtimes = client.info().get("Runtimes") or {}
            self.base = "cuda" if "nvidia" in runtimes else "local"
            print(f"docker: base {self.base} (the engine has "
                  f"{'the' if self.base == 'cuda' else 'no'} nvidia runtime)", file=out)
        if self.base == "local":
            from ..docker_base import ensure_base, host_recipe
            recipe = self._base_recipe or host_recipe()
            self._base_tag = ensure_base(client, recipe, self.work_dir,
                                         lambda line: print(f"docker: {line}", file=out))
        self._pip = pip_context(self._pip_config())
        for note in self._pip.notes:
            print(f"docker: {note}", file=out)

    # -- the image ---------------------------------------------------------------------------

    def build_args(self, base_tag=None):
        """``buildargs`` of the image build: none for the CUDA base (the Dockerfile's defaults);
        the local base (``base_tag``: with the cell's Python) and tensorflow-cpu for ``local``."""
        if self.base == "local":
            return {"BASE_IMAGE": base_tag or self._base_tag, "TF_FLAVOR": "cpu"}
        return {}

    def context_files(self, cell):
        """The build context: the generated Dockerfile and ``pip/``."""
        dockerfile = self.repo / "docker" / "generated" / f"Dockerfile.{cell.name}"
        files = {f"pip/{name}": data for name, data in self._pip.files.items()}
        files["Dockerfile"] = dockerfile.read_bytes()
        return files

    def recipe_hash(self, files, client, base_tag=None):
        """The hash of everything the image is built from (for ``local``, the base image's id:
        a remade base makes new images)."""
        args = self.build_args(base_tag)
        base_id = client.images.get(args["BASE_IMAGE"]).id if args else None
        digest = hashlib.sha256(json.dumps({"args": args, "base": base_id},
                                           sort_keys=True).encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        return digest.hexdigest()

    def _image(self, cell, log, base_tag=None):
        """``(tag, None)``: the cell's image, built or reused; else ``(None, CellRun)``."""
        from docker.errors import APIError, ImageNotFound
        client = self.client()
        files = self.context_files(cell)
        tag = image_tag(cell, self.recipe_hash(files, client, base_tag))
        try:
            client.images.get(tag)
            log(f"docker: image {tag} is up to date (built from the same recipe): reused")
            return tag, None
        except ImageNotFound:
            pass
        log(f"{STEP_MARKER}image")
        log(f"docker: building {tag} (base {self.base}: "
            f"{self.build_args(base_tag).get('BASE_IMAGE', cell.image)})")
        error, output = self._build(client, tag, files, base_tag, log)
        if error:
            skipped = unavailable_reason(tf_requirements(cell, self._flavor)[0], cell.python,
                                         output)
            return None, CellRun(skipped=skipped) if skipped else \
                CellRun(setup_error=f"the image did not build: {error}")
        self._remove_older(client, cell, tag, log)
        return tag, None

    def _build(self, client, tag, files, base_tag, log):
        """Build ``tag`` from ``files``, streaming its log; ``(error or None, the output)``."""
        from docker.errors import APIError
        output = []

        def record(line):
            output.append(line)
            log(line)

        lines, error = _LineSplitter(record), None
        try:
            for chunk in client.api.build(
                    fileobj=io.BytesIO(tar_files(files)), custom_context=True, tag=tag,
                    buildargs=self.build_args(base_tag), rm=True, forcerm=True,
                    pull=self.base == "cuda", decode=True):
                if "stream" in chunk:
                    lines.feed(chunk["stream"])
                elif "error" in chunk:
                    error = chunk["error"].strip()
                    break
                elif "status" in chunk and not chunk.get("progressDetail"):
                    lines.feed(f"{chunk.get('id', '')} {chunk['status']}".strip() + "\n")
        except APIError as e:
            error = str(e)
        lines.close()
        if error:
            log(error)
        return error, "\n".join(output)

    @property
    def _flavor(self):
        return "cpu" if self.base == "local" else "cuda"

    def _remove_older(self, client, cell, tag, log):
        for image in client.images.list(name=CELL_REPOSITORY):
            for old in image.tags:
                if old.startswith(f"{CELL_REPOSITORY}:{cell.name}-") and old != tag:
                    client.images.remove(old)
                    log(f"docker: removed {old} (an older recipe of this cell)")

    # -- the container -----------------------------------------------------------------------

    def container_args(self, job, image):
        """Keyword arguments of the container (``containers.create``)."""
        from docker.types import DeviceRequest
        cell = job.cell
        env = job.script_env(python=_CELL_PYTHON, src=f"{CONTAINER_ROOT}/src",
                             dist=f"{_OUT}/dist", reports=f"{_OUT}/reports",
                             known_failures=f"{CONTAINER_ROOT}/known_failures.json")
        gpus = [DeviceRequest(count=-1, capabilities=[["gpu"]])] \
            if cell.tested and self.base == "cuda" else []
        return {"image": image,
                "command": ["bash", f"{CONTAINER_ROOT}/src/{SCRIPT}", *job.pytest_args],
                "working_dir": f"{CONTAINER_ROOT}/src", "environment": env,
                "device_requests": gpus,
                "labels": {LABEL: cell.name, PROJECT_LABEL: str(self.repo.resolve())}}

    def _cell_base(self, cell, log):
        """``(tag, None)``: the local base with the cell's Python; ``(None, CellRun)`` if none."""
        from ..docker_base import base_python, ensure_python_base
        if base_python(self.client(), self._base_tag) == cell.python:
            return self._base_tag, None
        python, why = self._find_python(cell.python, log=log)
        if python is None:
            return None, CellRun(skipped=f"Python {cell.python} is not in the local base image, "
                                         f"and {why}; DOCKER_BASE=cuda builds it from "
                                         f"{cell.image}")
        tag, why = ensure_python_base(self.client(), self._base_tag, python, log)
        return (tag, None) if tag else (None, CellRun(setup_error=why))

    def run(self, job, log):
        from docker.errors import APIError
        from requests.exceptions import ConnectionError as Disconnected
        try:
            return self._run(job, log)
        except Disconnected as e:
            # Not the cell's fault, and no later cell can run either: stop the run.
            raise ExecutorUnavailable(f"lost the Docker engine during cell {job.cell.name} ({e}); "
                                      f"{_ENGINE_HELP}") from None
        except APIError as e:
            return CellRun(error=f"the Docker engine refused a request: {e}")

    def _run(self, job, log):
        from docker.errors import APIError, NotFound
        cell = job.cell
        base_tag = None
        if self.base == "local":
            base_tag, failed = self._cell_base(cell, log)
            if failed:
                return failed
        image, failed = self._image(cell, log, base_tag)
        if failed:
            return failed
        client = self.client()
        try:
            container = client.containers.create(**self.container_args(job, image))
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
            return self._result(container, returncode)
        finally:
            # Also on Ctrl-C and when the engine fails: no container of ours stays behind.
            try:
                container.remove(force=True)
            except APIError as e:
                log(f"docker: could not remove container {container.id[:12]}: {e}")

    @staticmethod
    def _result(container, returncode):
        """The `CellRun` of a finished container: killed from outside, or the script's status
        (the script itself exits below 128: see scripts/run_cell.sh)."""
        if returncode < 128:
            return CellRun(returncode=returncode)
        container.reload()
        if container.attrs.get("State", {}).get("OOMKilled"):
            return CellRun(error=f"the container ran out of memory and was killed (exit "
                                 f"{returncode})")
        return CellRun(error=f"the container was stopped by {signal_text(returncode - 128)} "
                             f"before the cell finished (docker kill or stop, or the engine)")
