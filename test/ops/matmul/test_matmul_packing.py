"""Packed weights (``Layout.packing``): a refined layout's kernels read and write the coarse layer's
weight where its parts lie -- no re-blocking copies.  Through Triton's interpreter, every kernel
(pointer and TMA, grouped outputs, split reductions, several entries a step) against float64
products of the coarse layout, and bit for bit against the same kernels on the re-blocked weight."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.ops.matmul.configs import UpdatConfig, XpropConfig  # noqa: E402
from blocksparse.ops.matmul.refine import refine  # noqa: E402
from blocksparse.testing import TOLERANCE as TOL  # noqa: E402
from blocksparse.testing import rel_error  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402
from blocksparse.testing.poison import poisoned_empty  # noqa: E402
from blocksparse.torch._matmul import launch as _triton  # noqa: E402
from blocksparse.torch._matmul.reference import packed, unpacked  # noqa: E402

pytestmark = pytest.mark.interpreter

FINE = 16


def _problem(rng, r, axis, n, dtype):
    """A coarse layout of blocks ``r * FINE`` (one empty row and column), its packed and plain
    refinements, operands and the float64 products of the coarse layout."""
    coarse = Layout(random_layout(rng, 3, 4, 0.5, empty_rows=1, empty_cols=1), r * FINE, any_block_size=True)
    pack, plain = refine(coarse, FINE, packed=True).layout, refine(coarse, FINE).layout
    x = rng.standard_normal((n, coarse.C) if axis == 1 else (coarse.C, n))
    dy = rng.standard_normal((n, coarse.K) if axis == 1 else (coarse.K, n))
    w = rng.standard_normal(coarse.w_shape) / np.sqrt(r * FINE)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dtype)  # noqa: E731
    ref = dense_products(coarse, t(x).double().numpy(), t(w).double().numpy(), t(dy).double().numpy(), axis)
    return coarse, pack, plain, t(x), t(w), t(dy), ref


def _tables(lay, kind, max_segment, group):
    lut = getattr(lay, kind)(max_segment, group=group)
    return (torch.from_numpy(np.array(lut.headers)), torch.from_numpy(np.array(lut.entries)),
            lut.num_segments > lut.num_groups)


def test_layout_packing(rng):
    coarse = Layout(random_layout(rng, 2, 3, 0.7), 48, any_block_size=True)
    pack = refine(coarse, 16, packed=True).layout
    assert pack.packing == 3 and pack.w_shape == coarse.w_shape and pack.blocks == 9 * coarse.blocks
    assert pack != refine(coarse, 16).layout
    w = rng.standard_normal(coarse.w_shape)
    np.testing.assert_array_equal(pack.dense(w), coarse.dense(w))
    np.testing.assert_array_equal(pack.pack(coarse.dense(w)), w)
    fine = torch.from_numpy(w).reshape(-1, 3, 16, 3, 16).transpose(2, 3).reshape(-1, 16, 16)
    assert torch.equal(unpacked(torch.from_numpy(w), 3), fine) and torch.equal(packed(fine, 3), torch.from_numpy(w))
    with pytest.raises(ValueError, match="packing must be a positive int whose square divides"):
        Layout.numbered(pack.mask, 16, pack.coords, packing=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("variant, r, group, bk, kb, max_segment",
                         [("ptr", 2, 1, 0, 1, None), ("ptr", 3, 2, 0, 1, 1), ("ptr", 2, 1, 0, 4, 1),
                          ("tma", 2, 1, 0, 1, None), ("tma", 3, 2, 8, 1, 2), ("tma", 2, 4, 0, 1, 1)],
                         ids=["ptr-r2", "ptr-r3-G2-split", "ptr-r2-KB4-split", "tma-r2", "tma-r3-G2-BK8-split",
                              "tma-r2-G4-split"])
def test_xprop_reads_packed_weights(rng, dtype, axis, variant, r, group, bk, kb, max_segment):
    n = 24 if axis == 0 else 19  # (F, N) rows 16-byte aligned for descriptors
    coarse, pack, plain, x, w, dy, (y_ref, dx_ref, _) = _problem(rng, r, axis, n, dtype)
    w_fine = unpacked(w, r).contiguous()  # what the re-blocking copy makes
    cfg = XpropConfig(BM=16, G=group, num_warps=4, num_stages=1, BK=bk, KB=kb, TMA=variant == "tma")
    run = _triton.xprop_tma if variant == "tma" else _triton.xprop_ptr
    for kind, inp, out_features, ref in (("fprop", x, coarse.K, y_ref), ("bprop", dy, coarse.C, dx_ref)):
        headers, entries, atomic = _tables(pack, kind, max_segment, group)
        args = dict(out_features=out_features, bs=FINE, axis=axis, trans=kind == "bprop", cfg=cfg, atomic=atomic,
                    precision="ieee")
        with poisoned_empty():
            got = run(inp, w, headers, entries, pack=r, **args)
            copied = run(inp, w_fine, *_tables(plain, kind, max_segment, group)[:2], **args)
        assert rel_error(got.double().numpy(), ref) < TOL[str(dtype).removeprefix("torch.")], kind
        assert torch.equal(got, copied), kind


@pytest.mark.parametrize("axis", [1, 0])
def test_bprop_transposes_packed_blocks_in_place(rng, axis):
    """float32 bprop reads every block transposed beforehand: each part of a stored block where it lies."""
    coarse, pack, _, x, w, dy, (_, dx_ref, _) = _problem(rng, 2, axis, 16, torch.float32)
    headers, entries, atomic = _tables(pack, "bprop", None, 1)
    got = _triton.xprop(dy, w, headers, entries, out_features=coarse.C, bs=FINE, axis=axis, trans=True,
                        cfg=XpropConfig(BM=16, G=1, num_warps=4, num_stages=1, TMA=False), atomic=atomic,
                        precision="ieee", pack=2)
    assert rel_error(got.double().numpy(), dx_ref) < TOL["float32"]
    t = _triton.transpose_blocks(w, 2)
    np.testing.assert_array_equal(pack.dense(t.numpy()), _transposed_parts(pack, w.numpy()))


def _transposed_parts(lay, w):
    """The dense matrix of ``lay`` whose every block is transposed (float64 numpy)."""
    fine = unpacked(torch.from_numpy(w), lay.packing).numpy()
    return lay.dense(packed(torch.from_numpy(np.ascontiguousarray(fine.transpose(0, 2, 1))), lay.packing).numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("variant, r, group, split, ticket",
                         [("ptr", 2, 1, 1, False), ("ptr", 3, 2, 3, False), ("ptr", 2, 1, 2, True),
                          ("tma", 2, 1, 1, False), ("tma", 3, 1, 2, True), ("tma", 2, 2, 3, False)],
                         ids=["ptr-r2", "ptr-r3-G2-split3", "ptr-r2-ticket", "tma-r2", "tma-r3-ticket",
                              "tma-r2-G2-split3"])
def test_updat_writes_packed_gradients(rng, dtype, axis, variant, r, group, split, ticket):
    coarse, pack, plain, x, w, dy, (_, _, dw_ref) = _problem(rng, r, axis, 40, dtype)
    run = _triton.updat_tma if variant == "tma" else _triton.updat_ptr
    args = dict(bs=FINE, axis=axis, cfg=UpdatConfig(G=group, BK=16, num_warps=4, num_stages=1,
                                                    TMA=variant == "tma"),
                split=split, precision="ieee", dw_dtype=dtype, ticket=ticket)
    with poisoned_empty():
        got = run(x, dy, torch.from_numpy(np.array(pack.updat_groups(group))), w_shape=pack.w_shape, pack=r, **args)
        fine = run(x, dy, torch.from_numpy(np.array(plain.updat_groups(group))), w_shape=plain.w_shape, **args)
    assert got.shape == coarse.w_shape
    assert rel_error(got.double().numpy(), dw_ref) < TOL[str(dtype).removeprefix("torch.")]
    assert torch.equal(got, packed(fine, r))


@pytest.mark.parametrize("packing", [2, 1], ids=["packed-256", "plain-128"])
def test_many_token_tile_of_blocks_of_128(rng, packing):
    """The tables' own 16-bit tile at blocks of 128 and many tokens ([256, 128] outputs, BK 64, the
    table walked one step ahead; what the kernel library compiles), on a partial token tile, packed
    (the pixelfly layers' 256-blocks) and plain, against float64."""
    from blocksparse.ops.matmul.configs import xprop_config

    cfg = xprop_config(128, 8192)
    assert (cfg.BM, cfg.BK, cfg.PREFETCH) == (256, 64, True)
    coarse = Layout(random_layout(rng, 3, 3, 0.6, empty_rows=1), 128 * packing, any_block_size=True)
    lay = refine(coarse, 128, packed=True).layout if packing > 1 else coarse
    t = lambda a: torch.from_numpy(a).bfloat16()  # noqa: E731
    x, dy = t(rng.standard_normal((300, coarse.C))), t(rng.standard_normal((300, coarse.K)))
    w = t(rng.standard_normal(coarse.w_shape) / 16)
    y_ref, dx_ref, _ = dense_products(coarse, x.double().numpy(), w.double().numpy(), dy.double().numpy(), 1)
    for kind, inp, out_features, ref in (("fprop", x, coarse.K, y_ref), ("bprop", dy, coarse.C, dx_ref)):
        headers, entries, _ = _tables(lay, kind, None, 1)
        with poisoned_empty():
            got = _triton.xprop_tma(inp, w, headers, entries, out_features=out_features, bs=128, axis=1,
                                    trans=kind == "bprop", cfg=cfg, atomic=False, precision="ieee",
                                    **({"pack": packing} if packing > 1 else {}))
        assert rel_error(got.double().numpy(), ref) < TOL["bfloat16"], kind
