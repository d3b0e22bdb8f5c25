"""The persistent Gluon fprop / bprop (:mod:`blocksparse.ops.matmul.xprop_gluon`) compiles for sm_90
without a GPU: every tile the benchmark sweeps fits the shared memory of a Hopper SM, spills nothing,
and runs its products on wgmma (the GPU test checks the values)."""
import json

import pytest

pytest.importorskip("triton.experimental.gluon")

pytestmark = pytest.mark.slow

COMPILE = """
import json, sys
from blocksparse.aot.resources import cubin_usage
from blocksparse.ops.matmul.xprop_gluon import GluonTile, compile_for
out = []
for tile, bs, trans, bias in json.loads(sys.argv[1]):
    c = compile_for(GluonTile(*tile), bs=bs, trans=trans, bias=bias)
    out.append(dict(cubin_usage(c.asm["cubin"]), shared=c.metadata.shared, wgmma=c.asm["ptx"].count("wgmma.mma_async")))
print(json.dumps(out))
"""

#: (tile, block size, transposed weight, bias) -- the widest tiles of each block size, both directions
CASES = [((128, 256, 64, 3, 8, 1), 256, False, True), ((128, 256, 64, 3, 8, 1), 256, True, False),
         ((256, 128, 64, 3, 8, 1), 128, False, True), ((128, 64, 64, 8, 4, 1), 64, True, False)]

#: Shared memory of one Hopper SM a block may take (bytes).
HOPPER_SMEM = 227 * 1024


def test_tiles_fit_a_hopper_sm_without_spills():
    from kernel_build import compiled_in_subprocess

    for case, got in zip(CASES, compiled_in_subprocess(COMPILE, json.dumps(CASES))):
        assert got["stack"] == 0 and got["local"] == 0, (case, got)
        assert 0 < got["shared"] <= HOPPER_SMEM, (case, got)
        assert got["wgmma"] > 0 and 0 < got["regs"] <= 255, (case, got)


@pytest.mark.parametrize("value, on", [("on", True), ("1", True), ("TRUE", True), ("off", False), ("", False)])
def test_the_switch_is_off_unless_asked(monkeypatch, value, on):
    from blocksparse import _env

    monkeypatch.setenv("BLOCKSPARSE_GLUON", value)
    assert _env.gluon_xprop() is on


def test_cpu_calls_never_take_it(monkeypatch):
    torch = pytest.importorskip("torch")
    from blocksparse.layout import Layout
    from blocksparse.torch._matmul.plan import _gluon_serves

    monkeypatch.setenv("BLOCKSPARSE_GLUON", "on")
    x = torch.zeros(16, 64, dtype=torch.bfloat16)
    assert not _gluon_serves(Layout([[1, 0], [1, 1]], 32), x, 1, True, 90)
