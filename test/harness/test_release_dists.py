"""Collecting and checking the cells' wheels, against wheels written here by hand.

The wheels are synthetic (a zip with a METADATA file), so these tests pin the checker's rules
independently of setup.py; test_release.py checks that the real build passes them.
"""
import hashlib
import os
import random
import runpy
import zipfile

import pytest
from packaging.specifiers import SpecifierSet

from harness.errors import ArtifactError
from harness.release_dists import cell_tf_version, check_wheel, collect_wheels, write_manifest
from harness.render import ROOT
from harness.summary import CellResult, wheel_record

CELL = "tf2.21-cu12.5-py3.11"


def tf_requires(low="2.21", high="2.22"):
    return [f'tensorflow<{high},>={low}; extra == "tensorflow"',
            f'tensorflow-cpu<{high},>={low}; extra == "tensorflow-cpu"']


def make_wheel(directory, version="2.21.0", *, requires=None, name="blocksparse",
               meta_version=None, tag="py3-none-any", payload=b"x = 1\n"):
    """Write a minimal wheel into ``directory``; returns its path."""
    requires = tf_requires() if requires is None else requires
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-{tag}.whl"
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {name}", f"Version: {meta_version or version}",
        "Requires-Dist: numpy>=1.26", *(f"Requires-Dist: {r}" for r in requires), "", ""])
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", payload)
        zf.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
    return path


@pytest.mark.parametrize("cell, expected", [
    ("tf2.21-cu12.5-py3.11", (2, 21)), ("tf2.16-cu12.3-py3.10", (2, 16)), ("tf3.0", (3, 0))])
def test_cell_tf_version(cell, expected):
    assert cell_tf_version(cell) == expected


@pytest.mark.parametrize("cell", ["cu12.5-tf2.21", "tf2-cu12", "tf2.21x-cu12", "nightly"])
def test_cell_tf_version_rejects_other_names(cell):
    with pytest.raises(ArtifactError, match=f"cell '{cell}'.*tfX.Y"):
        cell_tf_version(cell)


def test_good_wheel_passes(tmp_path):
    path = make_wheel(tmp_path)
    wheel = check_wheel(path, CELL)
    assert str(wheel.version) == "2.21.0" and wheel.cells == (CELL,)
    assert wheel.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kwargs, words", [
    (dict(version="2.21.0+cu125"), "local label '+cu125'"),
    (dict(version="2.20.0"), "does not match the cell's TensorFlow 2.21"),
    (dict(version="2.21"), "does not match"),
    (dict(version="2.21.0rc1"), "does not match"),
    (dict(name="blocksparse_other"), "project is 'blocksparse-other'"),
    (dict(meta_version="2.21.1"), "METADATA says version '2.21.1'"),
    (dict(meta_version="not-a-version"), "METADATA says version 'not-a-version', the filename 2.21.0"),
    (dict(requires=tf_requires("2.20", "2.21")),
     "extra [tensorflow] requires tensorflow<2.21,>=2.20, expected tensorflow<2.22,>=2.21"),
    (dict(requires=tf_requires()[:1]), "extra [tensorflow-cpu] should require"),
    (dict(requires=tf_requires() + ["tensorflow>=2.21,<2.22"]), "hard dependency on tensorflow"),
    (dict(requires=tf_requires() + ['tensorflow>=2,<3; extra == "tensorflow"']),
     "should require tensorflow<2.22,>=2.21 once"),
    (dict(requires=[r.replace("extra", "python_version >= '3' or extra") for r in tf_requires()]),
     "hard dependency"),
], ids=["local", "wrong-minor", "two-part", "prerelease", "other-project", "metadata-version",
        "metadata-version-invalid",
        "wrong-window", "missing-extra", "hard-dep", "doubled", "marker-always-true"])
def test_bad_wheel_is_refused(tmp_path, kwargs, words):
    path = make_wheel(tmp_path, **kwargs)
    with pytest.raises(ArtifactError, match=CELL) as info:
        check_wheel(path, CELL)
    assert words in str(info.value)


def test_invalid_wheel_filename(tmp_path):
    path = tmp_path / "blocksparse-2.21.0.whl"
    path.write_bytes(b"")
    with pytest.raises(ArtifactError, match="not a valid wheel filename"):
        check_wheel(path, CELL)


def test_corrupt_wheel(tmp_path):
    path = tmp_path / "blocksparse-2.21.0-py3-none-any.whl"
    path.write_bytes(b"not a zip")
    with pytest.raises(ArtifactError, match="not a readable wheel"):
        check_wheel(path, CELL)


def reported(root, *wheels_by_cell):
    """The report's entries of cells (``(cell, wheel paths)``): what `make matrix` records."""
    return [CellResult(name=cell, status="passed", wheels=tuple(wheel_record(p, root) for p in paths))
            for cell, *paths in wheels_by_cell]


def test_collect_sorts_by_version_and_merges_identical_builds(tmp_path):
    dist = tmp_path / "dist"
    cells = reported(tmp_path, ("tf2.21-cu12.5-py3.11", make_wheel(dist / "tf2.21-cu12.5-py3.11")),
                   ("tf2.21-cu12.5-py3.12", make_wheel(dist / "tf2.21-cu12.5-py3.12")),  # same bytes
                   ("tf2.20-cu12.5-py3.11", make_wheel(dist / "tf2.20-cu12.5-py3.11", "2.20.0",
                                                       requires=tf_requires("2.20", "2.21"))))
    wheels = collect_wheels(tmp_path, cells)
    assert [str(w.version) for w in wheels] == ["2.20.0", "2.21.0"]
    assert wheels[1].cells == ("tf2.21-cu12.5-py3.11", "tf2.21-cu12.5-py3.12")


def test_collect_accepts_same_contents_with_other_zip_timestamps(tmp_path):
    dist = tmp_path / "dist"
    first = make_wheel(dist / "tf2.21-a")
    second = dist / "tf2.21-b" / first.name
    second.parent.mkdir()
    with zipfile.ZipFile(first) as src, zipfile.ZipFile(second, "w") as dst:
        for info in src.infolist():
            info.date_time = (2001, 2, 3, 4, 5, 6)
            dst.writestr(info, src.read(info))
    assert first.read_bytes() != second.read_bytes()
    (wheel,) = collect_wheels(tmp_path, reported(tmp_path, ("tf2.21-a", first), ("tf2.21-b", second)))
    assert wheel.cells == ("tf2.21-a", "tf2.21-b")


def test_collect_refuses_conflicting_files_of_one_name(tmp_path):
    dist = tmp_path / "dist"
    cells = reported(tmp_path,
                   ("tf2.21-cu12.5-py3.11", make_wheel(dist / "tf2.21-cu12.5-py3.11",
                                                       tag="cp311-cp311-linux_x86_64", payload=b"a")),
                   ("tf2.21-cu12.8-py3.11", make_wheel(dist / "tf2.21-cu12.8-py3.11",
                                                       tag="cp311-cp311-linux_x86_64", payload=b"b")))
    with pytest.raises(ArtifactError, match="built by tf2.21-cu12.5-py3.11 and by "
                                            "tf2.21-cu12.8-py3.11 with different contents"):
        collect_wheels(tmp_path, cells)


def test_collect_lists_every_problem(tmp_path):
    dist = tmp_path / "dist"
    cells = reported(tmp_path, ("tf2.21-a", make_wheel(dist / "tf2.21-a", "2.21.0+local")),
                   ("tf2.20-b", make_wheel(dist / "tf2.20-b", "2.20.0", requires=tf_requires("2.20", "2.21")),
                    make_wheel(dist / "tf2.20-b", "2.20.1", requires=tf_requires("2.20", "2.21"))),
                   ("tf2.19-c",))
    message = str(pytest.raises(ArtifactError, collect_wheels, tmp_path, cells).value)
    assert "tf2.21-a" in message and "local label" in message
    assert "tf2.20-b: the matrix report lists 2 wheels (dist/tf2.20-b/blocksparse-2.20.0" in message
    assert "tf2.19-c: the matrix report lists 0 wheels (none); a cell builds exactly one" in message


def test_collect_takes_exactly_the_wheels_the_matrix_tested(tmp_path):
    """A wheel the report lists must be there with the bytes the matrix tested; others in dist/
    are not released."""
    dist = tmp_path / "dist"
    tfs = [f"2.{minor}" for minor in random.sample(range(16, 22), 3)]
    cells = [f"tf{tf}-cu12.5-py3.11" for tf in tfs]

    def build(cell, tf, patch=0):
        upper = f"2.{int(tf.split('.')[1]) + 1}"
        return make_wheel(dist / cell, f"{tf}.{patch}", requires=tf_requires(tf, upper))

    results = reported(tmp_path, *((cell, build(cell, tf)) for cell, tf in zip(cells, tfs)))
    (kept, gone, altered), (_, gone_tf, altered_tf) = cells, tfs
    build(kept, tfs[0], patch=7)  # another wheel beside the tested one: not the report's
    (dist / gone / f"blocksparse-{gone_tf}.0-py3-none-any.whl").unlink()
    altered_path = dist / altered / f"blocksparse-{altered_tf}.0-py3-none-any.whl"
    with zipfile.ZipFile(altered_path, "a") as zf:  # rebuilt since: still a good wheel, other bytes
        zf.writestr("blocksparse/extra.py", os.urandom(8).hex())
    message = str(pytest.raises(ArtifactError, collect_wheels, tmp_path, results).value)
    assert (f"{gone}: dist/{gone}/blocksparse-{gone_tf}.0-py3-none-any.whl is missing: the matrix "
            "report lists it") in message
    assert (f"{altered}: dist/{altered}/blocksparse-{altered_tf}.0-py3-none-any.whl is not the wheel "
            f"the matrix tested (sha256 {hashlib.sha256(altered_path.read_bytes()).hexdigest()}, the "
            f"report says {results[2].wheels[0]['sha256']})") in message
    assert kept not in message
    (wheel,) = collect_wheels(tmp_path, results[:1])
    assert wheel.path.name == f"blocksparse-{tfs[0]}.0-py3-none-any.whl"


@pytest.mark.parametrize("where", ["absolute", "dotdot", "other-cell", "link"])
def test_collect_takes_wheels_only_from_the_cells_dist_folder(tmp_path, where):
    outside = make_wheel(tmp_path / "elsewhere")
    dist = tmp_path / "dist"
    if where == "other-cell":
        outside = make_wheel(dist / "tf2.21-other")
    record = wheel_record(outside, tmp_path)
    record["path"] = {"absolute": str(outside), "dotdot": f"dist/{CELL}/../../elsewhere/{outside.name}",
                      "other-cell": record["path"], "link": f"dist/{CELL}/{outside.name}"}[where]
    if where == "link":
        (dist / CELL).mkdir(parents=True)
        (dist / CELL / outside.name).symlink_to(outside)
    cells = [CellResult(name=CELL, status="passed", wheels=(record,))]
    with pytest.raises(ArtifactError, match=f"{CELL}: the matrix report lists .*; a cell's wheel must be "
                                            f"a file in dist/{CELL}/"):
        collect_wheels(tmp_path, cells)


def test_collect_refuses_mixed_patch_levels(tmp_path):
    dist = tmp_path / "dist"
    cells = reported(tmp_path, ("tf2.21-a", make_wheel(dist / "tf2.21-a", "2.21.1")),
                   ("tf2.20-b", make_wheel(dist / "tf2.20-b", "2.20.0", requires=tf_requires("2.20", "2.21"))))
    with pytest.raises(ArtifactError, match="disagree on PATCH"):
        collect_wheels(tmp_path, cells)


VERSION = runpy.run_path(str(ROOT / "blocksparse" / "_version.py"))


@pytest.mark.parametrize("tf, suffix", [("2.22.0rc0", "rc0"), ("2.22.0-rc1", "rc1"), ("2.22.0b2", "b2"),
                                        ("2.22.0-dev20250101", ".dev20250101")])
def test_a_tensorflow_prerelease_gives_a_prerelease_wheel_that_admits_it(tf, suffix):
    patch = VERSION["PATCH"]
    assert VERSION["wheel_version"](tf) == f"2.22.{patch}{suffix}"
    low, high = VERSION["tf_window"](tf)
    window = SpecifierSet(f"{low},{high}")
    assert window.contains(tf) and window.contains("2.22.0") and window.contains("2.22.3")
    assert not window.contains("2.23.0rc0") and not window.contains("2.21.9")
    final = random.choice(["2.22.0", "2.22.4", "2.22"])
    assert VERSION["tf_window"](final) == (">=2.22", "<2.23")
    assert VERSION["wheel_version"](final) == f"2.22.{patch}"


def test_manifest_is_sha256sum_format(tmp_path):
    files = [tmp_path / "b.whl", tmp_path / "a.tar.gz"]
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * 1000)
    manifest = write_manifest(files, tmp_path / "SHA256SUMS")
    expected = "".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n"
                       for f in sorted(files, key=lambda f: f.name))
    assert manifest.read_text() == expected
