"""Kernel logic (LUT walks, output groups, segments + atomics, split reductions, edge masks)
through Triton's interpreter on small shapes, against float64 references."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.ops.matmul.configs import UpdatConfig, XpropConfig  # noqa: E402
from blocksparse.layout import Layout  # noqa: E402
from blocksparse.torch._matmul import launch as _triton  # noqa: E402
from blocksparse.testing import TOLERANCE as TOL  # noqa: E402
from blocksparse.testing.matmul import dense_products as products  # noqa: E402
from blocksparse.testing import rel_error as rel_err  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402

pytestmark = pytest.mark.interpreter

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _setup(rng, bs, axis, n, dtype, CB=3, KB=5, density=0.5):
    lay = Layout(random_layout(rng, CB, KB, density, empty_rows=1, empty_cols=1), bs)
    shape_x = (n, lay.C) if axis == 1 else (lay.C, n)
    shape_y = (n, lay.K) if axis == 1 else (lay.K, n)
    x, dy = rng.standard_normal(shape_x), rng.standard_normal(shape_y)
    w = rng.standard_normal(lay.w_shape) / np.sqrt(bs)
    t = lambda a: torch.from_numpy(a).to(DTYPES[dtype])  # noqa: E731
    ref = products(lay, t(x).double().numpy(), t(w).double().numpy(), t(dy).double().numpy(), axis)
    return lay, t(x), t(w), t(dy), ref


def _lut(lay, kind, max_segment, group):
    lut = getattr(lay, kind)(max_segment, group=group)
    return torch.from_numpy(np.array(lut.headers)), torch.from_numpy(np.array(lut.entries)), lut


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs, group, n", [(16, 1, 1), (16, 2, 7), (32, 1, 33), (16, 4, 19)],
                         ids=["bs16-G1-n1", "bs16-G2-n7", "bs32-G1-n33", "bs16-G4-n19"])
@pytest.mark.parametrize("max_segment", [None, 1], ids=["whole", "split"])
def test_xprop(rng, dtype, axis, bs, group, n, max_segment):
    lay, x, w, dy, (y_ref, dx_ref, _) = _setup(rng, bs, axis, n, dtype)
    cfg = XpropConfig(BM=16, G=group, num_warps=4, num_stages=1)
    for kind, inp, out_features, ref in (("fprop", x, lay.K, y_ref), ("bprop", dy, lay.C, dx_ref)):
        headers, entries, lut = _lut(lay, kind, max_segment, group)
        atomic = lut.num_segments > lut.num_groups
        got = _triton.xprop_ptr(inp, w, headers, entries, out_features=out_features, bs=bs, axis=axis,
                            trans=kind == "bprop", cfg=cfg, atomic=atomic, precision="ieee")
        assert got.dtype == inp.dtype
        assert rel_err(got.double().numpy(), ref) < TOL[dtype], kind


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs, kb, bn, n", [(16, 2, 16, 5), (32, 4, 16, 19), (16, 8, 0, 16)],
                         ids=["bs16-KB2", "bs32-KB4-BN16", "bs16-KB8-past-every-column"])
@pytest.mark.parametrize("max_segment", [None, 1], ids=["whole", "split"])
def test_xprop_takes_several_entries_a_step(rng, dtype, axis, bs, kb, bn, n, max_segment):
    """The few-token pointer tile: ``KB`` table entries a step (the last step of a column only
    partly filled, or a column shorter than one step) and ``BS // BN`` output slices a block, each
    its own program; also with a bias and with split reductions (float32 atomics)."""
    lay, x, w, dy, (y_ref, dx_ref, _) = _setup(rng, bs, axis, n, dtype, CB=5, KB=4, density=0.6)
    cfg = XpropConfig(BM=16, G=1, num_warps=4, num_stages=1, BN=bn, KB=kb, TMA=False)
    bias = torch.from_numpy(rng.standard_normal(lay.K)).to(DTYPES[dtype])
    for kind, inp, out_features, ref in (("fprop", x, lay.K, y_ref), ("bprop", dy, lay.C, dx_ref)):
        headers, entries, lut = _lut(lay, kind, max_segment, 1)
        atomic = lut.num_segments > lut.num_groups
        add = kind == "fprop"  # in the kernel, or after it where atomic
        with poisoned_empty():
            got = _triton.xprop_ptr(inp, w, headers, entries, out_features=out_features, bs=bs, axis=axis,
                                    trans=kind == "bprop", cfg=cfg, atomic=atomic, precision="ieee",
                                    bias=bias if add else None)
        if add:
            b = bias.double().numpy()
            ref = ref + (b if axis == 1 else b[:, None])
        assert got.dtype == inp.dtype
        assert rel_err(got.double().numpy(), ref) < TOL[dtype], kind


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("variant, group", [("ptr", 1), ("ptr", 2), ("tma", 1), ("tma", 2)])
def test_fprop_adds_the_bias_before_it_rounds(rng, dtype, axis, variant, group):
    """The bias per output feature, added to the float32 sums in the kernel (one rounding), also on
    output columns without blocks (bias only) and on the clipped last token tile."""
    n = 24 if axis == 0 else 21
    lay, x, w, _, (y_ref, _, _) = _setup(rng, 16, axis, n, dtype, KB=6)
    bias = torch.from_numpy(rng.standard_normal(lay.K)).to(DTYPES[dtype])
    headers, entries, _ = _lut(lay, "fprop", None, group)
    cfg = XpropConfig(BM=16, G=group, num_warps=4, num_stages=1)
    direct = _triton.xprop_ptr if variant == "ptr" else _triton.xprop_tma
    got = direct(x, w, headers, entries, out_features=lay.K, bs=16, axis=axis, trans=False, cfg=cfg, atomic=False,
                 precision="ieee", bias=bias)
    b = bias.double().numpy()
    want = y_ref + (b if axis == 1 else b[:, None])
    assert got.dtype == x.dtype and rel_err(got.double().numpy(), want) < TOL[dtype]
    empty = ~lay.dense(np.ones(lay.w_shape)).any(0)  # output features no block feeds
    assert empty.any()
    got_empty = got.double().numpy()[:, empty] if axis == 1 else got.double().numpy()[empty].T
    np.testing.assert_array_equal(got_empty, np.broadcast_to(b[empty], got_empty.shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs, group, n, split", [(16, 1, 1, 1), (16, 2, 37, 3), (32, 4, 20, 2),
                                                 (16, 4, 50, 1)],
                         ids=["bs16-G1-n1", "bs16-G2-n37-split3", "bs32-G4-n20-split2", "bs16-G4-n50"])
def test_updat(rng, dtype, axis, bs, group, n, split):
    lay, x, w, dy, (_, _, dw_ref) = _setup(rng, bs, axis, n, dtype)
    groups = torch.from_numpy(np.array(lay.updat_groups(group)))
    cfg = UpdatConfig(G=group, BK=16, num_warps=4, num_stages=1)
    for dw_dtype in (torch.float32, DTYPES[dtype]):
        got = _triton.updat_ptr(x, dy, groups, w_shape=lay.w_shape, bs=bs, axis=axis, cfg=cfg,
                            split=split, precision="ieee", dw_dtype=dw_dtype)
        assert got.dtype == dw_dtype
        assert rel_err(got.double().numpy(), dw_ref) < TOL[dtype]


def test_strided_activations(rng):
    """Kernels read activations through arbitrary strides (a column slice of a wider tensor)."""
    lay, x, w, dy, (y_ref, _, _) = _setup(rng, 16, 1, 9, "float32")
    wide = torch.randn(9, lay.C + 16)
    wide[:, 8:8 + lay.C] = x
    headers, entries, _ = _lut(lay, "fprop", None, 1)
    got = _triton.xprop_ptr(wide[:, 8:8 + lay.C], w, headers, entries, out_features=lay.K, bs=16, axis=1,
                        trans=False, cfg=XpropConfig(16, 1, 4, 1), atomic=False, precision="ieee")
    assert rel_err(got.numpy(), y_ref) < TOL["float32"]


def test_no_tokens():
    lay = Layout([[1, 1]], 16)
    headers, entries, _ = _lut(lay, "fprop", None, 1)
    x, w = torch.empty(0, 16), torch.randn(lay.w_shape)
    y = _triton.xprop_ptr(x, w, headers, entries, out_features=32, bs=16, axis=1, trans=False,
                      cfg=XpropConfig(16, 1, 4, 1), atomic=False, precision="ieee")
    assert y.shape == (0, 32)
    groups = torch.from_numpy(np.array(lay.updat_groups(1)))
    dw = _triton.updat_ptr(x, torch.empty(0, 32), groups, w_shape=lay.w_shape, bs=16, axis=1,
                       cfg=UpdatConfig(1, 16, 4, 1), split=1, precision="ieee", dw_dtype=torch.float32)
    assert torch.equal(dw, torch.zeros(lay.w_shape))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs, group, bk, bn, n, max_segment",
                         [(16, 1, 0, 0, 8, None), (16, 2, 0, 0, 24, 1), (32, 4, 0, 0, 40, None),
                          (32, 1, 16, 16, 24, None), (32, 2, 16, 0, 8, 2), (32, 1, 0, 16, 17, 1)],
                         ids=["bs16-G1", "bs16-G2-split", "bs32-G4", "bs32-BK16-BN16", "bs32-G2-BK16-split",
                              "bs32-BN16-split"])
def test_xprop_tma(rng, dtype, axis, bs, group, bk, bn, n, max_segment):
    n = n if axis == 1 else -(-n // 8) * 8  # (F, N) rows must be 16-byte aligned for descriptors
    lay, x, w, dy, (y_ref, dx_ref, _) = _setup(rng, bs, axis, n, dtype, KB=6)
    cfg = XpropConfig(BM=16, G=group, num_warps=4, num_stages=1, BK=bk, BN=bn)
    assert _triton.tma_ok(x, dy)
    for kind, inp, out_features, ref in (("fprop", x, lay.K, y_ref), ("bprop", dy, lay.C, dx_ref)):
        headers, entries, lut = _lut(lay, kind, max_segment, group)
        got = _triton.xprop_tma(inp, w, headers, entries, out_features=out_features, bs=bs, axis=axis,
                                trans=kind == "bprop", cfg=cfg,
                                atomic=lut.num_segments > lut.num_groups, precision="ieee")
        assert rel_err(got.double().numpy(), ref) < TOL[dtype], kind


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs, group, bk, n, max_segment, bn",
                         [(16, 1, 0, 8, None, 0), (32, 1, 16, 17, 1, 0), (16, 2, 0, 24, 2, 0),
                          (32, 4, 16, 40, None, 0), (32, 1, 0, 9, 2, 16)],
                         ids=["G1", "G1-BK16-split", "G2-split", "G4-BK16", "G1-BN16-split"])
def test_xprop_tma_walks_its_table_one_step_ahead(rng, axis, bs, group, bk, n, max_segment, bn):
    """``PREFETCH``: each step's table entry loaded by the step before -- same results as the plain
    walk, on layouts with empty columns and rows (segments of no entries), split segments, several
    sub-steps per entry (``BK``), every group size and output blocks sliced over programs (``BN``,
    as the few-token tiles)."""
    n = n if axis == 1 else -(-n // 8) * 8
    lay, x, w, dy, (y_ref, dx_ref, _) = _setup(rng, bs, axis, n, "bfloat16", KB=6)
    for kind, inp, out_features, ref in (("fprop", x, lay.K, y_ref), ("bprop", dy, lay.C, dx_ref)):
        headers, entries, lut = _lut(lay, kind, max_segment, group)
        got = {}
        for prefetch in (False, True):
            cfg = XpropConfig(BM=16, G=group, num_warps=4, num_stages=1, BK=bk, BN=bn, PREFETCH=prefetch)
            with poisoned_empty():
                got[prefetch] = _triton.xprop_tma(inp, w, headers, entries, out_features=out_features, bs=bs,
                                                  axis=axis, trans=kind == "bprop", cfg=cfg,
                                                  atomic=lut.num_segments > lut.num_groups, precision="ieee")
        assert rel_err(got[True].double().numpy(), ref) < TOL["bfloat16"], kind
        assert torch.equal(got[True], got[False]), kind


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs, group, n, split", [(16, 1, 8, 1), (16, 2, 40, 2), (32, 4, 24, 1)],
                         ids=["bs16-G1", "bs16-G2-split2", "bs32-G4"])
def test_updat_tma(rng, dtype, axis, bs, group, n, split):
    lay, x, w, dy, (_, _, dw_ref) = _setup(rng, bs, axis, n, dtype, KB=9)
    groups = torch.from_numpy(np.array(lay.updat_groups(group)))
    got = _triton.updat_tma(x, dy, groups, w_shape=lay.w_shape, bs=bs, axis=axis,
                            cfg=UpdatConfig(G=group, BK=16, num_warps=4, num_stages=1),
                            split=split,
                            precision="ieee", dw_dtype=torch.float32)
    assert rel_err(got.double().numpy(), dw_ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bs, group, n, split, ticket", [(16, 1, 8, 1, False), (16, 2, 40, 2, False),
                                                         (16, 2, 40, 3, True), (32, 4, 24, 1, False)],
                         ids=["bs16-G1", "bs16-G2-split2", "bs16-G2-split3-ticket", "bs32-G4"])
def test_updat_tma_bias_gradient(rng, dtype, axis, bs, group, n, split, ticket):
    """With the bias gradient the updat gives ``dy``'s column sums over the tokens too (every column
    marked once, each token slice a row), and the same weight gradient, bit for bit."""
    from blocksparse.ops.matmul.bias_grad import bias_first

    CB, KB = 4, 6
    mask = rng.random((CB, KB)) < 0.4
    mask[rng.integers(CB, size=KB), np.arange(KB)] = True          # every output column has a block
    lay = Layout(mask, bs)
    x = rng.standard_normal((n, lay.C) if axis == 1 else (lay.C, n))
    dy = rng.standard_normal((n, lay.K) if axis == 1 else (lay.K, n))
    t = lambda a: torch.from_numpy(a).to(DTYPES[dtype])  # noqa: E731
    rows = np.array(lay.updat_groups(group))
    marks, complete = bias_first(rows, group, KB)
    assert complete and marks.sum() == KB
    kw = dict(w_shape=lay.w_shape, bs=bs, axis=axis, cfg=UpdatConfig(G=group, BK=16, num_warps=4, num_stages=1),
              split=split, precision="ieee", dw_dtype=torch.float32, ticket=ticket)
    groups = torch.from_numpy(rows)
    with poisoned_empty():
        dw, db = _triton._updat_direct("tma", t(x), t(dy), groups, bias_first=torch.from_numpy(marks), **kw)
        plain = _triton._updat_direct("tma", t(x), t(dy), groups, **kw)
    want = t(dy).double().numpy().sum(axis=0 if axis == 1 else 1)
    assert db.dtype == torch.float32 and db.shape == (lay.K,)
    assert rel_err(db.double().numpy(), want) < TOL[dtype]
    assert torch.equal(dw, plain)


def test_bias_first_marks():
    """One mark per output block column, at its first entry; padding entries never; a column
    without a block makes the marks incomplete."""
    from blocksparse.ops.matmul.bias_grad import bias_first

    rows = np.array([[0, 2, 5, 10, 11], [1, 5, -1, 12, -1], [2, 0, 2, 13, 14]], np.int32)  # G = 2
    marks, complete = bias_first(rows, 2, 6)
    assert marks.tolist() == [1, 1, 0, 0, 1, 0] and not complete
    marks, complete = bias_first(rows, 2, 3)
    assert not complete
    marks, complete = bias_first(rows[[0, 2]], 2, 3)
    assert marks.tolist() == [1, 1, 1, 0] and not complete
