"""Split reductions finished inside the kernels (``blocksparse.ops.matmul.ticket``), through
Triton's interpreter against float64: every segment or token slice adds its sums into the zeroed
workspace, the last to take a ticket writes the output in its own dtype (with the bias), and the
workspace and counters are zero again afterwards."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.ops.matmul.configs import UpdatConfig, XpropConfig  # noqa: E402
from blocksparse.testing import TOLERANCE as TOL  # noqa: E402
from blocksparse.testing import rel_error as rel_err  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.torch import _scratch  # noqa: E402
from blocksparse.torch._matmul import launch as _triton  # noqa: E402

pytestmark = pytest.mark.interpreter

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _split_layout(rng, bs, CB, KB):
    """A random layout (an empty row and column) where some fprop column and some bprop row hold
    several blocks, so that segments of one block split them."""
    while True:
        lay = Layout(random_layout(rng, CB, KB, 0.7, empty_rows=1, empty_cols=1), bs)
        if all(getattr(lay, kind)(1).num_segments > getattr(lay, kind)(None).num_segments
               for kind in ("fprop", "bprop")):
            return lay


def _problem(rng, bs, axis, n, dtype, CB=5, KB=4):
    lay = _split_layout(rng, bs, CB, KB)
    t = lambda a: torch.from_numpy(a).to(DTYPES[dtype])  # noqa: E731
    x = t(rng.standard_normal((n, lay.C) if axis == 1 else (lay.C, n)))
    dy = t(rng.standard_normal((n, lay.K) if axis == 1 else (lay.K, n)))
    w = t(rng.standard_normal(lay.w_shape) / np.sqrt(bs))
    refs = dense_products(lay, x.double().numpy(), w.double().numpy(), dy.double().numpy(), axis)
    return lay, x, w, dy, refs


def _assert_scratch_clean():
    for ws, counters in _scratch._buffers.values():
        assert not ws.any() and not counters.any(), "a launch left its workspace or counters dirty"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("variant, group, kb, bn, n", [("ptr", 1, 1, 0, 9), ("ptr", 2, 1, 0, 17), ("ptr", 1, 2, 16, 16),
                                                       ("tma", 1, 1, 0, 24), ("tma", 2, 1, 0, 8),
                                                       ("tma", 1, 1, 16, 16)],
                         ids=["ptr-G1", "ptr-G2", "ptr-KB2-BN16", "tma-G1", "tma-G2", "tma-BN16"])
def test_xprop_segments_finished_in_the_kernel(rng, dtype, axis, variant, group, kb, bn, n):
    lay, x, w, dy, (y_ref, dx_ref, _) = _problem(rng, 32, axis, n, dtype)
    cfg = XpropConfig(BM=16, G=group, num_warps=4, num_stages=1, BN=bn, KB=kb, TMA=variant == "tma")
    bias = torch.from_numpy(rng.standard_normal(lay.K)).to(DTYPES[dtype])
    direct = _triton.xprop_tma if variant == "tma" else _triton.xprop_ptr
    for kind, inp, out_features, ref in (("fprop", x, lay.K, y_ref), ("bprop", dy, lay.C, dx_ref)):
        lut = getattr(lay, kind)(1, group=group)  # every entry its own segment: most tiles split
        assert lut.num_segments > lut.num_groups
        headers, entries, offsets = (torch.from_numpy(np.array(a)) for a in (lut.headers, lut.entries, lut.offsets))
        add = kind == "fprop"
        with poisoned_empty():
            got = direct(inp, w, headers, entries, out_features=out_features, bs=32, axis=axis,
                         trans=kind == "bprop", cfg=cfg, atomic=False, precision="ieee",
                         bias=bias if add else None, offsets=offsets.to(torch.int32))
        if add:
            b = bias.double().numpy()
            ref = ref + (b if axis == 1 else b[:, None])
        assert got.dtype == inp.dtype
        assert rel_err(got.double().numpy(), ref) < TOL[dtype], kind
        _assert_scratch_clean()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("variant, group", [("ptr", 1), ("ptr", 4), ("tma", 1), ("tma", 2)])
def test_updat_slices_finished_in_the_kernel(rng, dtype, axis, variant, group):
    lay, x, w, dy, (_, _, dw_ref) = _problem(rng, 16, axis, 80 if variant == "tma" else 70, dtype, CB=3, KB=7)
    groups = torch.from_numpy(np.array(lay.updat_groups(group)))
    direct = _triton.updat_tma if variant == "tma" else _triton.updat_ptr
    cfg = UpdatConfig(G=group, BK=16, num_warps=4, num_stages=1, TMA=variant == "tma")
    for dw_dtype in (torch.float32, DTYPES[dtype]):
        with poisoned_empty():
            got = direct(x, dy, groups, w_shape=lay.w_shape, bs=16, axis=axis, cfg=cfg, split=4,
                         precision="ieee", dw_dtype=dw_dtype, ticket=True)
        assert got.dtype == dw_dtype
        assert rel_err(got.double().numpy(), dw_ref) < TOL[dtype]
        _assert_scratch_clean()


def test_scratch_grows_and_is_kept_per_device_and_stream():
    ws, counters = _scratch.scratch("cpu", 10, 5)
    assert ws.dtype == torch.float32 and counters.dtype == torch.int32 and not ws.any()
    again = _scratch.scratch("cpu", 10, 5)
    assert again[0] is ws and again[1] is counters
    bigger, _ = _scratch.scratch("cpu", ws.numel() + 1, 5)
    assert bigger.numel() > ws.numel() and not bigger.any()
    # the outgrown one stays allocated: a CUDA graph captured with it may still replay it
    assert any(t is ws for t in _scratch._outgrown)
