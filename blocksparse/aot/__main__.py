"""``python -m blocksparse.aot``: compile the kernels, write the C sources, optionally
build the standalone runtime library (see :mod:`blocksparse.aot`)."""
import argparse
import sys
import time

from . import build_sources, resolve_archs
from .native import build_runtime_library


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m blocksparse.aot", description=__doc__)
    parser.add_argument("--out", required=True, help="directory for the cubins and bsk_specs.c")
    parser.add_argument("--archs", help="e.g. sm_80,sm_90 (default: BLOCKSPARSE_CUDA_ARCHS, "
                                        "matrix.yaml, else sm_80,sm_90)")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the CPUs)")
    parser.add_argument("--library", action="store_true",
                        help="also build OUT/libblocksparse_kernels.so (ctypes-loadable)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    source, manifest = build_sources(resolve_archs(args.archs), args.out, jobs=args.jobs)
    specs = manifest["specializations"]
    print(f"compiled {len(specs)} kernels for {', '.join(manifest['archs'])} "
          f"({sum(s['cubin_bytes'] for s in specs) / 2**20:.1f} MiB of cubins) in "
          f"{time.perf_counter() - start:.0f} s -> {source}")
    if args.library:
        print(build_runtime_library(source, f"{args.out}/libblocksparse_kernels.so"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
