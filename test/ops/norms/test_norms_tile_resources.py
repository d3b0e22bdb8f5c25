"""The layer-norm and LSTM-gate tile tables compile for sm_90 without heavy register spills.

The kernels hold the next tile's loads in registers while they work on the current one; a tile
too large for that spills to local memory (a float32 ``(C, N)`` backward holding 16384 elements
spilled 3.2 KB a thread and ran at 0.08 of HBM bandwidth, where the tables' tiles, with up to
~300 bytes, run at 0.7-0.9).  Every tile the tables give for bfloat16 and float32 calls is
compiled as the kernel library compiles it and read with ``cuobjdump`` (no GPU needed).

The same cubins show whether the loads are vectors: compiled without the divisibility of their
masks' bound (the segment length, the token count, the reduction's row length) the layer-norm
kernels of the library loaded 16 bits at a time and ran 1.3-3x slower than Triton's JIT of the
same tiles.
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
    without the relu, backwards (the split backward's two kernels too) with it (it recomputes the forward: the larger of the two); aligned,
    and the float32 unaligned ``(C, N)`` ones (scalar loads: the aligned tiles spilled 0.7-2.3 KB
    there).  The 16-bit unaligned ``(C, N)`` tiles spill but were measured faster than the tiles
    that do not (``configs.UNALIGNED_TOKEN_TILES``)."""
    names = [f"norms:{s.name}" for s in norms_aot.specializations([90])
             if getattr(s, "dtype", None) in ("bf16", "fp32") and (s.aligned or s.axis == 0 and s.dtype == "fp32")
             and s.relu == (s.product != "fwd")]
    names += [f"lstm:{s.name}" for s in lstm_aot.specializations([90]) if getattr(s, "dtype", None) in ("bf16", "fp32")]
    names += [f"norms:{s.name}" for s in norms_aot.specializations([90]) if s.product == "sum_rows"]
    return names


@pytest.fixture(scope="module")
def usage():
    from kernel_build import resource_usage

    return resource_usage(_specs())


def test_no_tile_spills_more_than_a_little(usage):
    heavy = {r["name"]: r["stack"] for r in usage if r["stack"] > MAX_STACK}
    assert not heavy, f"tiles spilling more than {MAX_STACK} bytes a thread: {heavy}"


def test_aligned_tiles_load_vectors(usage):
    """Every aligned tile loads its activations as 64- or 128-bit vectors (the statistics and the
    parameters of a short segment stay scalar); an unaligned reduction's loads are all scalar: the
    reading discriminates.  Before the fix no layer-norm tile of the library had a vector load."""
    aligned = [r for r in usage if "_a0u_" not in r["name"]
               and (not r["name"].startswith("sum_rows_") or "u" not in r["name"].split("_")[2])]
    scalar = {r["name"]: r["scalar_loads"] for r in aligned if not r["vector_loads"]}
    assert not scalar, f"tiles without a vector load (their scalar loads): {scalar}"
    unaligned = [r for r in usage if r["name"].startswith("sum_rows_abu")]
    assert unaligned and all(r["vector_loads"] == 0 < r["scalar_loads"] for r in unaligned)


def test_the_check_reads_real_resource_counts(usage):
    """Every kernel uses registers (the reading is not silently zero)."""
    assert all(r["regs"] > 0 and r["num_warps"] >= 4 for r in usage)
