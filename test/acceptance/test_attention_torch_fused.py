"""Acceptance: ``blocksparse.torch.attention`` / ``AttentionLayout`` as the README documents them,
against a dense float64 reference (CPU: the reference path; the kernels through Triton's
interpreter on tiny shapes)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.layouts import attention as layouts  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.torch import AttentionLayout, attention  # noqa: E402


def dense_reference(q, k, v, keep, scale, seqlens=None):
    """float64 ``softmax(scale q kᵀ, kept keys) v``: q (B, HQ, S, D), k / v (B, HK, S, D); keep
    (HQ or 1, S, S) bool; rows that keep nothing (or past their length) are zeros."""
    q, k, v = (t.detach().double() for t in (q, k, v))
    B, HQ, S, _ = q.shape
    group = HQ // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    keep = torch.as_tensor(np.broadcast_to(keep, (HQ, S, S)).copy())[None].expand(B, HQ, S, S).clone()
    if seqlens is not None:
        pos = torch.arange(S)
        lens = torch.as_tensor(seqlens).clamp(0, S).view(B, 1, 1, 1)
        keep &= (pos.view(1, 1, 1, S) < lens) & (pos.view(1, 1, S, 1) < lens)
    return q, k, v, keep, group


def reference_and_grads(q, k, v, keep, scale, do, seqlens=None):
    q, k, v, keep, group = dense_reference(q, k, v, keep, scale, seqlens)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    s = torch.where(keep, scale * q @ k.transpose(-1, -2), float("-inf"))
    top = s.amax(-1, keepdim=True).detach()
    e = torch.where(keep, torch.exp(s - torch.where(torch.isfinite(top), top, 0)), 0.0)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total > 0, total, 1)
    o = p @ v
    o.backward(do.double())
    B, HQ, S, D = q.shape
    dk = k.grad.view(B, HQ // group, group, S, D).sum(2)
    dv = v.grad.view(B, HQ // group, group, S, D).sum(2)
    return o.detach(), q.grad, dk, dv


def _layout_keep(layout2or3, bs, causal, block_masks=None):
    lay = np.asarray(layout2or3, bool)
    lay = lay if lay.ndim == 3 else lay[None]
    keep = np.kron(lay, np.ones((bs, bs), bool)).astype(bool)
    if block_masks is not None:
        keep &= block_masks.dense(np.asarray(layout2or3))[None] if block_masks.index.ndim == 2 \
            else block_masks.dense(np.asarray(layout2or3))
    if causal:
        S = keep.shape[-1]
        keep &= np.tril(np.ones((S, S), bool))
    return keep


def _qkv(rng, B, HQ, HK, S, D, dtype):
    make = lambda h: torch.tensor(rng.standard_normal((B, h, S, D)), dtype=dtype, requires_grad=True)  # noqa: E731
    return make(HQ), make(HK), make(HK)


LAYOUTS = {
    "causal": lambda: layouts.causal(4),
    "fixed": lambda: layouts.fixed(4, stride=2),
    "sliding-bidirectional": lambda: layouts.sliding_window(4, 1),
    "bigbird": lambda: layouts.bigbird(4, 0, 1, 1, seed=0),
    "per-head-bigbird": lambda: layouts.bigbird(4, 0, 1, 1, seed=1, heads=4),
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["no-causal", "causal"])
@pytest.mark.parametrize("name", LAYOUTS)
def test_reference_path(name, causal, dtype, rng):
    B, HQ, HK, bs, D = 2, 4, 2, 16, 16
    layout = LAYOUTS[name]()
    S = layout.shape[-1] * bs
    dt = getattr(torch, dtype)
    q, k, v = _qkv(rng, B, HQ, HK, S, D, dt)
    seqlens = torch.tensor([S, 37])
    o = attention(q, k, v, AttentionLayout(layout, bs), causal=causal, seqlens=seqlens)
    assert o.shape == q.shape and o.dtype == dt
    do = torch.tensor(rng.standard_normal(o.shape), dtype=dt)
    o.backward(do)
    want = reference_and_grads(q, k, v, _layout_keep(layout, bs, causal), D ** -0.5, do, seqlens)
    tol = 2 * tolerance(dtype)
    for got, ref in zip((o, q.grad, k.grad, v.grad), want):
        assert rel_error(got, ref) < tol
    assert torch.all(o[1, :, 37:] == 0) and torch.all(q.grad[1, :, 37:] == 0)


def test_raw_layout_block_size_scale_and_block_masks(rng):
    B, H, S, D, bs = 1, 2, 48, 32, 16
    mask = np.tril(np.ones((S, S), bool)) & (np.arange(S)[None, :] % 3 != 1)
    mask[5] = False                       # a query row that keeps nothing
    layout, bm = layouts.from_mask(mask, bs, return_block_masks=True)
    q, k, v = _qkv(rng, B, H, H, S, D, torch.float64)
    o = attention(q, k, v, layout, block_masks=bm, scale=0.3)
    o2 = attention(q, k, v, AttentionLayout(layout, bs, block_masks=bm), scale=0.3)
    o3 = attention(q, k, v, torch.tensor(layout), block_size=bs, block_masks=bm, scale=0.3)
    do = torch.randn(o.shape, dtype=torch.float64)
    o.backward(do)
    want = reference_and_grads(q, k, v, mask[None], 0.3, do)
    for got, ref in zip((o, q.grad, k.grad, v.grad), want):
        assert rel_error(got, ref) < 1e-12
    assert torch.equal(o, o2) and torch.equal(o, o3)
    assert torch.all(o[:, :, 5] == 0) and torch.all(q.grad[:, :, 5] == 0)


def test_attention_layout_attributes_and_equality():
    a = AttentionLayout(layouts.fixed(4, 2), block_size=32)
    b = AttentionLayout(layouts.fixed(4, 2).astype(bool), 32)
    assert (a.heads, a.blocks, a.seq_len, a.block_size) == (1, 4, 128, 32)
    assert a.density == pytest.approx(layouts.fixed(4, 2).mean())
    assert a == b and hash(a) == hash(b) and a != AttentionLayout(layouts.causal(4), 32)
    assert a.block_masks is None and a.layout.shape == (1, 4, 4)


def test_empty_layout_row_gives_zeros(rng):
    layout = np.array([[[1, 0], [0, 0]], [[1, 1], [0, 1]]])  # head 0: query block 1 attends to nothing
    q, k, v = _qkv(rng, 1, 2, 1, 32, 16, torch.float32)
    o = attention(q, k, v, AttentionLayout(layout, 16))
    o.sum().backward()
    assert torch.all(o[0, 0, 16:] == 0) and torch.all(torch.isfinite(q.grad)) and torch.all(q.grad[0, 0, 16:] == 0)
    assert torch.all(torch.isfinite(k.grad)) and torch.all(torch.isfinite(v.grad))


def test_compile_fullgraph(rng):
    lay = AttentionLayout(layouts.causal(2), 16)
    q, k, v = _qkv(rng, 1, 2, 1, 32, 16, torch.float32)
    seqlens = torch.tensor([20])
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v, s: attention(q, k, v, lay, causal=True, seqlens=s), fullgraph=True,
                      backend="aot_eager")
    o = f(q, k, v, seqlens)
    o.square().sum().backward()
    assert rel_error(o, attention(q.detach(), k.detach(), v.detach(), lay, causal=True, seqlens=seqlens)) < 1e-6
    assert q.grad is not None and k.grad is not None


def test_autocast(rng):
    lay = AttentionLayout(layouts.causal(2), 16)
    q, k, v = _qkv(rng, 1, 2, 2, 32, 16, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = attention(q, k, v, lay)
    assert o.dtype == torch.bfloat16


@pytest.mark.interpreter
@pytest.mark.parametrize("causal", [False, True], ids=["no-causal", "causal"])
def test_kernels_through_interpreter(causal, rng, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    B, HQ, HK, bs, D = 2, 2, 1, 16, 16
    layout = np.array([[1, 0], [1, 1]])
    S = 32
    q, k, v = _qkv(rng, B, HQ, HK, S, D, torch.float16)
    seqlens = torch.tensor([S, 21])
    o = attention(q, k, v, AttentionLayout(layout, bs), causal=causal, seqlens=seqlens)
    assert o.dtype == torch.float16
    do = torch.tensor(rng.standard_normal(o.shape), dtype=torch.float16)
    o.backward(do)
    want = reference_and_grads(q, k, v, _layout_keep(layout, bs, causal), D ** -0.5, do, seqlens)
    for got, ref in zip((o, q.grad, k.grad, v.grad), want):
        assert rel_error(got, ref) < 4 * tolerance("float16")


def test_bad_arguments(rng):
    lay = AttentionLayout(layouts.causal(2), 16)
    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    cases = [
        (lambda: attention(q.numpy(), k, v, lay), TypeError, "q"),
        (lambda: attention(q[0], k, v, lay), ValueError, "q"),
        (lambda: attention(q, k.double(), v, lay), TypeError, "dtype"),
        (lambda: attention(q.int(), k, v, lay), TypeError, "q"),
        (lambda: attention(q, k[:, :, :16], v, lay), ValueError, "k"),
        (lambda: attention(q, k, v[..., :8], lay), ValueError, "v"),
        (lambda: attention(q[..., :8], k[..., :8], v[..., :8], lay), ValueError, "head dim"),
        (lambda: attention(torch.randn(1, 3, 32, 16), k, v, lay), ValueError, "heads"),
        (lambda: attention(q, k, v, AttentionLayout(layouts.causal(3), 16)), ValueError, "layout"),
        (lambda: attention(q, k, v, AttentionLayout(layouts.causal(2, heads=3), 16)), ValueError, "layout"),
        (lambda: attention(q, k, v, lay, block_size=32), ValueError, "block_size"),
        (lambda: attention(q, k, v, np.ones((3, 3))), ValueError, "layout"),
        (lambda: attention(q, k, v, np.full((2, 2), 2)), ValueError, "layout"),
        (lambda: attention(q, k, v, lay, causal=1), TypeError, "causal"),
        (lambda: attention(q, k, v, lay, scale="x"), TypeError, "scale"),
        (lambda: attention(q, k, v, lay, seqlens="32"), TypeError, "seqlens"),
        (lambda: attention(q, k, v, lay, seqlens=torch.tensor([1.0])), TypeError, "seqlens"),
        (lambda: attention(q, k, v, lay, seqlens=torch.tensor([1, 2])), ValueError, "seqlens"),
        (lambda: AttentionLayout(layouts.causal(2), 12), ValueError, "block_size"),
        (lambda: AttentionLayout(layouts.causal(2), 16.0), TypeError, "block_size"),
        (lambda: AttentionLayout(np.zeros((2, 2)), 16), ValueError, "layout"),
        (lambda: AttentionLayout(np.ones((2, 3)), 16), ValueError, "layout"),
        (lambda: AttentionLayout(layouts.causal(2), 16, block_masks="x"), TypeError, "block_masks"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()
