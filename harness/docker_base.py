"""The local base image: this machine's Debian release made with debootstrap, for machines that
reach no container registry.

The rendered Dockerfiles take their base as a build argument (``BASE_IMAGE``): the CUDA devel
image on GPU runners, or this image where nothing can be pulled.  A cell whose Python the
release lacks gets the interpreter the local executor uses (``python3.X`` on PATH, e.g. pyenv's)
copied into a derived base image, at the same path (`ensure_python_base`).  It is made from Debian packages
only -- ``debootstrap`` from the mirror of the machine's own apt sources -- with Python, venv,
the Python headers and the C/C++ toolchain the wheel build needs, then imported into the engine
(``docker import``).  Its tag is a hash of what it is made from, so it is made once and reused
(``make docker-base``; the docker executor makes it too when it is missing).
"""
import hashlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ExecutorUnavailable

__all__ = ["REPOSITORY", "PACKAGES", "AptSource", "parse_sources", "host_sources",
           "os_release", "BaseRecipe", "host_recipe", "ensure_base", "base_python",
           "ensure_python_base", "interpreter_files"]

REPOSITORY = "blocksparse-base"
#: What the base holds besides debootstrap's minimal system: the cell's Python with venv and
#: headers, the certificates pip needs, and the compilers of the op library build.
PACKAGES = ("python3", "python3-venv", "python3-dev", "ca-certificates", "gcc", "g++",
            "binutils", "libc6-dev")
#: Bump when the recipe changes in a way the package list does not show.
RECIPE_VERSION = 1
_LABEL_PYTHON = "org.blocksparse.python"


@dataclass(frozen=True)
class AptSource:
    """One ``deb`` line (or deb822 stanza) of the apt sources."""

    uri: str
    suites: tuple
    components: tuple


def parse_sources(text, *, deb822):
    """The ``deb`` sources of one apt sources file (one-line format, or deb822 ``.sources``)."""
    found = []
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"]) != ["no"]:
                found += [AptSource(uri, tuple(fields.get("suites", ())),
                                    tuple(fields.get("components", ())))
                          for uri in fields.get("uris", ())]
        return found
    for line in text.splitlines():
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # drop [arch=...]
        if words[:1] != ["deb"]:
            continue
        words = words[1:]
        if len(words) >= 2:
            found.append(AptSource(words[0], (words[1],), tuple(words[2:])))
    return found


def host_sources(etc=Path("/etc/apt")):
    """Every ``deb`` source of this machine's apt configuration."""
    etc = Path(etc)
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    found = [s for f in files if f.is_file()
             for s in parse_sources(f.read_text(encoding="utf-8"), deb822=False)]
    return found + [s for f in sorted((etc / "sources.list.d").glob("*.sources"))
                    for s in parse_sources(f.read_text(encoding="utf-8"), deb822=True)]


def os_release(path=Path("/etc/os-release")):
    """``{"ID": "debian", "VERSION_CODENAME": "bookworm", ...}`` of this machine."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return {}
    return {k: v.strip().strip('"') for k, _, v in
            (line.partition("=") for line in text.splitlines()) if k and v}


@dataclass(frozen=True)
class BaseRecipe:
    """What the base is made from: the release, the mirror, the packages."""

    distro: str
    suite: str
    mirror: str
    packages: tuple = PACKAGES

    @property
    def tag(self):
        """``blocksparse-base:<suite>-<hash>``; the mirror does not count (any mirror of the
        release gives the same system)."""
        text = "\n".join([str(RECIPE_VERSION), self.distro, self.suite, *self.packages])
        return f"{REPOSITORY}:{self.suite}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def host_recipe(etc=Path("/etc/apt"), release=Path("/etc/os-release")):
    """The recipe of this machine's release and mirror; `ExecutorUnavailable` says what lacks."""
    info = os_release(release)
    suite = info.get("VERSION_CODENAME")
    if not suite:
        raise ExecutorUnavailable(f"the local base image is made with debootstrap from this "
                                  f"machine's release, and {release} names no VERSION_CODENAME; "
                                  f"use DOCKER_BASE=cuda where the CUDA images can be pulled")
    for source in host_sources(etc):
        if suite in source.suites and source.uri.startswith(("http://", "https://")):
            return BaseRecipe(distro=info.get("ID", "debian"), suite=suite,
                              mirror=source.uri.rstrip("/"))
    raise ExecutorUnavailable(f"no apt source of {etc} serves {suite} over http(s) (looked at "
                              f"sources.list, sources.list.d/*.list and *.sources); the local "
                              f"base image is made from that mirror")


def base_python(client, tag):
    """The ``3.N`` of the Python in the base image ``tag`` (its label), or None."""
    labels = client.images.get(tag).attrs.get("Config", {}).get("Labels") or {}
    return labels.get(_LABEL_PYTHON)


def ensure_base(client, recipe, work_dir, log):
    """Make the base image of ``recipe`` unless the engine has it; returns its tag."""
    from docker.errors import ImageNotFound
    tag = recipe.tag
    try:
        client.images.get(tag)
        log(f"base image {tag}: present, reused")
        return tag
    except ImageNotFound:
        pass
    if shutil.which("debootstrap") is None:
        raise ExecutorUnavailable("debootstrap is not installed: `make docker-engine` installs "
                                  "it (with the engine)")
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="base-", dir=work_dir) as tmp:
        rootfs = Path(tmp) / "rootfs"
        command = ["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}",
                   recipe.suite, str(rootfs), recipe.mirror]
        log(f"base image {tag}: making it: {' '.join(command)}")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise ExecutorUnavailable(f"debootstrap failed (exit {done.returncode}); the base "
                                      f"image cannot be made:\n{tail}")
        pythons = sorted(p.name[6:] for p in (rootfs / "usr" / "bin").glob("python3.*")
                         if re.fullmatch(r"python3\.\d+", p.name))
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        repository, _, name = tag.partition(":")
        changes = [f"LABEL {_LABEL_PYTHON}={pythons[-1] if pythons else ''}",
                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "CMD [\"bash\"]"]
        client.api.import_image_from_stream(tar.stdout, repository=repository, tag=name,
                                            changes=changes)
        if tar.wait() != 0:
            raise ExecutorUnavailable(f"tar of the base image's files failed (exit {tar.returncode})")
    log(f"base image {tag}: made (Python {pythons[-1] if pythons else 'none'})")
    return tag


# Left out of a copied interpreter: installed packages (the cell makes its own virtualenv, and
# venv's pip comes from ensurepip), the test suite, caches and the static library.
_SKIP_PARTS = ("site-packages", "__pycache__", "test", "tests", "idlelib", "tkinter")


def interpreter_files(prefix):
    """``{relative path: Path}`` of the Python installation at ``prefix`` worth copying."""
    prefix = Path(prefix)
    found = {}
    for path in sorted(prefix.rglob("*")):
        rel = path.relative_to(prefix)
        if any(part in _SKIP_PARTS for part in rel.parts[:-1]) or path.suffix in (".a", ".pyc"):
            continue
        if path.is_file() or path.is_symlink():
            found[rel.as_posix()] = path
    return found


def _python_context(base_tag, python, files):
    import io
    import tarfile
    dockerfile = (f"FROM {base_tag}\n"
                  f"COPY python/ {python.prefix}/\n"
                  f"RUN ln -sf {python.prefix}/bin/python{python.version} "
                  f"/usr/local/bin/python{python.version} "
                  f"&& python{python.version} -c 'import ssl, sqlite3, ctypes, zlib, bz2, lzma, "
                  f"venv, ensurepip'\n"
                  f"LABEL {_LABEL_PYTHON}={python.version}\n").encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        for rel, path in files.items():
            tar.add(str(path), arcname=f"python/{rel}", recursive=False)
    buf.seek(0)
    return buf


def ensure_python_base(client, base_tag, python, log):
    """The base image ``base_tag`` plus the interpreter ``python`` (an `Interpreter` of this
    machine) at its own path; made when missing.  Returns ``(tag, None)`` or ``(None, why)``."""
    files = interpreter_files(python.prefix)
    digest = hashlib.sha256(f"{client.images.get(base_tag).id}\n{python.prefix}".encode())
    for rel in sorted(files):
        if rel.startswith(("bin/", "lib/libpython")) and files[rel].is_file():
            digest.update(rel.encode() + files[rel].read_bytes())
    tag = f"{base_tag}-py{python.version}-{digest.hexdigest()[:8]}"
    from docker.errors import APIError, ImageNotFound
    try:
        client.images.get(tag)
        return tag, None
    except ImageNotFound:
        pass
    log(f"docker: base image {tag}: copying the Python {python.version} of this machine "
        f"({python.prefix}, {len(files)} files) into {base_tag}")
    try:
        for chunk in client.api.build(fileobj=_python_context(base_tag, python, files),
                                      custom_context=True, tag=tag, rm=True, forcerm=True,
                                      decode=True):
            if "error" in chunk:
                return None, (f"the Python {python.version} of this machine ({python.prefix}) "
                              f"does not run in the base image: {chunk['error'].strip()}")
            if "stream" in chunk and chunk["stream"].strip():
                log(chunk["stream"].rstrip())
    except APIError as e:
        return None, f"copying Python {python.version} into the base image failed: {e}"
    return tag, None
