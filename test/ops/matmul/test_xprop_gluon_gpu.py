"""The persistent Gluon fprop / bprop (:mod:`blocksparse.ops.matmul.xprop_gluon`) on a Hopper GPU
against float64 products: empty output columns, a clipped last token tile, output slices, more
tiles than programs, the bias.  Skipped without a GPU of compute capability 9 or more."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton.experimental.gluon")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _hopper():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon kernel needs TMA and wgmma (compute capability 9 or more)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("op", ["fprop", "bprop"])
@pytest.mark.parametrize("bs, tile, n", [
    (64, (128, 64, 64, 4, 4, 1), 1000),      # a clipped token tile, one k-step an entry
    (128, (128, 128, 64, 4, 4, 1), 777),
    (128, (256, 128, 64, 3, 8, 1), 640),
    (256, (128, 256, 64, 3, 8, 1), 520),      # the pixelfly layers' own blocks
    (256, (128, 128, 64, 5, 8, 1), 384),      # two output slices a block
    (128, (128, 128, 64, 4, 4, 2), 300),      # two programs a SM
], ids=["bs64", "bs128", "bs128-BM256", "bs256", "bs256-slices", "bs128-2-a-SM"])
def test_gluon_xprop_against_float64(rng, dtype, op, bs, tile, n):
    from blocksparse.ops.matmul.xprop_gluon import GluonTile, split_empty, xprop_gluon

    cb, kb = 5, 7
    mask = random_layout(rng, cb, kb, 0.45, empty_cols=1, empty_rows=1)
    lay = Layout(mask, bs)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to("cuda", dtype)  # noqa: E731
    x = t(rng.standard_normal((n, lay.C)))
    dy = t(rng.standard_normal((n, lay.K)))
    w = t(rng.standard_normal(lay.w_shape) / np.sqrt(bs))
    bias = t(rng.standard_normal(lay.K)) if op == "fprop" else None
    y_ref, dx_ref, _ = dense_products(lay, x.double().cpu().numpy(), w.double().cpu().numpy(),
                                      dy.double().cpu().numpy(), 1)
    lut = getattr(lay, op)(None, group=1)
    headers, empty = split_empty(torch.from_numpy(lut.headers.copy()).cuda(), bs)
    assert empty is not None  # the layout has an empty output column
    entries = torch.from_numpy(lut.entries.copy()).cuda()
    with poisoned_empty():
        got = xprop_gluon(x if op == "fprop" else dy, w, headers, entries, bs=bs, trans=op == "bprop",
                          out_features=lay.K if op == "fprop" else lay.C, tile=GluonTile(*tile), bias=bias,
                          empty=empty)
    ref = y_ref + bias.double().cpu().numpy() if op == "fprop" else dx_ref
    assert got.dtype == dtype and got.shape == ref.shape
    assert rel_error(got, torch.from_numpy(ref)) < tolerance(dtype)
    empty = np.flatnonzero(~mask.any(axis=0 if op == "fprop" else 1))
    cols = np.concatenate([np.arange(c * bs, (c + 1) * bs) for c in empty])
    expect = bias.double().cpu().numpy()[cols] if op == "fprop" else 0.0
    assert np.allclose(got[:, cols].double().cpu().numpy(), expect, atol=1e-2), "an empty column: the bias / zeros"


@pytest.mark.parametrize("op", ["fprop", "bprop"])
def test_gluon_xprop_on_a_packed_refinement(rng, op):
    """A layout of 256-blocks refined to 128 in its own storage (``packing`` 2, the pixelfly layers'
    form): the kernel reads the fine blocks where the coarse weight holds them."""
    from blocksparse.ops.matmul.refine import refine
    from blocksparse.ops.matmul.xprop_gluon import GluonTile, split_empty, xprop_gluon

    coarse = Layout(random_layout(rng, 3, 4, 0.5, empty_cols=1), 256)
    fine = refine(coarse, 128, packed=True).layout
    assert fine.packing == 2
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to("cuda", torch.bfloat16)  # noqa: E731
    n = 300
    x, dy = t(rng.standard_normal((n, coarse.C))), t(rng.standard_normal((n, coarse.K)))
    w = t(rng.standard_normal(coarse.w_shape) / 16)
    y_ref, dx_ref, _ = dense_products(coarse, x.double().cpu().numpy(), w.double().cpu().numpy(),
                                      dy.double().cpu().numpy(), 1)
    lut = getattr(fine, op)(None, group=1)
    headers, empty = split_empty(torch.from_numpy(lut.headers.copy()).cuda(), 128)
    with poisoned_empty():
        got = xprop_gluon(x if op == "fprop" else dy, w, headers, torch.from_numpy(lut.entries.copy()).cuda(),
                          bs=128, trans=op == "bprop", out_features=coarse.K if op == "fprop" else coarse.C,
                          tile=GluonTile(128, 128, 64, 4, 4), pack=2, empty=empty)
    assert rel_error(got, torch.from_numpy(y_ref if op == "fprop" else dx_ref)) < tolerance(torch.bfloat16)
