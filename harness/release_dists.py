"""The release's files: collect each cell's wheel, check its name and metadata, hash them.

A cell named ``tfX.Y-...`` builds ``dist/<cell>/blocksparse-X.Y.P-*.whl``; the matrix report lists
it with its sha256, and the release takes exactly that file: missing, or with other bytes than the
matrix tested, it stops the release.  Its metadata must
follow the tensorflow-text convention: version ``X.Y.P`` with no ``+local`` label (PyPI refuses
them), and the TensorFlow window ``>=X.Y,<X.(Y+1)`` under both extras (``tensorflow`` and
``tensorflow-cpu``), never as a hard dependency.  The window is computed here from the cell's name,
independently of the build script, so a wheel built against the wrong TensorFlow is caught.
"""
import email.parser
import hashlib
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .errors import ArtifactError
from .summary import sha256_file
from .versions import tf_minor

__all__ = ["PROJECT", "TF_EXTRAS", "CellWheel", "cell_tf_version", "check_wheel",
           "collect_wheels", "sha256_file", "write_manifest"]

PROJECT = "blocksparse"
#: The extras that carry the TensorFlow window, one per TensorFlow distribution users may hold.
TF_EXTRAS = ("tensorflow", "tensorflow-cpu")



@dataclass(frozen=True, kw_only=True)
class CellWheel:
    """A checked wheel: the cells that built it (one, or several that built the same file)."""

    cells: tuple
    path: Path
    version: Version
    sha256: str


def cell_tf_version(cell):
    """``(major, minor)`` of the TensorFlow a cell targets, from its name (``tf2.21-...``)."""
    version = tf_minor(cell[2:]) if re.match(r"tf\d+\.\d+(-|$)", cell) else None
    if version is None:
        raise ArtifactError(f"cannot tell which TensorFlow cell {cell!r} is for: cell names start "
                            "with tfX.Y (e.g. tf2.21-cu12.5-py3.11)")
    return version


def _wheel_metadata(path):
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArtifactError(f"{path.name}: not a readable wheel ({exc})") from None
    with zf:
        names = [n for n in zf.namelist()
                 if n.count("/") == 1 and n.split("/")[0].endswith(".dist-info")
                 and n.endswith("/METADATA")]
        if len(names) != 1:
            raise ArtifactError(f"{path.name}: expected one *.dist-info/METADATA; found {names}")
        return email.parser.BytesParser().parsebytes(zf.read(names[0]))


def _tf_requirement_problems(metadata, major, minor):
    expected = SpecifierSet(f">={major}.{minor},<{major}.{minor + 1}")
    found = {extra: [] for extra in TF_EXTRAS}
    problems = []
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            problems.append(f"unreadable Requires-Dist {line!r} ({exc})")
            continue
        name = canonicalize_name(req.name)
        if name not in found:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            problems.append(f"hard dependency on {name} ({line!r}): it must sit under an extra, "
                            "users hold either tensorflow or tensorflow-cpu")
        elif req.marker.evaluate({"extra": name}):
            found[name].append(req)
    for extra, reqs in found.items():
        if len(reqs) != 1:
            problems.append(f"extra [{extra}] should require {extra}{expected} once; "
                            f"found {[str(r) for r in reqs]}")
        elif reqs[0].specifier != expected:
            problems.append(f"extra [{extra}] requires {extra}{reqs[0].specifier}, "
                            f"expected {extra}{expected}")
    return problems


def check_wheel(path, cell):
    """Check one cell's wheel against the cell's TensorFlow; a :class:`CellWheel` if it passes.

    Raises
    ------
    ArtifactError
        The filename, version or TensorFlow window is wrong (all problems in one message).
    """
    path = Path(path)
    major, minor = cell_tf_version(cell)
    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise ArtifactError(f"{cell}: {path.name} is not a valid wheel filename ({exc})") from None
    problems = []
    if name != PROJECT:
        problems.append(f"project is {name!r}, expected {PROJECT!r}")
    if version.local is not None:
        problems.append(f"version {version} has a local label '+{version.local}' (PyPI refuses "
                        f"them; the version must be {major}.{minor}.PATCH)")
    if version.release[:2] != (major, minor) or len(version.release) != 3 or version.is_prerelease:
        problems.append(f"version {version} does not match the cell's TensorFlow {major}.{minor} "
                        f"(expected {major}.{minor}.PATCH)")
    metadata = _wheel_metadata(path)
    try:
        meta_version = Version(metadata.get("Version", "0"))
    except InvalidVersion:
        meta_version = None  # not a PEP 440 version: it cannot be the filename's
    if meta_version != version:
        problems.append(f"METADATA says version {metadata.get('Version')!r}, the filename {version}")
    problems += _tf_requirement_problems(metadata, major, minor)
    if problems:
        raise ArtifactError(f"{cell}: {path.name}:\n    " + "\n    ".join(problems))
    return CellWheel(cells=(cell,), path=path, version=version, sha256=sha256_file(path))


def _members(path):
    """What a wheel installs: member name -> sha256 of its bytes (zip timestamps do not count)."""
    with zipfile.ZipFile(path) as zf:
        return {info.filename: hashlib.sha256(zf.read(info)).hexdigest() for info in zf.infolist()}


def _tested_wheel(root, cell):
    """The path of the one wheel the report lists for ``cell`` (a `CellResult`), checked to be
    the file the matrix tested."""
    if len(cell.wheels) != 1:
        raise ArtifactError(f"{cell.name}: the matrix report lists {len(cell.wheels)} wheels "
                            f"({', '.join(w['path'] for w in cell.wheels) or 'none'}); a cell "
                            f"builds exactly one")
    (wheel,) = cell.wheels
    path = Path(root) / wheel["path"]
    home = Path(root) / "dist" / cell.name
    if path.resolve().parent != home.resolve():  # an absolute path, "../", a link elsewhere
        raise ArtifactError(f"{cell.name}: the matrix report lists {wheel['path']!r}; a cell's "
                            f"wheel must be a file in dist/{cell.name}/ (where `make matrix` "
                            "puts it); re-run `make matrix`")
    if not path.is_file():
        raise ArtifactError(f"{cell.name}: {wheel['path']} is missing: the matrix report lists "
                            "it; re-run `make matrix`")
    found = sha256_file(path)
    if found != wheel["sha256"]:
        raise ArtifactError(f"{cell.name}: {wheel['path']} is not the wheel the matrix tested "
                            f"(sha256 {found}, the report says {wheel['sha256']}); re-run "
                            "`make matrix`")
    return path


def collect_wheels(root, cells):
    """Check and de-duplicate the wheels the matrix report lists for ``cells``.

    ``cells`` are the report's `CellResult` objects; each lists one wheel (its path under
    ``root`` and sha256), which must be on disk with those bytes.  Cells that built the same file
    name with the same contents (a pure-Python wheel built in two cells) share one entry.  The
    same name with different contents is a conflict: only one file of a name can ever be
    uploaded.  All wheels must carry the same ``PATCH``.

    Raises
    ------
    ArtifactError
        A wheel is missing, altered, not exactly one per cell, wrong (see :func:`check_wheel`)
        or conflicting; every problem is listed.
    """
    by_name, problems = {}, []
    for cell in cells:
        try:
            wheel = check_wheel(_tested_wheel(root, cell), cell.name)
        except ArtifactError as exc:
            problems.append(str(exc))
            continue
        first = by_name.get(wheel.path.name)
        if first is None:
            by_name[wheel.path.name] = wheel
        elif first.sha256 == wheel.sha256 or _members(first.path) == _members(wheel.path):
            by_name[wheel.path.name] = CellWheel(cells=first.cells + (cell.name,), path=first.path,
                                                 version=first.version, sha256=first.sha256)
        else:
            problems.append(f"{wheel.path.name} was built by {', '.join(first.cells)} and by "
                            f"{cell.name} with different contents; only one file of a name can be "
                            "uploaded (give the cells different wheel tags or drop one)")
    patches = {w.version.micro for w in by_name.values()}
    if len(patches) > 1:
        problems.append(f"wheels disagree on PATCH: {sorted(str(w.version) for w in by_name.values())}")
    if problems:
        raise ArtifactError("the cells' wheels cannot be released:\n  " + "\n  ".join(problems))
    return sorted(by_name.values(), key=lambda w: w.version)


def write_manifest(paths, manifest):
    """Write ``sha256sum``-style lines (``<hex>  <name>``) for ``paths`` into ``manifest``."""
    lines = [f"{sha256_file(p)}  {Path(p).name}\n" for p in sorted(paths, key=lambda p: Path(p).name)]
    Path(manifest).write_text("".join(lines), encoding="utf-8")
    return manifest
