"""Build script.  The wheel's version and TensorFlow window come from the TensorFlow it is built
for: ``BLOCKSPARSE_TF_VERSION`` if set, else the installed ``tensorflow`` / ``tensorflow-cpu``.
An sdist is made for one TensorFlow and keeps it: built from an unpacked sdist (its ``PKG-INFO``
beside this file), the wheel takes the sdist's version, whatever TensorFlow the build environment
holds (none, with pip's build isolation), so ``pip install blocksparse-2.21.0.tar.gz`` gives the
2.21.0 wheel: pure Python (the reference path; the GPU kernels come with the platform wheels).

When ``scripts/build_ops.py`` has built the kernel library and the TensorFlow op library into the
package (``make compile``), the wheel is a platform wheel tagged from their manifest
(``py3-none-manylinux_2_X_x86_64``: the libraries need no Python ABI, and X follows the glibc /
libstdc++ symbol versions they require); otherwise it is pure Python."""
import email.parser
import json
import os
import runpy
from importlib import metadata

from setuptools import Distribution, find_packages, setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
_version = runpy.run_path(os.path.join(HERE, "blocksparse", "_version.py"))


def _sdist_version():
    """The version in ``PKG-INFO`` when this is an unpacked sdist, else None."""
    try:
        with open(os.path.join(HERE, "PKG-INFO"), encoding="utf-8") as f:
            return email.parser.Parser().parse(f, headersonly=True)["Version"]
    except FileNotFoundError:
        return None


def _target_tf_version():
    wanted, sdist = os.environ.get("BLOCKSPARSE_TF_VERSION"), _sdist_version()
    if sdist:
        if wanted and _minor(wanted) != _minor(sdist):
            raise SystemExit(f"blocksparse: this sdist is blocksparse {sdist}, for TensorFlow "
                             f"{_minor(sdist)}; BLOCKSPARSE_TF_VERSION={wanted} asks for another: "
                             "take the sdist of that version")
        return sdist
    if wanted:
        return wanted
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    raise SystemExit("blocksparse: cannot tell which TensorFlow to build for; install tensorflow "
                     "(or tensorflow-cpu) in the build environment or set BLOCKSPARSE_TF_VERSION=X.Y")


_minor = _version["minor_text"]


def _op_library_build():
    """The manifest of the op library built into the package, or None (a pure wheel)."""
    path = os.path.join(HERE, "blocksparse", "_build_info.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    libraries = [info["library"], *([info["kernels_library"]] if "kernels_library" in info else [])]
    stale = ("rebuild it with `make compile`, or delete blocksparse/_build_info.json and "
             f"blocksparse/{' and blocksparse/'.join(libraries)} for a pure wheel")
    for library in libraries:
        if not os.path.exists(os.path.join(HERE, "blocksparse", library)):
            raise SystemExit(f"blocksparse: blocksparse/_build_info.json names {library}, "
                             f"which is missing; {stale}")
    if _minor(info["tensorflow"]) != _minor(TF_VERSION):
        raise SystemExit(f"blocksparse: the op library in blocksparse/ was built for TensorFlow "
                         f"{info['tensorflow']}, the wheel is for {TF_VERSION}; {stale}")
    return info


TF_VERSION = _target_tf_version()
LOW, HIGH = _version["tf_window"](TF_VERSION)
OP_LIBRARY = _op_library_build()


class BinaryDistribution(Distribution):
    """Holds a native library: its files belong in platlib, at the root of the wheel."""

    def has_ext_modules(self):
        return OP_LIBRARY is not None


class bdist_wheel(_bdist_wheel):
    """A platform wheel when the op library is built in, tagged as its manifest says."""

    def finalize_options(self):
        super().finalize_options()
        if OP_LIBRARY:
            self.root_is_pure = False

    def get_tag(self):
        if OP_LIBRARY:
            return "py3", "none", OP_LIBRARY["platform_tag"]
        return super().get_tag()


setup(
    name="blocksparse",
    version=_version["wheel_version"](TF_VERSION),
    description="Block-sparse matrix multiplication and friends for TensorFlow and PyTorch, "
                "with Triton GPU kernels and a portable reference path.",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    url="https://github.com/blocksparse/blocksparse",
    python_requires=">=3.10",
    packages=find_packages(include=["blocksparse", "blocksparse.*"]),
    # the dispatch cost model's measured tables (bench/dispatch.py) ship with the package
    package_data={"blocksparse": ["*.so", "_build_info.json"], "blocksparse.dispatch": ["tables/*.json"],
                  "blocksparse.torch": ["csrc/*.cpp", "csrc/*.h"]},
    install_requires=["numpy>=1.26"],
    extras_require={
        # Users hold either distribution; neither is a hard dependency (see README).
        "tensorflow": [f"tensorflow{LOW},{HIGH}"],
        "tensorflow-cpu": [f"tensorflow-cpu{LOW},{HIGH}"],
        "torch": ["torch>=2.4"],
    },
    cmdclass={"bdist_wheel": bdist_wheel},
    distclass=BinaryDistribution,
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: MIT License",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
