"""The matmul tile tables' float32 kernels compile for sm_90 without heavy register spills.

Triton multiplies float32 tiles exactly with FMA instructions; for ``(C, N)`` activations the
kernels read the activation tiles transposed, and the general float32 tiles then held 32
registers and 3.5-5.6 KB of stack a thread (blocks of 64 and 128).  The tables give those calls
their own tiles (``configs._XPROP_T``); every float32 spec of the kernel library for sm_90 is
compiled as the library compiles it and read with ``cuobjdump`` (no GPU needed).  So are the
bfloat16 ``(C, N)`` pointer updat specs for token counts not a multiple of 16: they load element
by element, and the tables' tiles spilled 0.22-2.1 KB a thread there (``configs.unaligned_updat``).
"""
import pytest

pytest.importorskip("triton")

from blocksparse.ops.matmul import aot as matmul_aot, configs  # noqa: E402

pytestmark = pytest.mark.slow

#: Per-thread bytes of local memory a table's tile may spill (the measured 16-bit tiles: <= 300).
MAX_STACK = 512


@pytest.fixture(scope="module")
def usage():
    from kernel_build import resource_usage

    specs = matmul_aot.specializations([90])
    unaligned = [s for s in specs if s.dtype == "bf16" and configs._serves_unaligned_updat(s) and not s.ticket]
    return resource_usage([f"matmul:{s.name}" for s in [s for s in specs if s.dtype == "fp32"] + unaligned])


def test_no_tile_spills_more_than_a_little(usage):
    heavy = {r["name"]: r["stack"] for r in usage if r["stack"] > MAX_STACK}
    assert not heavy, f"tiles spilling more than {MAX_STACK} bytes a thread: {heavy}"


def test_both_layouts_are_checked(usage):
    assert {"_ax0_", "_ax1_"} <= {a for r in usage for a in ("_ax0_", "_ax1_") if a in r["name"]}
    assert all(r["regs"] > 0 for r in usage)
    assert any(r["name"].startswith("updat_bf16_") for r in usage)
