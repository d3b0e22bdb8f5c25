"""Build the toy family's kernel library: ``python toy_build.py OUT [ARCHS]`` (default
``sm_80,sm_90``; e.g. ``sm_90,sm_100,sm_120,compute_80``) -- a subprocess of the tests:
ahead-of-time compilation needs Triton's compiler, which ``TRITON_INTERPRET`` in the test process
would replace by the interpreter)."""
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import toy_family  # noqa: E402

from blocksparse.aot import build_sources, parse_archs  # noqa: E402
from blocksparse.aot.family import Family  # noqa: E402
from blocksparse.aot.native import build_kernel_library  # noqa: E402

if __name__ == "__main__":
    out = Path(sys.argv[1])
    archs = parse_archs(sys.argv[2] if len(sys.argv) > 2 else "sm_80,sm_90")
    source, _ = build_sources(archs, out, jobs=1, families=[Family("toy", toy_family)])
    build_kernel_library(source, out / "_kernels.so", jobs=1)
