"""blocksparse.torch.attention on a CUDA GPU (compiled kernels, realistic sizes) against float64:
every layout builder, head dims and block sizes of the tile table, grouped-query heads, ragged
lengths, element masks, strided inputs, pointer vs tensor-descriptor loads, torch.compile."""
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.layouts import attention as layouts  # noqa: E402
from blocksparse.ops.attention.configs import HEAD_DIMS, KERNEL_BLOCK_SIZES, bwd_config, fwd_config  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.flash import attention_grads, element_mask, keep_mask  # noqa: E402
from blocksparse.torch import AttentionLayout, attention  # noqa: E402

pytestmark = pytest.mark.gpu
GRAD_FACTOR = 2
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.fixture(autouse=True)
def kernels_only(monkeypatch):
    """Layouts that drop no block run on the kernels here too (not PyTorch's dense attention; see
    :func:`test_layouts_that_drop_no_block_run_dense_attention`)."""
    monkeypatch.setenv("BLOCKSPARSE_ATTENTION_SDPA", "off")


def _check(rng, layout, *, bs, causal, B=2, HQ=4, HK=2, D=128, dtype="bfloat16", seqlens=None,
           block_masks=None, dense=None, strided=False):
    S = np.asarray(layout).shape[-1] * bs
    dt = DTYPES[dtype]

    def make(h):
        x = torch.from_numpy(rng.standard_normal((B, S, h, D))).to("cuda", dt)
        return x.transpose(1, 2) if strided else x.transpose(1, 2).contiguous()

    q, k, v = (make(h).requires_grad_() for h in (HQ, HK, HK))
    do = make(HQ)
    lens = None if seqlens is None else torch.tensor(seqlens, device="cuda")
    o = attention(q, k, v, AttentionLayout(layout, bs, block_masks=block_masks), causal=causal, seqlens=lens)
    o.backward(do)
    mask = element_mask(layout, bs) if dense is None else dense
    refs = attention_grads(q, k, v, keep_mask(mask, causal=causal, seqlens=seqlens), D ** -0.5, do)
    tol = tolerance(dtype)
    for name, got, ref, bound in zip(("o", "dq", "dk", "dv"), (o, q.grad, k.grad, v.grad), refs,
                                     (tol, *(GRAD_FACTOR * tol,) * 3)):
        assert rel_error(got, ref) < bound, name
    return o.detach(), (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bs", [64, 128])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["causal", "fixed", "window", "bigbird"])
def test_layouts(rng, name, D, bs, dtype):
    nb = 1024 // bs
    layout, causal = {
        "causal": (layouts.causal(nb), True),
        "fixed": (layouts.fixed(nb, 4, 1, heads=4, vary_heads=True), True),
        "window": (layouts.sliding_window(nb, 2), False),
        "bigbird": (layouts.bigbird(nb, 1, 1, 2, seed=int(rng.integers(1 << 30)), heads=4), False),
    }[name]
    _check(rng, layout, bs=bs, causal=causal, D=D, dtype=dtype)


@pytest.mark.parametrize("bs", KERNEL_BLOCK_SIZES)
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_tile_table(rng, D, bs):
    """Every head dim x block size the table serves compiles and is right."""
    _check(rng, layouts.bigbird(512 // bs, 1, 1, 1, seed=1), bs=bs, causal=True, B=1, HQ=2, HK=1, D=D)


def test_ragged_and_empty_rows(rng):
    layout = layouts.sliding_window(16, 1, heads=4)
    layout[2, 5] = 0
    o, (dq, dk, dv) = _check(rng, layout, bs=64, causal=True, B=3, seqlens=[1024, 333, 0])
    assert (o[:, 2, 320:384] == 0).all() and (o[1, :, 333:] == 0).all() and (o[2] == 0).all()
    assert torch.isfinite(dq).all() and (dk[2] == 0).all() and (dv[1, :, 333:] == 0).all()


def test_element_masks_and_strided_inputs(rng):
    S, bs = 512, 64
    dense = (rng.random((4, S, S)) < 0.1) | np.eye(S, dtype=bool)
    layout, bm = layouts.from_mask(dense, bs, return_block_masks=True)
    _check(rng, layout, bs=bs, causal=False, B=1, block_masks=bm, dense=dense, strided=True, dtype="float16")


def test_pointer_and_descriptor_loads_agree(rng):
    from blocksparse.torch._attention import launch
    from blocksparse.torch._attention.state import state

    lay = AttentionLayout(layouts.fixed(16, 4), 128)
    tables = state(lay._handle).tables(True, torch.device("cuda"))
    q, k, v, do = (torch.randn(2, 4, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    kw = dict(block_size=128, causal=True, scale=0.1)
    outs = []
    for tma in (True, False):
        fcfg, bcfg = replace(fwd_config(128, 128), tma=tma), replace(bwd_config(128, 128), tma=tma)
        o, lse = launch.fwd(q, k, v, None, tables, cfg=fcfg, **kw)
        outs.append((o, lse, *launch.bwd(do, q, k, v, o, lse, None, tables, cfg=bcfg, **kw)))
    for a, b in zip(*outs):
        assert rel_error(a, b) < 1e-2


def test_torch_compile_inductor(rng):
    lay = AttentionLayout(layouts.causal(8), 128)
    q, k, v = (torch.randn(1, 4, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def step(q, k, v):
        return attention(q, k, v, lay, causal=True).float().square().sum()

    compiled = torch.compile(step, fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(step(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["causal", "full"])
def test_layouts_that_drop_no_block_run_dense_attention(rng, monkeypatch, name):
    """Causal layouts with every block up to the diagonal, and full ones, run PyTorch's SDPA (eager and
    compiled), right against float64; ``BLOCKSPARSE_ATTENTION_SDPA=off`` and grouped heads take the
    kernels."""
    import torch.nn.functional as F

    calls, real = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: (calls.append(kw), real(*a, **kw))[1])
    layout, causal = (layouts.causal(8), True) if name == "causal" else (np.ones((8, 8), int), False)
    monkeypatch.setenv("BLOCKSPARSE_ATTENTION_SDPA", "auto")
    o_sdpa, g_sdpa = _check(rng, layout, bs=128, causal=causal, HQ=4, HK=4, D=64)
    assert calls == [{"is_causal": causal, "scale": 64 ** -0.5}]
    calls.clear()
    _check(rng, layout, bs=128, causal=causal, HQ=4, HK=2, D=64)  # grouped heads: the kernels
    assert calls == []
    monkeypatch.setenv("BLOCKSPARSE_ATTENTION_SDPA", "off")
    _check(rng, layout, bs=128, causal=causal, HQ=4, HK=4, D=64)
    assert calls == []
    monkeypatch.setenv("BLOCKSPARSE_ATTENTION_SDPA", "auto")
    lay = AttentionLayout(layout, 128)
    q, k, v = (torch.randn(1, 4, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def step(q, k, v):
        return attention(q, k, v, lay, causal=causal).float().square().sum()

    got = torch.autograd.grad(torch.compile(step, fullgraph=True)(q, k, v), (q, k, v))
    monkeypatch.setenv("BLOCKSPARSE_ATTENTION_SDPA", "off")
    want = torch.autograd.grad(step(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        assert rel_error(a, b) < 2 * tolerance("bfloat16")
