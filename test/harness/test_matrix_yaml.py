"""matrix.yaml: validation at load (errors name the build and the key), expansion, selection."""
import itertools
import random
import re

import pytest

from harness.errors import ConfigError
from harness.matrix import STATUSES, load_matrix, parse_matrix, select_cells
from harness.render import ROOT
from harness_support import BUILD, make_cells

#: A GPU target the pattern admits but the kernel compiler does not build.
OLD_ARCH = random.choice(["sm_75", "sm_70", "sm_61", "sm_75a"])
OTHER_CUDA = {"cuda": "12.3", "image": "nvidia/cuda:12.3.2-devel-ubuntu22.04"}


def test_build_expands_into_one_cell_per_python():
    cells = make_cells({"python": ["3.11", "3.13"]}, {"tensorflow": "nightly",
                                                       "status": "allowed-to-fail"})
    assert [c.name for c in cells] == ["tf2.21-cu12.5-py3.11", "tf2.21-cu12.5-py3.13",
                                       "tfnightly-cu12.5-py3.11"]
    first, nightly = cells[0], cells[2]
    assert first.archs == ("sm_80", "sm_90") and first.status == "supported" and first.gating
    assert first.runs_on == ("self-hosted", "linux", "x64", "gpu")
    assert first.tf_requirement("cpu") == "tensorflow-cpu==2.21.*"
    assert first.tf_requirement("cuda") == "tensorflow[and-cuda]==2.21.*"
    assert first.cuda_pins() == ("nvidia-cuda-runtime-cu12==12.5.*", "nvidia-cudnn-cu12==9.3.*")
    assert nightly.tf_requirement("cpu") == "tf-nightly-cpu" and not nightly.gating


def test_defaults_and_overrides():
    cells = make_cells({}, {"tensorflow": "2.20", "archs": ["sm_90a"], "status": "compile-only",
                            "runs_on": "cpu-runner"}, archs=["sm_80"], runs_on=["big"])
    assert cells[0].archs == ("sm_80",) and cells[0].runs_on == ("big",)
    assert cells[1].archs == ("sm_90a",) and cells[1].runs_on == ("cpu-runner",)
    assert not cells[1].tested and cells[1].gating


def test_distro_python():
    own, ppa = make_cells({"python": ["3.10", "3.12"]})
    assert own.distro == "ubuntu22.04" and own.distro_python and not ppa.distro_python
    (noble,) = make_cells({"python": ["3.12"], "image": "nvidia/cuda:12.5.1-devel-ubuntu24.04"})
    assert noble.distro_python


def test_bad_flavor_is_an_error(cell):
    with pytest.raises(ValueError, match="flavor must be 'cpu' or 'cuda'; got 'gpu'"):
        cell.tf_requirement("gpu")


@pytest.mark.parametrize("change, words", [
    ({"pythons": ["3.11"]}, r"\(tensorflow 2.21\): unknown key 'pythons' "
                            r"\(did you mean 'python'\?\)"),
    ({"python": [3.1]}, r"python\[0\]: expected a string such as '3.11', got the number 3.1: "
                        r"quote it"),
    ({"cuda": 12.5}, r"cuda: expected a string such as '12.5', got the number 12.5"),
    ({"python": ["3.9"]}, r"python: expected versions among 3.10, .*; got 3.9"),
    ({"python": []}, r"python: expected a non-empty list, got an empty list"),
    ({"python": ["3.11", "3.11"]}, r"python: listed twice: 3.11"),
    ({"tensorflow": "2.15"}, r"tensorflow: blocksparse supports TensorFlow >= 2.16; got 2.15"),
    ({"tensorflow": "latest"}, r"tensorflow: expected a string such as '2.21'"),
    ({"status": "supportd"}, r"status: expected one of supported, compile-only, "
                             r"allowed-to-fail; got 'supportd' \(did you mean 'supported'\?\)"),
    ({"image": "nvidia/cuda:latest"}, r"image: must be fully tagged"),
    ({"image": "nvidia/cuda"}, r"image: expected a string"),
    ({"image": "nvidia/cuda:12.4.1-devel-ubuntu22.04"}, r"image: tag must start with the "
                                                        r"cell's CUDA version 12.5"),
    ({"image": "nvidia/cuda:12.5.1-devel-rockylinux9"}, r"image: tag must end with one of"),
    ({"archs": ["80"]}, r"archs\[0\]: expected a string such as 'sm_90'"),
    ({"archs": ["sm_90", "compute_90"]}, r"archs\[1\]: expected a string such as 'sm_90' \(matching"),
    ({"archs": ["sm_80", "sm_90", OLD_ARCH]}, rf"archs\[2\]: the kernels need sm_80 or newer; got '{OLD_ARCH}'"),
    ({"cudnn": None}, r"cudnn: missing \(required\)"),
    ({"tensorflow": "2.021"}, r"tensorflow: write versions without leading zeros \('2.21'; pip reads "
                              r"both the same\); got '2.021'"),
    ({"cuda": "012.5", "image": "nvidia/cuda:012.5.1-devel-ubuntu22.04"},
     r"cuda: write versions without leading zeros \('12.5'.*got '012.5'"),
    ({"cudnn": "09.3"}, r"cudnn: write versions without leading zeros \('9.3'.*got '09.3'"),
    ({"archs": []}, r"archs: expected a non-empty list, got an empty list"),
    ({"runs_on": []}, r"runs_on: expected a non-empty list, got an empty list"),
], ids=["unknown-key", "float-python", "float-cuda", "old-python", "no-python", "twice",
        "old-tf", "bad-tf", "bad-status", "latest-image", "untagged", "cuda-mismatch",
        "unknown-distro", "bad-arch", "ptx-of-sm90", "arch-too-old", "missing-key",
        "tf-leading-zero", "cuda-leading-zero", "cudnn-leading-zero", "no-archs", "no-runners"])
def test_bad_build(change, words):
    build = {**BUILD, **change}
    build = {k: v for k, v in build.items() if v is not None}
    with pytest.raises(ConfigError, match=r"^test-matrix.yaml: builds\[0\].*" + words):
        parse_matrix({"builds": [build]}, source="test-matrix.yaml")


@pytest.mark.parametrize("data, words", [
    (None, "builds: expected a non-empty list"),
    ({"builds": []}, "builds: expected a non-empty list"),
    ({"build": [BUILD]}, r"unknown key 'build' \(did you mean 'builds'\?\)"),
    ({"defaults": {"arch": ["sm_80"]}, "builds": [BUILD]},
     r"defaults: unknown key 'arch' \(did you mean 'archs'\?\)"),
    ({"builds": [BUILD, BUILD]}, r"builds\[1\] \(tensorflow 2.21\): cell tf2.21-cu12.5-py3.11 "
                                 r"is already defined by .*builds\[0\]"),
    ({"builds": ["2.21"]}, r"builds\[0\]: expected a mapping, got str '2.21'"),
    ({"defaults": {"archs": [OLD_ARCH]}, "builds": [BUILD]},
     rf"defaults: archs\[0\]: the kernels need sm_80 or newer; got '{OLD_ARCH}'"),
    ({"builds": [BUILD, {**BUILD, **OTHER_CUDA, "python": ["3.12", "3.11"]}]},
     r"builds\[1\] \(tensorflow 2.21\): cell tf2.21-cu12.3-py3.11 builds TensorFlow 2.21 for Python "
     r"3.11, as cell tf2.21-cu12.5-py3.11 of .*builds\[0\] .* does: their wheels would have the "
     r"same file name"),
], ids=["empty", "no-builds", "top-typo", "defaults-typo", "duplicate", "not-a-mapping",
        "defaults-arch-too-old", "same-tf-and-python-other-cuda"])
def test_bad_matrix(data, words):
    with pytest.raises(ConfigError, match=words):
        parse_matrix(data, source="test-matrix.yaml")


def test_yaml_errors_name_the_file(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("builds: [\n")
    with pytest.raises(ConfigError, match=f"{path}: not valid YAML"):
        load_matrix(path)
    with pytest.raises(ConfigError, match="file not found"):
        load_matrix(tmp_path / "missing.yaml")


def test_select_cells():
    cells = make_cells({"python": ["3.11", "3.13"]}, {"tensorflow": "2.19", "cuda": "12.5"})
    assert [c.name for c in select_cells(cells, "tf2.21-.*py3.11")] == ["tf2.21-cu12.5-py3.11"]
    assert len(select_cells(cells, "py3.1")) == 3 and select_cells(cells, None) == cells
    with pytest.raises(ConfigError, match=r"CELLS='tf3' matches no cell; the cells are: tf2.21"):
        select_cells(cells, "tf3")
    with pytest.raises(ConfigError, match=r"CELLS='\(' is not a valid regular expression"):
        select_cells(cells, "(")


def test_the_project_matrix():
    """The committed matrix: every TF 2.16 .. 2.21 has a Python 3.11 cell; names are unique."""
    cells = load_matrix(ROOT / "matrix.yaml")
    main_cells = {c.tensorflow for c in cells if c.python == "3.11"}
    assert {"2.16", "2.17", "2.18", "2.19", "2.20", "2.21"} <= main_cells
    assert len({c.name for c in cells}) == len(cells)
    assert all({"sm_80", "sm_90", "sm_100", "sm_120", "compute_80"} <= set(c.archs) for c in cells)


def test_same_tensorflow_other_python_and_cuda_is_fine():
    cells = make_cells({}, {**OTHER_CUDA, "python": ["3.12"]})
    assert [c.name for c in cells] == ["tf2.21-cu12.5-py3.11", "tf2.21-cu12.3-py3.12"]


def test_the_header_comment_is_true():
    """matrix.yaml's header names files that exist and the statuses the harness knows."""
    lines = (ROOT / "matrix.yaml").read_text().splitlines()
    header = "\n".join(itertools.takewhile(lambda line: line.startswith("#"), lines))
    paths = re.findall(r"(?<![\w/])([.\w-]+(?:/[\w.-]+)+\.(?:ya?ml|py))", header)
    assert paths and [p for p in paths if not (ROOT / p).is_file()] == []
    listed = re.search(r"^# status: (.*)", header, re.S | re.M).group(1)
    assert set(re.findall(r"([a-z]+(?:-[a-z]+)*) \(", listed)) == set(STATUSES)
