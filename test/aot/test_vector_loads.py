"""The kernel library's kernels load what Triton's JIT would: no divisibility hint left out.

Triton vectorises a masked load only where it knows the mask's bound (and the offsets) to be
multiples of the vector. The JIT specialises every integer argument that is a multiple of 16 as
such; the library compiles what each family's ``compile_args`` declares. The layer-norm specs once
declared neither their segment length nor their token count, loaded 16 bits at a time and ran
1.3-3x slower through the library than through the JIT. Here one spec of every kernel of every
family (the middle one of its aligned specs: an unaligned spec leaves a bound undeclared on
purpose) is compiled as built
and again with every ``i32`` parameter declared a multiple of 16, and the two must load the same
number of 64- / 128-bit vectors (read from the cubins with ``cuobjdump``; no GPU needed, compiled
in a process with Triton's interpreter off).
"""
import pytest

pytest.importorskip("triton")

pytestmark = pytest.mark.slow

SCRIPT = r"""
import dataclasses, json, sys
from blocksparse.aot.compile import compile_spec
from blocksparse.aot.family import registered
from blocksparse.aot.resources import cubin_usage
from blocksparse.ops.common.aot import SumRowsSpec


class EveryIntDivisible:
    # the family compiled as if each i32 parameter were a multiple of 16 (what the JIT assumes of a
    # call whose sizes and strides are)
    def __init__(self, family):
        self.family, self.name = family, family.name

    def kernel(self, spec):
        return self.family.kernel(spec)

    def fields(self, spec):
        return self.family.fields(spec)

    def compile_args(self, spec):
        args = self.family.compile_args(spec)
        ints = {name for name, kind in args.signature.items() if kind == "i32"}
        return dataclasses.replace(args, divisible=args.divisible | ints)


def loads(family, spec):
    return cubin_usage(compile_spec(family, spec).cubin)["vector_loads"]


rows = []
for family in registered():
    by_kernel = {}
    for spec in family.specializations([int(sys.argv[1])]):
        if getattr(spec, "aligned", True):
            by_kernel.setdefault(family.kernel(spec).__name__, []).append(spec)
    picked = [specs[len(specs) // 2] for specs in by_kernel.values()]
    if family.name == "norms":  # the control: an unaligned reduction, which the hint must change
        picked.append(SumRowsSpec(90, True, aligned=False, bp=256))
    for spec in picked:
        rows.append({"family": family.name, "name": spec.name, "aligned": getattr(spec, "aligned", True),
                     "kernel": family.kernel(spec).__name__,
                     "built": loads(family, spec), "hinted": loads(EveryIntDivisible(family), spec)})
print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def loads():
    from pathlib import Path

    import triton
    from kernel_build import compiled_in_subprocess

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").is_file():
        pytest.skip("Triton ships no cuobjdump here")
    return compiled_in_subprocess(SCRIPT, "90")


def test_no_divisibility_hint_left_out(loads):
    aligned = [r for r in loads if r["aligned"]]
    assert {r["family"] for r in aligned} >= {"matmul", "norms", "lstm", "transformer", "conv", "attention"}
    # the pointer kernels of the memory-bound families do vector loads at all (a reading of zeros
    # everywhere would pass the comparison)
    assert all(r["built"] > 0 for r in aligned if r["family"] in ("norms", "lstm"))
    left_out = {f"{r['family']}/{r['name']}": (r["built"], r["hinted"]) for r in aligned if r["built"] != r["hinted"]}
    assert not left_out, ("declaring their integer parameters multiples of 16 changes these specs' vector loads "
                          f"(built, hinted): compile_args leaves out a hint the calls could give: {left_out}")


def test_the_check_discriminates(loads):
    """The unaligned reduction (its row length left undeclared on purpose) gains vector loads from
    the hint: the comparison sees the difference it guards against."""
    (control,) = [r for r in loads if not r["aligned"]]
    assert control["built"] == 0 < control["hinted"]
