#!/usr/bin/env bash
# Build the blocksparse wheel for the TensorFlow installed in $PYTHON's environment.
#
# The one build entry point: `make compile` and every matrix cell (scripts/run_cell.sh) call it,
# so a change to how the package is built lands everywhere at once.
#
# Usage (from the source tree's root):  PYTHON=/path/to/python scripts/build_wheel.sh OUTDIR
# The environment must hold TensorFlow (setup.py versions the wheel after it, unless
# BLOCKSPARSE_TF_VERSION=X.Y says otherwise), setuptools and wheel: the build is not isolated.
set -euo pipefail
out=${1:?usage: scripts/build_wheel.sh OUTDIR}
python=${PYTHON:-python3}
"$python" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check -w "$out" .
