"""What a compiled kernel holds (registers a thread, spilled bytes, shared memory), read from its
cubin with the ``cuobjdump`` that ships with Triton: checked on any machine, before GPU time.

    python -m blocksparse.aot.resources FAMILY:SPEC_NAME ...     # one JSON line per spec

Spills (``stack``: per-thread bytes in local memory) are what a tile table must keep small: a
prefetching layer-norm backward whose tile held 16384 float32 elements spilled 3.2 KB a thread and
ran at 0.08 of HBM bandwidth.  Global loads by width (``LDG`` and the ``cp.async`` copies ``LDGSTS``;
``vector_loads``: 64 or 128 bits a thread, ``scalar_loads``: narrower) show whether Triton vectorised them: the layer-norm kernels compiled
without the divisibility of their masks' bound loaded 16 bits at a time and ran 1.3-3x slower.  Compiling needs Triton's compiler, so ``TRITON_INTERPRET`` must be
unset (the command line unsets it).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

__all__ = ["cubin_usage", "spec_usage"]


def cubin_usage(cubin: bytes) -> dict:
    """``{"regs", "stack", "local", "vector_loads", "scalar_loads"}`` of the (single) kernel in
    ``cubin`` (the loads: global loads and ``cp.async`` copies of 64 / 128 bits, and narrower ones)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"(REG|LOCAL|STACK):(\d+)", out))
    usage = {name: int(found.get(key, 0)) for name, key in (("regs", "REG"), ("stack", "STACK"), ("local", "LOCAL"))}
    loads = re.findall(r"\bLDG(?:STS)?((?:\.\w+)*)", sass)  # plain global loads and cp.async copies
    usage["vector_loads"] = sum(1 for mods in loads if re.search(r"\.(64|128)\b", mods))
    usage["scalar_loads"] = len(loads) - usage["vector_loads"]
    return usage


def spec_usage(family, spec) -> dict:
    """Compile ``spec`` of ``family`` (a :class:`blocksparse.aot.family.Family`) as the kernel
    library would and read its cubin: ``{"name", "num_warps", "shared", "regs", "stack", "local"}``."""
    from .compile import compile_spec

    kernel = compile_spec(family, spec)
    return {"name": spec.name, "num_warps": kernel.num_warps, "shared": kernel.shared,
            **cubin_usage(kernel.cubin)}


def main(argv):
    os.environ.pop("TRITON_INTERPRET", None)
    from .family import registered

    wanted = [arg.split(":", 1) for arg in argv]
    for family in registered(sorted({name for name, _ in wanted})):
        names = {spec for name, spec in wanted if name == family.name}
        archs = sorted({int(n.rsplit("_sm", 1)[1]) for n in names})
        specs = [s for s in family.module.specializations(archs) if s.name in names]
        missing = names - {s.name for s in specs}
        if missing:
            raise SystemExit(f"{family.name} has no specs called {sorted(missing)}")
        for spec in specs:
            print(json.dumps({"family": family.name, **spec_usage(family, spec)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
