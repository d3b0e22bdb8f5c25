"""The layer-norm and LSTM-gate tile tables compile for sm_90 without heavy register spills.

The kernels hold the next tile's loads in registers while they work on the current one; a tile
too large for that spills to local memory (a float32 ``(C, N)`` backward holding 16384 elements
spilled 3.2 KB a thread and ran at 0.08 of HBM bandwidth, where the tables' tiles, with up to
~300 bytes, run at 0.7-0.9).  Every tile the tables give for bfloat16 and float32 calls is
compiled as the kernel library compiles it and read with ``cuobjdump`` (no GPU needed).
"""
import pytest

pytest.importorskip("triton")

from blocksparse.ops.lstm import aot as lstm_aot  # noqa: E402
from blocksparse.ops.norms import aot as norms_aot  # noqa: E402

pytestmark = pytest.mark.slow

#: Per-thread bytes of local memory a table's tile may spill.
MAX_STACK = 512


def _specs():
    """``family:name`` of every sm_90 tile of the two tables for 16- and 32-bit floats: forwards
    without the relu, backwards with it (it recomputes the forward: the larger of the two)."""
    names = [f"norms:{s.name}" for s in norms_aot.specializations([90])
             if getattr(s, "dtype", None) in ("bf16", "fp32") and s.aligned and s.relu == (s.product == "bwd")]
    names += [f"lstm:{s.name}" for s in lstm_aot.specializations([90]) if getattr(s, "dtype", None) in ("bf16", "fp32")]
    return names


@pytest.fixture(scope="module")
def usage():
    from kernel_build import resource_usage

    return resource_usage(_specs())


def test_no_tile_spills_more_than_a_little(usage):
    heavy = {r["name"]: r["stack"] for r in usage if r["stack"] > MAX_STACK}
    assert not heavy, f"tiles spilling more than {MAX_STACK} bytes a thread: {heavy}"


def test_the_check_reads_real_resource_counts(usage):
    """Every kernel uses registers (the reading is not silently zero)."""
    assert all(r["regs"] > 0 and r["num_warps"] >= 4 for r in usage)
