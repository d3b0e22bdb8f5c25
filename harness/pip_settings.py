"""This machine's pip settings, carried into the cell images (the ``pip/`` of the build context).

pip inside a container must reach the package index as pip on the machine does: the same index
URLs, the CA bundle that verifies them, the constraint files.  The effective settings are read
from ``pip config list`` (files and ``PIP_*`` variables alike), and become a ``pip.conf`` with
the files it names copied beside it.  Sources on this machine's disk (``file://`` indexes,
find-links folders) cannot be reached from a container: they are left out, and said so -- the
network indexes serve the same releases (the local ones are caches of them).  An index URL
with a ``user:password@`` is written into the image like any other setting: such images must
stay on the machine (the harness never pushes them).
"""
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CONTAINER_DIR", "PipContext", "parse_config_list", "host_config", "pip_context"]

#: Where the files land in the image (the Dockerfile copies ``pip/`` there).
CONTAINER_DIR = "/etc/blocksparse/pip"
_SOURCES = ("index-url", "extra-index-url", "find-links")
_FILES = ("cert", "client-cert", "constraint", "requirement")
# Higher wins: a PIP_* variable over the [install] section over [global].
_RANK = {":env:": 3, "install": 2, "global": 1}


@dataclass(frozen=True)
class PipContext:
    """``pip/`` of a build context: ``files`` (name -> bytes, ``pip.conf`` among them), and
    ``notes`` saying what was left out and why."""

    files: dict
    notes: tuple = ()


def parse_config_list(text):
    """The effective ``{key: value}`` of ``pip config list`` output (``section.key='value'``)."""
    best = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([^.=\s]+)\.([A-Za-z0-9_-]+)\s*=\s*(.*?)\s*", line)
        if not match or match.group(1) not in _RANK:
            continue
        section, key, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        key = key.replace("_", "-")
        if key not in best or _RANK[section] >= best[key][0]:
            best[key] = (_RANK[section], value)
    return {k: v for k, (_, v) in sorted(best.items())}


def host_config(python=sys.executable):
    """This machine's effective pip settings (``{}`` when pip cannot say)."""
    try:
        done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_config_list(done.stdout) if done.returncode == 0 else {}


def pip_context(config, read=lambda path: Path(path).read_bytes()):
    """The ``pip/`` folder for ``config`` (see the module docstring); pure but for ``read``."""
    lines, files, notes = [], {}, []
    for key, value in config.items():
        if key in _SOURCES:
            kept = [v for v in value.split() if v.startswith(("http://", "https://"))]
            notes += [f"pip: {key} {v} is on this machine's disk, which a container cannot "
                      f"reach; left out (the network index serves the same releases)"
                      for v in value.split() if v not in kept]
            value = " ".join(kept)
        elif key in _FILES:
            copied = []
            for path in value.split():
                name = f"{key}-{len(files) + 1}-{Path(path).name}"
                try:
                    files[name] = read(path)
                except OSError as e:
                    notes.append(f"pip: {key} {path} cannot be read ({e.strerror}); left out")
                    continue
                copied.append(f"{CONTAINER_DIR}/{name}")
            value = " ".join(copied)
        if value:
            lines.append(f"{key} = {value}")
    header = "# This machine's pip settings, written by the harness (harness/pip_settings.py).\n"
    files["pip.conf"] = (header + "[global]\n" + "".join(f"{line}\n" for line in lines)).encode()
    return PipContext(files=files, notes=tuple(notes))
