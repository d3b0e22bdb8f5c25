"""The fused attention kernels through their launchers (Triton's interpreter on the CPU): outputs
and gradients against float64 for tile configs that cut blocks into several tiles, pointer and
tensor-descriptor loads, causal, element masks, ragged lengths and grouped-query heads."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.layouts import attention as layouts  # noqa: E402
from blocksparse.ops.attention.configs import BwdConfig, FwdConfig  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.flash import attention_grads, element_mask, keep_mask  # noqa: E402
from blocksparse.torch._attention import state as _state  # noqa: E402

pytestmark = pytest.mark.interpreter

#: P and dS are rounded to the input dtype before their products (as in every flash kernel): the
#: gradients carry that rounding twice, so they get twice the dtype's bound.
GRAD_FACTOR = 2

CASES = {
    # name: (block size, forward config, backward config)
    "bs32-ksteps-tma": (32, FwdConfig(BM=32, BN=16, tma=True), BwdConfig(BM1=16, BN1=32, BM2=32, BN2=16, tma=True)),
    "bs32-qtiles-ptr": (32, FwdConfig(BM=16, BN=32, tma=False), BwdConfig(BM1=32, BN1=16, BM2=16, BN2=32, tma=False)),
    "bs16-ws-atomic": (16, FwdConfig(BM=16, BN=16, warp_specialize=True),
                       BwdConfig(BM1=16, BN1=16, BM2=16, BN2=16, atomic_dq=True)),
    # the full blocks' walks reading their tables one step ahead
    "bs32-ksteps-tma-prefetch": (32, FwdConfig(BM=32, BN=16, tma=True, prefetch=True),
                                 BwdConfig(BM1=16, BN1=32, BM2=32, BN2=16, tma=True, prefetch=True)),
    "bs16-ptr-atomic-prefetch": (16, FwdConfig(BM=16, BN=16, tma=False, prefetch=True),
                                 BwdConfig(BM1=16, BN1=16, BM2=16, BN2=16, tma=False, atomic_dq=True, prefetch=True)),
    # dk/dv and dq programs in one launch, heads' heaviest tiles first
    "bs32-fused-tma": (32, FwdConfig(BM=32, BN=16, tma=True, heads_first=True),
                       BwdConfig(BM1=16, BN1=32, BM2=32, BN2=16, tma=True, fused=True, heads_first=True)),
    "bs16-fused-ptr-prefetch": (16, FwdConfig(BM=16, BN=16, tma=False),
                                BwdConfig(BM1=16, BN1=16, BM2=16, BN2=16, tma=False, fused=True, prefetch=True)),
    # dS written by the dk/dv programs, dq summed from it: query steps and key steps within blocks
    "bs32-ds-tma": (32, FwdConfig(BM=32, BN=16), BwdConfig(BM1=16, BN1=32, BM2=32, BN2=16, store_ds=True)),
    "bs32-ds-ptr-prefetch-hf": (32, FwdConfig(BM=16, BN=32, tma=False),
                                BwdConfig(BM1=32, BN1=16, BM2=16, BN2=32, tma=False, store_ds=True, prefetch=True,
                                          heads_first=True)),
}


def _tables(layout, bs, causal, block_masks=None):
    index = masks = None
    lay = np.asarray(layout, dtype=bool)
    lay = lay if lay.ndim == 3 else lay[None]
    if block_masks is not None:
        index = block_masks.index if block_masks.index.ndim == 3 else block_masks.index[None]
        masks = block_masks.masks.astype(np.uint8)
    return _state.LayoutState(lay, bs, index, masks).tables(causal, torch.device("cpu"))


def _run(rng, *, case, layout, causal=False, B=1, HQ=2, HK=2, D=16, dtype=torch.float16, seqlens=None,
         block_masks=None, dense=None, scale=None, positive_qk=False, ds_factor=2, o_seen=False):
    from blocksparse.torch._attention import launch

    bs, fcfg, bcfg = CASES[case]
    S = np.asarray(layout).shape[-1] * bs
    t = lambda *shape: torch.from_numpy(rng.standard_normal(shape)).to(dtype)  # noqa: E731
    q, k, v, do = t(B, HQ, S, D), t(B, HK, S, D), t(B, HK, S, D), t(B, HQ, S, D)
    if positive_qk:  # every score has the sign of the scale
        q, k = (torch.from_numpy(rng.uniform(0.5, 1.5, x.shape)).to(dtype) for x in (q, k))
    scale = float(rng.uniform(0.1, 0.5)) if scale is None else scale
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
    tables = _tables(layout, bs, causal, block_masks)
    o, lse = launch.fwd(q, k, v, lens, tables, block_size=bs, causal=causal, scale=scale, cfg=fcfg)
    dq, dk, dv = launch.bwd(do, q, k, v, o, lse, lens, tables, block_size=bs, causal=causal, scale=scale, cfg=bcfg)
    mask = element_mask(layout, bs) if dense is None else dense
    keep = keep_mask(mask, causal=causal, seqlens=seqlens)
    refs = attention_grads(q, k, v, keep, scale, do, o_seen=o if o_seen else None)
    tol = tolerance(dtype)
    bounds = (tol, ds_factor * GRAD_FACTOR * tol, ds_factor * GRAD_FACTOR * tol, GRAD_FACTOR * tol)
    for name, got, ref, bound in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), refs, bounds):
        assert got.dtype == dtype, name
        assert rel_error(got, ref) < bound, name
    return o, lse, (dq, dk, dv), keep


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_configs(rng, case, causal):
    bs = CASES[case][0]
    _run(rng, case=case, layout=layouts.bigbird(64 // bs, 0, 1, 1, seed=int(rng.integers(1 << 30)), heads=2),
         causal=causal)


@pytest.mark.parametrize("case", ["bs32-ksteps-tma", "bs32-qtiles-ptr", "bs16-ws-atomic", "bs32-ksteps-tma-prefetch",
                                  "bs16-ptr-atomic-prefetch", "bs32-fused-tma", "bs16-fused-ptr-prefetch",
                                  "bs32-ds-tma"])
def test_ragged_gqa_and_empty_rows(rng, case):
    bs = CASES[case][0]
    layout = layouts.sliding_window(64 // bs, 1)
    layout[1, :] = 0                               # query block 1 attends to nothing
    o, lse, grads, keep = _run(rng, case=case, layout=layout, B=2, HQ=2, HK=1, D=32, dtype=torch.bfloat16,
                               seqlens=[19, 0])
    assert (o[:, :, bs:2 * bs] == 0).all() and (o[0, :, 19:] == 0).all() and (o[1] == 0).all()
    assert torch.isinf(lse[1]).all() and (lse[1] < 0).all()
    dq, dk, dv = grads
    assert (dq[1] == 0).all() and (dk[0, :, 19:] == 0).all() and (dv[1] == 0).all()


def test_element_masks(rng):
    S, bs = 64, 16
    dense = rng.random((2, S, S)) < 0.3
    dense[0, 5, :] = False                         # a fully masked row inside a kept block row
    layout, bm = layouts.from_mask(dense, bs, return_block_masks=True)
    assert (bm.index >= 0).any()
    o, *_ = _run(rng, case="bs16-ws-atomic", layout=layout, block_masks=bm, dense=dense, causal=True)
    assert (o[:, 0, 5] == 0).all()


def test_negative_scale_and_very_negative_scores(rng):
    # the running max must hold for a negative scale, and rows whose scores all lie far below zero
    # (~ -230 in base 2, past float32's exp2 range) must not underflow to "nothing attended", even
    # when their first key tile is wholly masked (the running max is still -inf there)
    _run(rng, case="bs32-qtiles-ptr", layout=layouts.causal(2), causal=True, scale=-0.4)
    t, u = np.arange(64)[:, None], np.arange(64)[None, :]
    dense = (u % 32 >= 16) | (u == t)
    layout, bm = layouts.from_mask(dense, 32, return_block_masks=True)
    # nearly one-hot rows: dS = P (dP - rowsum(dO * O)) is a difference of nearly equal terms, and
    # the float16 rounding of O in rowsum(dO * O) dominates its small norm (0.2 seen against a
    # float64 reference of the float16 inputs, at one draw in ~400): the reference reads the
    # kernel's rounded O there, as flash attention's backward does
    _run(rng, case="bs32-ksteps-tma", layout=layout, block_masks=bm, dense=dense, scale=-10.0, positive_qk=True,
         o_seen=True)


@pytest.mark.parametrize("flag,case", [("prefetch", "bs32-ksteps-tma-prefetch"), ("prefetch", "bs16-ptr-atomic-prefetch"),
                                       ("heads_first", "bs32-ksteps-tma"), ("heads_first", "bs16-ws-atomic"),
                                       ("fused", "bs32-fused-tma"), ("fused", "bs16-fused-ptr-prefetch")])
def test_schedules_change_no_bit(rng, flag, case):
    """``prefetch`` only moves the table reads, ``heads_first`` only the order in which programs
    start, ``fused`` only the launches: outputs and gradients equal those without exactly (GQA, a
    ragged batch, an empty query block row)."""
    from dataclasses import replace

    bs, fcfg, bcfg = CASES[case]
    layout = layouts.sliding_window(96 // bs, 2)
    layout[1, :] = 0
    seed = int(rng.integers(1 << 30))
    runs = []
    for on in (True, False):
        CASES["plain"] = (bs, replace(fcfg, **{f: on for f in (flag,) if hasattr(fcfg, f)}), replace(bcfg, **{flag: on}))
        try:
            o, lse, grads, _ = _run(np.random.default_rng(seed), case="plain", layout=layout, B=2, HQ=2, HK=1,
                                    D=16, dtype=torch.bfloat16, seqlens=[70, 96], causal=True)
        finally:
            del CASES["plain"]
        runs.append((o, lse, *grads))
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("case", ["bs32-ds-tma", "bs32-ds-ptr-prefetch-hf"])
@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-head"])
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_store_ds_batches_and_heads(rng, monkeypatch, case, per_head, chunked):
    """``store_ds``: every (batch element, query head) has its own dS scratch, whether its layout head
    is shared (grouped-query heads too) or its own, all heads at once or a key/value head at a time;
    an empty query block row reads nothing."""
    from blocksparse.torch._attention import launch

    if chunked:
        monkeypatch.setattr(launch, "_ds_chunk", lambda *args: 1)
    bs = CASES[case][0]
    layout = layouts.bigbird(96 // bs, 0, 1, 1, seed=int(rng.integers(1 << 30)), heads=2 if per_head else None)
    layout[..., 1, :] = 0
    _run(rng, case=case, layout=layout, B=2, HQ=2, HK=1, D=32, dtype=torch.bfloat16, causal=True)


def test_store_ds_scratch_cap(rng, monkeypatch):
    """The dS scratch stays under ``DS_SCRATCH_MAX_BYTES``: the key/value heads' launches run in chunks
    of as many heads as fit, and where one head's does not fit, dS is recomputed (no scratch)."""
    from blocksparse.ops.attention import configs
    from blocksparse.torch._attention import launch

    seen = []
    real = launch.bwd_launches
    monkeypatch.setattr(launch, "bwd_launches", lambda *a, cfg, **kw: seen.append(real(*a, cfg=cfg, **kw)) or seen[-1])
    head = 3 * 32 * 32 * 2       # causal(2): 3 blocks of 32 x 32, 2 bytes each
    # recomputed (dq launch, dk/dv launch); a delta pass, then chunks of 1, 2 (and 1), 3 heads
    for cap, launches in ((head - 1, 2), (head, 7), (2 * head, 5), (3 * head, 3)):
        monkeypatch.setattr(configs, "DS_SCRATCH_MAX_BYTES", cap)
        _run(rng, case="bs32-ds-tma", layout=layouts.causal(2), causal=True, B=1, HQ=3, HK=3)
        assert len(seen[-1]) == launches, cap
        stored = [launch.constexprs["STORE_DS"] for launch in seen[-1] if "STORE_DS" in launch.constexprs]
        assert all(stored) == (cap >= head), cap
