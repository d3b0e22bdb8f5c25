"""``python -m blocksparse.aot``: compile the registered kernels, write the C sources, optionally
build the kernel library (see :mod:`blocksparse.aot`)."""
import argparse
import os
import sys
import time
from pathlib import Path

from . import build_sources, parse_filters, resolve_archs
from .native import KERNELS_LIBRARY, build_kernel_library


def main(argv=None):
    # Triton's CPU interpreter cannot compile kernels ahead of time: this always needs the compiler
    os.environ.pop("TRITON_INTERPRET", None)
    parser = argparse.ArgumentParser(prog="python -m blocksparse.aot", description=__doc__)
    parser.add_argument("--out", required=True, help="directory for the cubins, bsk_specs.c and the library")
    parser.add_argument("--archs", help="cubin targets sm_XY and PTX targets compute_XY, e.g. "
                                        "sm_80,sm_90,sm_100,compute_80 (default: BLOCKSPARSE_CUDA_ARCHS, "
                                        "matrix.yaml, else sm_80,sm_90)")
    parser.add_argument("--dtypes", help="only kernels of these dtypes, e.g. bf16,fp32")
    parser.add_argument("--block-sizes", help="only kernels of these block sizes, e.g. 32,64")
    parser.add_argument("--families", help="only these op families (default: every registered one)")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the CPUs)")
    parser.add_argument("--library", action="store_true",
                        help=f"also build OUT/{KERNELS_LIBRARY}, the kernel library (point "
                             "BLOCKSPARSE_KERNELS at it)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    filters = parse_filters(args.dtypes, args.block_sizes, args.families)
    source, manifest = build_sources(resolve_archs(args.archs), args.out, jobs=args.jobs, **filters)
    specs = manifest["specializations"]
    print(f"compiled {len(specs)} kernels of {', '.join(manifest['families'])} for "
          f"{', '.join(manifest['archs'] + manifest['ptx'])} ({sum(s['cubin_bytes'] for s in specs) / 2**20:.1f} "
          f"MiB of cubins and PTX) in {time.perf_counter() - start:.0f} s -> {source}")
    for dropped in manifest["dropped"]:
        print(f"left out (it could never launch on its GPU): {dropped}")
    if args.library:
        print(build_kernel_library(source, Path(args.out) / KERNELS_LIBRARY, jobs=args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
