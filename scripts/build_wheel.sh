#!/usr/bin/env bash
# Build the blocksparse wheel for the TensorFlow installed in $PYTHON's environment.
#
# The one build entry point: `make compile` and every matrix cell (scripts/run_cell.sh) call it,
# so a change to how the package is built lands everywhere at once.
#
# Usage (from the source tree's root):  PYTHON=/path/to/python scripts/build_wheel.sh OUTDIR
# Steps: scripts/build_ops.py compiles the GPU kernels ahead of time (archs: BLOCKSPARSE_CUDA_ARCHS,
# else matrix.yaml, else sm_80,sm_90) into the kernel library (blocksparse/_kernels.so, which the
# PyTorch frontend loads too) and the TensorFlow op library linked against it
# (blocksparse/_tf_ops.so), then pip builds the platform wheel (setup.py tags it from
# blocksparse/_build_info.json).  The
# environment must hold TensorFlow (setup.py versions the wheel after it, unless
# BLOCKSPARSE_TF_VERSION=X.Y says otherwise), Triton, setuptools and wheel, and the machine a
# C/C++ compiler: the build is not isolated.  BLOCKSPARSE_PURE_WHEEL=1 skips the op library and
# builds a pure-Python wheel (the reference path only).
set -euo pipefail
out=${1:?usage: scripts/build_wheel.sh OUTDIR}
python=${PYTHON:-python3}
rm -f blocksparse/_tf_ops.so blocksparse/_kernels.so blocksparse/_build_info.json  # never ship a stale build
if [[ "${BLOCKSPARSE_PURE_WHEEL:-0}" != 1 ]]; then
    "$python" scripts/build_ops.py --out blocksparse
fi
"$python" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check -w "$out" .
