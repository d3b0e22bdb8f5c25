"""Build a kernel library of a few named specs of registered families:
``python subset_build.py OUT FAMILY:SPEC_NAME ...`` (a subprocess of the tests: ahead-of-time
compilation needs Triton's compiler, which ``TRITON_INTERPRET`` in the test process would replace
by the interpreter).  Families keep their names, so their C finds the specs."""
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blocksparse.aot import build_sources  # noqa: E402
from blocksparse.aot.family import Family, registered  # noqa: E402
from blocksparse.aot.native import build_kernel_library  # noqa: E402


def subset(family, names):
    """``family`` restricted to the specs called ``names``."""
    module = family.module
    return Family(family.name, SimpleNamespace(
        specializations=lambda archs: [s for s in module.specializations(archs) if s.name in names],
        kernel=module.kernel, compile_args=module.compile_args, fields=module.fields))


if __name__ == "__main__":
    out, wanted = Path(sys.argv[1]), [a.split(":", 1) for a in sys.argv[2:]]
    families = [subset(f, {name for fam, name in wanted if fam == f.name})
                for f in registered(sorted({fam for fam, _ in wanted}))]
    archs = sorted({int(name.rsplit("_sm", 1)[1]) for _, name in wanted})
    source, _ = build_sources(archs, out, jobs=1, families=families)  # in process: the subsets are no modules
    build_kernel_library(source, out / "_kernels.so", jobs=2)
