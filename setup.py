"""Build script.  The wheel's version and TensorFlow window come from the TensorFlow it is built
for: ``BLOCKSPARSE_TF_VERSION`` if set, else the installed ``tensorflow`` / ``tensorflow-cpu``."""
import os
import runpy
from importlib import metadata

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
_version = runpy.run_path(os.path.join(HERE, "blocksparse", "_version.py"))


def _target_tf_version():
    if os.environ.get("BLOCKSPARSE_TF_VERSION"):
        return os.environ["BLOCKSPARSE_TF_VERSION"]
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    raise SystemExit("blocksparse: cannot tell which TensorFlow to build for; install tensorflow "
                     "(or tensorflow-cpu) in the build environment or set BLOCKSPARSE_TF_VERSION=X.Y")


TF_VERSION = _target_tf_version()
LOW, HIGH = _version["tf_window"](TF_VERSION)

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
    package_data={"blocksparse": ["*.so", "_build_info.json", "kernels/aot/*"]},
    install_requires=["numpy>=1.26"],
    extras_require={
        # Users hold either distribution; neither is a hard dependency (see README).
        "tensorflow": [f"tensorflow{LOW},{HIGH}"],
        "tensorflow-cpu": [f"tensorflow-cpu{LOW},{HIGH}"],
        "torch": ["torch>=2.4"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: MIT License",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
