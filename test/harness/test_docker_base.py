"""The pure parts of the docker executor's setup: apt sources -> the base image's recipe, the
machine's pip settings -> the images' pip.conf, a Python installation -> the files copied."""
import pytest

from harness.docker_base import (PACKAGES, AptSource, BaseRecipe, host_recipe, interpreter_files,
                                 parse_sources)
from harness.errors import ExecutorUnavailable
from harness.pip_settings import parse_config_list, pip_context

DEB822 = """\
Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://mirror.example/debian
Suites: bookworm

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Enabled: no
"""

ONE_LINE = """\
# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] https://one.example/debian bookworm main contrib  # why
deb-src http://src.example/debian bookworm main
deb http://other.example/ubuntu jammy main
"""


def test_parse_deb822_and_one_line_sources():
    assert parse_sources(DEB822, deb822=True) == [
        AptSource("http://mirror.example/debian", ("bookworm", "bookworm-updates"), ("main",))]
    assert parse_sources(ONE_LINE, deb822=False) == [
        AptSource("https://one.example/debian", ("bookworm",), ("main", "contrib")),
        AptSource("http://other.example/ubuntu", ("jammy",), ("main",))]


def apt(tmp_path, *, sources=None, lists=None, release="ID=debian\nVERSION_CODENAME=bookworm\n"):
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    if sources:
        (etc / "sources.list.d" / "debian.sources").write_text(sources)
    if lists:
        (etc / "sources.list").write_text(lists)
    (tmp_path / "os-release").write_text(release)
    return etc, tmp_path / "os-release"


def test_recipe_from_the_machine_release_and_mirror(tmp_path):
    etc, release = apt(tmp_path, sources=DEB822)
    recipe = host_recipe(etc, release)
    assert recipe == BaseRecipe(distro="debian", suite="bookworm",
                                mirror="http://mirror.example/debian")
    assert recipe.packages == PACKAGES and "g++" in PACKAGES and "python3-venv" in PACKAGES
    # The tag is the recipe's hash, not the mirror's: the same system from any mirror.
    other = BaseRecipe(distro="debian", suite="bookworm", mirror="http://else.example/debian")
    assert recipe.tag == other.tag and recipe.tag.startswith("blocksparse-base:bookworm-")
    assert BaseRecipe(distro="debian", suite="trixie", mirror="x").tag != recipe.tag
    etc, release = apt(tmp_path / "one", lists=ONE_LINE)
    assert host_recipe(etc, release).mirror == "https://one.example/debian"


def test_recipe_errors_name_what_is_missing(tmp_path):
    etc, release = apt(tmp_path, lists="deb http://x.example/debian trixie main\n")
    with pytest.raises(ExecutorUnavailable, match="no apt source of .* serves bookworm"):
        host_recipe(etc, release)
    etc, release = apt(tmp_path / "b", sources=DEB822, release="ID=arch\n")
    with pytest.raises(ExecutorUnavailable, match="names no VERSION_CODENAME"):
        host_recipe(etc, release)


def test_pip_config_list_precedence():
    text = ("global.cert='/a.crt'\nglobal.index-url='https://idx.example/simple'\n"
            "install.index-url='https://install.example/simple'\n"
            ":env:.cert='/env.crt'\n:env:.default_timeout='60'\nnot a setting\n")
    assert parse_config_list(text) == {"cert": "/env.crt", "default-timeout": "60",
                                       "index-url": "https://install.example/simple"}


def test_pip_context_keeps_the_network_and_copies_the_files(tmp_path):
    (tmp_path / "ca.crt").write_text("CERT")
    (tmp_path / "c.txt").write_text("torch<3\n")
    config = {"cert": str(tmp_path / "ca.crt"), "constraint": f"{tmp_path}/c.txt /gone.txt",
              "extra-index-url": "file:///opt/pypi/simple https://idx.example/simple",
              "find-links": "/opt/wheels", "timeout": "60"}
    context = pip_context(config)
    assert sorted(context.files) == ["cert-1-ca.crt", "constraint-2-c.txt", "pip.conf"]
    assert context.files["constraint-2-c.txt"] == b"torch<3\n"
    conf = context.files["pip.conf"].decode().splitlines()
    assert conf[1:] == ["[global]", "cert = /etc/blocksparse/pip/cert-1-ca.crt",
                        "constraint = /etc/blocksparse/pip/constraint-2-c.txt",
                        "extra-index-url = https://idx.example/simple", "timeout = 60"]
    assert [n.split(" is ")[0] for n in context.notes if "disk" in n] == [
        "pip: extra-index-url file:///opt/pypi/simple", "pip: find-links /opt/wheels"]
    assert any("constraint /gone.txt cannot be read" in n for n in context.notes)
    assert pip_context({}).files == {"pip.conf": context.files["pip.conf"].split(b"[global]")[0]
                                     + b"[global]\n"}


def test_interpreter_files_leave_out_packages_tests_and_static_libraries(tmp_path):
    for rel in ("bin/python3.12", "lib/libpython3.12.so.1.0", "lib/python3.12/os.py",
                "lib/python3.12/site-packages/pip/__init__.py", "lib/python3.12/test/t.py",
                "lib/python3.12/__pycache__/os.cpython-312.pyc",
                "lib/python3.12/config-3.12-x86_64-linux-gnu/libpython3.12.a",
                "lib/python3.12/ensurepip/_bundled/pip.whl", "include/python3.12/Python.h"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert sorted(interpreter_files(tmp_path)) == [
        "bin/python3.12", "include/python3.12/Python.h", "lib/libpython3.12.so.1.0",
        "lib/python3.12/ensurepip/_bundled/pip.whl", "lib/python3.12/os.py"]
