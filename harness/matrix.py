"""The build matrix: ``matrix.yaml`` validated into frozen `Cell` records.

``matrix.yaml`` lists *builds*, one per TensorFlow release (or the nightly); every Python version
of a build becomes one cell, named for its dimensions: ``tf2.21-cu12.5-py3.11``.  Everything that
depends on a TensorFlow / CUDA / Python version (Dockerfiles, the GPU workflow, the README table,
the executors) reads these records and nothing else.  Validated at load, every error naming the
build and the key: among others, each GPU target must be one the kernel compiler builds
(``blocksparse/aot/targets.py``: ``sm_80`` or newer, PTX ``compute_80`` to ``compute_89``), and
no two cells may build the same TensorFlow for the same Python (their wheels would share a name).

>>> cells = parse_matrix({"builds": [{"tensorflow": "2.21", "cuda": "12.5", "cudnn": "9.3",
...     "python": ["3.11", "3.13"], "image": "nvidia/cuda:12.5.1-devel-ubuntu22.04"}]})
>>> [c.name for c in cells]
['tf2.21-cu12.5-py3.11', 'tf2.21-cu12.5-py3.13']
>>> cells[0].tf_requirement("cpu"), cells[0].archs
('tensorflow-cpu==2.21.*', ('sm_80', 'sm_90'))
"""
import re
import runpy
from dataclasses import dataclass

from ._schema import Fields, load_yaml
from .errors import ConfigError
from .templating import ROOT
from .versions import MIN_TF, tf_minor

__all__ = ["Cell", "STATUSES", "PYTHONS", "load_matrix", "parse_matrix", "select_cells",
           "arch_problem"]

#: Cell statuses: ``supported`` cells are built and tested and gate the run; ``compile-only``
#: cells are built but not tested; ``allowed-to-fail`` cells run fully but never fail the run.
STATUSES = ("supported", "compile-only", "allowed-to-fail")
#: Python versions a cell may use (blocksparse needs >= 3.10).
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
#: The Python each base-image distribution ships; other versions come from the deadsnakes PPA.
DISTRO_PYTHON = {"ubuntu22.04": "3.10", "ubuntu24.04": "3.12"}

_DEFAULTS = {"archs": ("sm_80", "sm_90"), "status": "supported",
             "runs_on": ("self-hosted", "linux", "x64", "gpu")}
_BUILD_KEYS = ("tensorflow", "cuda", "cudnn", "python", "image", "archs", "status", "runs_on")
_IMAGE = r"[a-z0-9]+(?:[._/-][a-z0-9]+)*:[A-Za-z0-9][A-Za-z0-9._-]*"
#: cubin targets (sm_XY) and PTX targets (compute_XY: 8.x only, see blocksparse.aot.targets)
ARCH_PATTERN = r"sm_\d{2,3}a?|compute_8\d"  # one GPU target of a build
#: The kernel compiler's own reading of GPU targets, loaded by path (importing blocksparse
#: would import numpy, which the harness does not need).
_parse_targets = runpy.run_path(str(ROOT / "blocksparse" / "aot" / "targets.py"))["parse_targets"]
_RUNNER_LABEL = r"[A-Za-z0-9][A-Za-z0-9._-]*"


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One TensorFlow x CUDA x Python combination, built and tested on its own.

    Attributes
    ----------
    name : str
        ``tf<tensorflow>-cu<cuda>-py<python>``, e.g. ``tf2.21-cu12.5-py3.11``.
    tensorflow : str
        ``"X.Y"`` (a release line) or ``"nightly"``.
    cuda, cudnn : str
        ``"X.Y"``: TensorFlow's tested build configuration for this release.
    python : str
        ``"3.N"``.
    image : str
        Fully tagged base image of the cell's container.
    archs : tuple of str
        GPU architectures to compile kernels for: cubins (``sm_80`` ...) and the portable
        kernels' PTX (``compute_80``), which the driver JIT-compiles on any later GPU.
    status : str
        One of `STATUSES`.
    runs_on : tuple of str
        Runner labels of the cell's CI job.
    """

    name: str
    tensorflow: str
    cuda: str
    cudnn: str
    python: str
    image: str
    archs: tuple
    status: str
    runs_on: tuple

    @property
    def nightly(self):
        return self.tensorflow == "nightly"

    @property
    def tested(self):
        """Whether the test suite runs in this cell (all but ``compile-only`` cells)."""
        return self.status != "compile-only"

    @property
    def gating(self):
        """Whether a failure of this cell fails the run (all but ``allowed-to-fail`` cells)."""
        return self.status != "allowed-to-fail"

    @property
    def distro(self):
        """The base image's distribution, e.g. ``ubuntu22.04``."""
        return _distro(self.image)

    @property
    def distro_python(self):
        """Whether the distribution's own Python is the cell's Python."""
        return DISTRO_PYTHON[self.distro] == self.python

    def tf_requirement(self, flavor):
        """The pip requirement for this cell's TensorFlow.

        ``flavor="cpu"`` is what the local executor installs (no CUDA libraries);
        ``flavor="cuda"`` is what the container installs (CUDA and cuDNN as pip wheels).
        """
        if flavor not in ("cpu", "cuda"):
            raise ValueError(f"flavor must be 'cpu' or 'cuda'; got {flavor!r}")
        if self.nightly:
            return "tf-nightly-cpu" if flavor == "cpu" else "tf-nightly[and-cuda]"
        if flavor == "cpu":
            return f"tensorflow-cpu=={self.tensorflow}.*"
        return f"tensorflow[and-cuda]=={self.tensorflow}.*"

    def cuda_pins(self):
        """Pins that hold the CUDA runtime and cuDNN wheels to the cell's versions."""
        return (f"nvidia-cuda-runtime-cu12=={self.cuda}.*", f"nvidia-cudnn-cu12=={self.cudnn}.*")


def cell_name(tensorflow, cuda, python):
    """``tf2.21-cu12.5-py3.11``."""
    return f"tf{tensorflow}-cu{cuda}-py{python}"


def _distro(image):
    match = re.search(r"(ubuntu\d\d\.\d\d)$", image)
    return match.group(1) if match else None


def arch_problem(arch):
    """Why the kernel compiler cannot build for GPU target ``arch`` (a sentence), or None.

    >>> arch_problem("sm_90"), arch_problem("sm_75")
    (None, "the kernels need sm_80 or newer; got 'sm_75'")
    """
    if not re.fullmatch(ARCH_PATTERN, arch):
        return f"expected a GPU target such as sm_90 or compute_80 (matching {ARCH_PATTERN}); got {arch!r}"
    try:
        _parse_targets([arch])
    except ValueError as e:
        return str(e)
    return None


def load_matrix(path):
    """Read and validate ``matrix.yaml``; returns the cells in file order."""
    return parse_matrix(load_yaml(path), source=str(path))


def parse_matrix(data, source="matrix.yaml"):
    """Validate the parsed YAML of a matrix and expand it into a tuple of `Cell` (pure)."""
    data = {} if data is None else data
    top = Fields(data, source, ("defaults", "builds"))
    defaults = dict(_DEFAULTS)
    if top.has("defaults"):
        given = Fields(data["defaults"], f"{source}: defaults", tuple(_DEFAULTS))
        defaults.update({k: v for k, v in _read_common(given).items() if v is not None})
    builds = data.get("builds")
    if not isinstance(builds, list) or not builds:
        raise ConfigError(f"{source}: builds: expected a non-empty list of builds")
    cells, seen, wheels = [], {}, {}
    for i, build in enumerate(builds):
        tf = build.get("tensorflow") if isinstance(build, dict) else None
        where = f"{source}: builds[{i}]" + (f" (tensorflow {tf})" if isinstance(tf, str) else "")
        for cell in _expand_build(Fields(build, where, _BUILD_KEYS), defaults):
            if cell.name in seen:
                raise ConfigError(f"{where}: cell {cell.name} is already defined by "
                                  f"{seen[cell.name]}")
            other = wheels.get((cell.tensorflow, cell.python))
            if other is not None:  # the CUDA version is not part of a wheel's name
                raise ConfigError(f"{where}: cell {cell.name} builds TensorFlow {cell.tensorflow} "
                                  f"for Python {cell.python}, as cell {other.name} of "
                                  f"{seen[other.name]} does: their wheels would have the same "
                                  f"file name; keep one CUDA version per TensorFlow")
            seen[cell.name], wheels[(cell.tensorflow, cell.python)] = where, cell
            cells.append(cell)
    return tuple(cells)


def _read_common(f):
    """The keys a build shares with ``defaults`` (None where absent)."""
    archs = f.string_list("archs", pattern=ARCH_PATTERN, example="sm_90", required=False)
    for i, arch in enumerate(archs or ()):
        if arch_problem(arch):
            raise f.error(f"archs[{i}]", arch_problem(arch))
    return {
        "archs": archs,
        "status": f.choice("status", STATUSES, required=False) if f.has("status") else None,
        "runs_on": f.string_list("runs_on", pattern=_RUNNER_LABEL, example="gpu",
                                 required=False, scalar_ok=True),
    }


def _version(f, key, example, other=None):
    """``X.Y`` (or ``other``), without leading zeros: pip reads ``2.021`` as ``2.21``, so two
    spellings would make two cells that build the same wheel."""
    value = f.string(key, pattern=r"\d+\.\d+" + (f"|{other}" if other else ""), example=example)
    if re.search(r"(^|\.)0\d", value):
        canonical = ".".join(str(int(n)) for n in value.split("."))
        raise f.error(key, f"write versions without leading zeros ({canonical!r}; pip reads both "
                           f"the same); got {value!r}")
    return value


def _expand_build(f, defaults):
    tensorflow = _version(f, "tensorflow", "2.21", other="nightly")
    if tensorflow != "nightly":
        if tf_minor(tensorflow) < MIN_TF:
            raise f.error("tensorflow", f"blocksparse supports TensorFlow >= "
                                        f"{'.'.join(map(str, MIN_TF))}; got {tensorflow}")
    cuda = _version(f, "cuda", "12.5")
    cudnn = _version(f, "cudnn", "9.3")
    pythons = f.string_list("python", pattern=r"3\.\d+", example="3.11", scalar_ok=True)
    for py in pythons:
        if py not in PYTHONS:
            raise f.error("python", f"expected versions among {', '.join(PYTHONS)}; got {py}")
    image = f.string("image", pattern=_IMAGE, example="nvidia/cuda:12.5.1-devel-ubuntu22.04")
    tag = image.rsplit(":", 1)[1]
    if tag == "latest":
        raise f.error("image", f"must be fully tagged (not :latest); got {image!r}")
    if not tag.startswith(f"{cuda}."):
        raise f.error("image", f"tag must start with the cell's CUDA version {cuda}.<patch> "
                               f"(e.g. nvidia/cuda:{cuda}.1-devel-ubuntu22.04); got {image!r}")
    if _distro(image) not in DISTRO_PYTHON:
        raise f.error("image", f"tag must end with one of {', '.join(DISTRO_PYTHON)}; "
                               f"got {image!r}")
    common = {k: v if v is not None else defaults[k] for k, v in _read_common(f).items()}
    return [Cell(name=cell_name(tensorflow, cuda, py), tensorflow=tensorflow, cuda=cuda,
                 cudnn=cudnn, python=py, image=image, **common) for py in pythons]


def select_cells(cells, pattern):
    """The cells whose name matches ``pattern`` (``re.search``; None selects all)."""
    if pattern is None or pattern == "":
        return tuple(cells)
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"CELLS={pattern!r} is not a valid regular expression ({e})") from None
    chosen = tuple(c for c in cells if regex.search(c.name))
    if not chosen:
        raise ConfigError(f"CELLS={pattern!r} matches no cell; the cells are: "
                          + ", ".join(c.name for c in cells))
    return chosen
