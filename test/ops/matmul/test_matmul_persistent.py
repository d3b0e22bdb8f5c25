"""Persistent fprop / bprop on regular layouts (:mod:`blocksparse.ops.matmul.xprop_persistent`):
through Triton's interpreter, against float64 products and bit for bit against the one-tile-a-program
TMA kernel; which tables count as regular (``XpropLut.uniform_count``)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout  # noqa: E402
from blocksparse.ops.matmul.configs import XpropConfig  # noqa: E402
from blocksparse.ops.matmul.refine import refine  # noqa: E402
from blocksparse.testing import TOLERANCE as TOL  # noqa: E402
from blocksparse.testing import rel_error  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.torch._matmul import launch as _triton  # noqa: E402

pytestmark = pytest.mark.interpreter


def _band(blocks, width, shift):
    """Every column and row holds ``width`` blocks: a circulant band."""
    c, k = np.meshgrid(np.arange(blocks), np.arange(blocks), indexing="ij")
    return ((k - c - shift) % blocks < width).astype(np.int8)


def test_uniform_count_marks_regular_tables():
    band = Layout(_band(5, 2, 1), 16)
    assert band.fprop().uniform_count == 2 and band.bprop().uniform_count == 2
    wide = Layout(np.kron(np.eye(2, dtype=np.int8), np.ones((1, 3), np.int8)), 16)  # 2 x 6, one block a column
    assert wide.fprop().uniform_count == 1 and wide.bprop().uniform_count == 3
    ragged = Layout([[1, 1], [0, 1]], 16)
    assert ragged.fprop().uniform_count is None
    assert band.fprop(max_segment=1).uniform_count is None  # split segments: several per output column
    holed = Layout([[1, 0], [1, 0]], 16)  # an empty output column: a segment of no entries
    assert holed.fprop().uniform_count is None
    assert band.fprop(group=2).uniform_count is None  # output groups: the one-tile kernel's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("bm, bk, prefetch, subtile, programs",
                         [(16, 0, True, False, 3), (16, 8, False, True, 2), (32, 8, True, True, 64)],
                         ids=["BK16-prefetch-3-programs", "BK8-subtile-2-programs", "BM32-program-a-tile"])
def test_persistent_xprop(rng, dtype, axis, bm, bk, prefetch, subtile, programs, monkeypatch):
    bs = 16
    lay = Layout(_band(6, 3, 2), bs)
    n = 40 if axis == 0 else 37  # a clipped last token tile; (F, N) rows 16-byte aligned
    x = rng.standard_normal((n, lay.C) if axis == 1 else (lay.C, n))
    dy = rng.standard_normal((n, lay.K) if axis == 1 else (lay.K, n))
    w = rng.standard_normal(lay.w_shape) / np.sqrt(bs)
    bias = rng.standard_normal(lay.K)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dtype)  # noqa: E731
    y_ref, dx_ref, _ = dense_products(lay, t(x).double().numpy(), t(w).double().numpy(), t(dy).double().numpy(), axis)
    b = t(bias).double().numpy()
    y_ref = y_ref + (b if axis == 1 else b[:, None])
    monkeypatch.setattr(_triton, "_sms", lambda device: programs)  # programs per "SM" x PERSIST: the grid
    cfg = XpropConfig(BM=bm, G=1, num_warps=4, num_stages=1, BK=bk, PREFETCH=prefetch, PERSIST=1, SUBTILE=subtile)
    plain_cfg = XpropConfig(BM=bm, G=1, num_warps=4, num_stages=1, BK=bk)
    for kind, inp, out_features, ref, extra in (("fprop", t(x), lay.K, y_ref, dict(bias=t(bias))),
                                                ("bprop", t(dy), lay.C, dx_ref, {})):
        lut = getattr(lay, kind)()
        headers, entries = torch.from_numpy(np.array(lut.headers)), torch.from_numpy(np.array(lut.entries))
        args = dict(out_features=out_features, bs=bs, axis=axis, trans=kind == "bprop", atomic=False,
                    precision="ieee", **extra)
        with poisoned_empty():
            got = _triton.xprop_tma(inp, t(w), headers, entries, cfg=cfg, count=lut.uniform_count, **args)
            plain = _triton.xprop_tma(inp, t(w), headers, entries, cfg=plain_cfg, **args)
        assert rel_error(got.double().numpy(), ref) < TOL[str(dtype).removeprefix("torch.")], kind
        assert torch.equal(got, plain), kind


def test_persistent_xprop_reads_packed_weights(rng):
    """A butterfly layout of 32-blocks refined to 16 (every column regular) in its coarse storage."""
    coarse = Layout(butterfly_layout(128, 256, 32, 4), 32)
    pack = refine(coarse, 16, packed=True).layout
    n = 24
    x, dy = rng.standard_normal((n, coarse.C)), rng.standard_normal((n, coarse.K))
    w = rng.standard_normal(coarse.w_shape) / np.sqrt(32)
    t = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # noqa: E731
    y_ref, dx_ref, _ = dense_products(coarse, t(x).double().numpy(), t(w).double().numpy(), t(dy).double().numpy(), 1)
    cfg = XpropConfig(BM=16, G=1, num_warps=4, num_stages=1, PREFETCH=True, PERSIST=1)
    for kind, inp, out_features, ref in (("fprop", t(x), coarse.K, y_ref), ("bprop", t(dy), coarse.C, dx_ref)):
        lut = getattr(pack, kind)()
        assert lut.uniform_count is not None
        with poisoned_empty():
            got = _triton.xprop_tma(inp, t(w), torch.from_numpy(np.array(lut.headers)),
                                    torch.from_numpy(np.array(lut.entries)), out_features=out_features, bs=16, axis=1,
                                    trans=kind == "bprop", cfg=cfg, atomic=False, precision="ieee", pack=2,
                                    count=lut.uniform_count)
        assert rel_error(got.double().numpy(), ref) < TOL["bfloat16"], kind


def test_irregular_tables_keep_the_one_tile_kernel(rng):
    """``count=None`` (a ragged layout) runs :func:`xprop_tma_kernel` even where the config asks for
    persistent programs."""
    lay = Layout(random_layout(rng, 3, 4, 0.5, empty_cols=1), 16)
    cfg = XpropConfig(BM=16, G=1, num_warps=4, num_stages=1, PERSIST=1)
    lut = lay.fprop()
    assert lut.uniform_count is None
    launch = _triton.xprop_launch("tma", (16, lay.C), (lay.C, 1), torch.bfloat16, lut.headers, lut.entries,
                                  blocks=lay.blocks, out_features=lay.K, bs=16, axis=1, trans=False, cfg=cfg,
                                  atomic=False, precision="ieee", count=lut.uniform_count, programs=8)
    assert launch.kernel_name == "xprop_tma_kernel"
    band = Layout(_band(4, 2, 0), 16).fprop()
    launch = _triton.xprop_launch("tma", (16, 64), (64, 1), torch.bfloat16, band.headers, band.entries, blocks=8,
                                  out_features=64, bs=16, axis=1, trans=False, cfg=cfg, atomic=False,
                                  precision="ieee", count=band.uniform_count, programs=3)
    assert launch.kernel_name == "xprop_persistent_kernel" and launch.grid == (3,)


def test_plans_take_persistent_programs_on_regular_layouts(rng, monkeypatch):
    """The JIT plan's choice, given a table entry: 16-bit (N, C) products of a regular layout at many
    tokens take the table's persistent tile, without a split; ragged layouts, float32, (C, N), the
    interpreter and ``BLOCKSPARSE_PERSISTENT=off`` keep the one-tile kernel."""
    from blocksparse.ops.matmul import configs
    from blocksparse.torch._matmul.plan import _jit_choice

    monkeypatch.delenv("BLOCKSPARSE_PERSISTENT", raising=False)
    want = XpropConfig(256, 1, 8, 4, BK=64, PREFETCH=True, PERSIST=1, SUBTILE=True)
    monkeypatch.setattr(configs, "PERSISTENT_XPROP", {("16bit", "large"): {128: want}})
    regular = refine(Layout(butterfly_layout(2048, 8192, 256, 64), 256, any_block_size=True), 128).layout
    ragged = Layout(random_layout(rng, 16, 64, 0.5), 128)
    choice = dict(n=8192, dtype=torch.bfloat16, interpret=False, sms=132, tma=True, axis=1)
    for kind in ("fprop", "bprop"):
        assert _jit_choice(regular, kind, **choice) == (want, None)
        assert _jit_choice(ragged, kind, **choice)[0].PERSIST == 0
        assert _jit_choice(regular, kind, **{**choice, "dtype": torch.float32})[0].PERSIST == 0
        assert _jit_choice(regular, kind, **{**choice, "axis": 0})[0].PERSIST == 0
        assert _jit_choice(regular, kind, **{**choice, "interpret": True})[0].PERSIST == 0
        assert _jit_choice(regular, kind, **{**choice, "tma": False})[0].PERSIST == 0
    monkeypatch.setenv("BLOCKSPARSE_PERSISTENT", "off")
    assert _jit_choice(regular, "fprop", **choice)[0].PERSIST == 0
    monkeypatch.undo()
    assert _jit_choice(regular, "fprop", **choice)[0].PERSIST == 0  # the shipped table: none measured yet
