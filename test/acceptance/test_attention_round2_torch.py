"""Acceptance, second round: ``blocksparse.torch.BlocksparseTransformer`` and ``attention`` as a
demanding user calls them -- the documented block sizes, layouts with empty rows / columns, one
block, fully dense, strided inputs, ``no_grad`` / ``inference_mode``, the meta device, copies,
second derivatives and bad shape-helper arguments -- against float64 references (CPU: the
reference path)."""
import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attention_cases import (BAD_MINIBATCH, CHAIN_CASES, EMPTY_ROW_AND_COLUMN, chain_reference,  # noqa: E402
                             check_bad_minibatch, tril_callback)
from attention_reference import Ref  # noqa: E402
from test_attention_torch_fused import _layout_keep, _qkv, reference_and_grads  # noqa: E402

from blocksparse.layouts import attention as layouts  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.torch import AttentionLayout, BlocksparseTransformer, attention  # noqa: E402

@pytest.mark.parametrize("name", list(CHAIN_CASES))
def test_attention_chain_values_and_gradients(name, rng):
    case, autoregress_at_key = CHAIN_CASES[name]
    bst, R, heads, D = case.make(BlocksparseTransformer), case.ref(), case.heads, 3
    q, k, v = (torch.tensor(rng.standard_normal(shape), requires_grad=True)
               for shape in (bst.q_shape(2, heads * D), bst.k_shape(2, heads * D), bst.k_shape(2, heads * D)))
    dy = torch.tensor(rng.standard_normal(bst.q_shape(2, heads * D)))
    y = bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), 0.7, autoregress_at_key), v)
    y.backward(dy)
    want = chain_reference(R, *(t.detach().numpy() for t in (q, k, v, dy)), 0.7, autoregress_at_key)
    for got, ref in zip((y, q.grad, k.grad, v.grad), want):
        assert not torch.isnan(got).any()
        assert rel_error(got, ref) < 1e-10


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
def test_documented_block_sizes(block_size, rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=block_size, heads=1)
    R = Ref(np.tril(np.ones((1, 2, 2), bool)), block_size)
    q, k = (torch.tensor(rng.standard_normal(bst.q_shape(1, 2)), dtype=torch.float32) for _ in range(2))
    w = bst.query_key_op(q, k)
    assert tuple(w.shape) == bst.w_shape(1) == (1, 1, 3, block_size, block_size)
    assert rel_error(w, R.nt(q.double().numpy(), k.double().numpy())) < tolerance(torch.float32)


def test_strided_inputs(rng):
    bst = BlocksparseTransformer(EMPTY_ROW_AND_COLUMN, block_size=16, heads=2)
    R = Ref(np.broadcast_to(EMPTY_ROW_AND_COLUMN.astype(bool), (2, 3, 3)), 16)
    q = torch.tensor(rng.standard_normal((1, 8, 48))).transpose(1, 2)          # (1, 48, 8), not contiguous
    k = torch.tensor(rng.standard_normal((1, 48, 16)))[..., ::2]               # every other feature
    assert not q.is_contiguous() and not k.is_contiguous()
    w = bst.query_key_op(q, k)
    assert rel_error(w, R.nt(q.numpy(), k.numpy())) < 1e-12
    w_t = torch.tensor(rng.standard_normal(bst.w_shape(1))).transpose(3, 4)    # a transposed view
    assert rel_error(bst.weight_value_op(w_t, k), R.nn(w_t.numpy(), k.numpy())) < 1e-12
    assert rel_error(bst.tn_op(w_t, q), R.tn(w_t.numpy(), q.numpy())) < 1e-12


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_without_autograd(mode, rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=2)
    R = Ref(np.tril(np.ones((2, 2, 2), bool)), 16)
    q = torch.tensor(rng.standard_normal(bst.q_shape(2, 8)), requires_grad=True)
    with getattr(torch, mode)():
        p = bst.masked_softmax(bst.query_key_op(q, q), scale=0.5, autoregress_at_key=0)
        y = bst.weight_value_op(p, q)
    assert not y.requires_grad
    qn = q.detach().numpy()
    assert rel_error(y, R.nn(R.softmax(R.nt(qn, qn), 0.5, 0), qn)) < 1e-10


def test_meta_device():
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=2)
    q = torch.empty(3, 32, 8, device="meta", dtype=torch.bfloat16)
    w = bst.query_key_op(q, q)
    p = bst.masked_softmax(w, autoregress_at_key=0, dtype=torch.float32)
    y = bst.weight_value_op(p.to(torch.bfloat16), q)
    assert w.device.type == p.device.type == y.device.type == "meta"
    assert (tuple(w.shape), w.dtype, p.dtype) == (bst.w_shape(3), torch.bfloat16, torch.float32)
    assert (tuple(y.shape), y.dtype) == ((3, 32, 8), torch.bfloat16)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_compute_the_same(how, rng):
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=2, mask_callback=tril_callback)
    other = copy.deepcopy(bst) if how == "deepcopy" else pickle.loads(pickle.dumps(bst))
    x = torch.tensor(rng.standard_normal(bst.w_shape(2)))
    assert torch.equal(other.masked_softmax(x, scale=0.3), bst.masked_softmax(x, scale=0.3))
    assert (other.blocks, other.heads, other.nt_list) == (bst.blocks, bst.heads, bst.nt_list)


def test_products_second_derivatives(rng):
    """Differentiating a gradient: ``<nt(a, b), c>`` gives ``da = nn(c, b)``, and ``<da, e>`` gives
    ``db = tn(c, e)``, ``dc = nt(e, b)``; ``<nn(w, b), c>`` gives ``dw = nt(c, b)``, and ``<dw, e>``
    gives ``db = tn(e, c)``, ``dc = nn(e, b)``."""
    bst = BlocksparseTransformer(EMPTY_ROW_AND_COLUMN, block_size=16, heads=2)
    R = Ref(np.broadcast_to(EMPTY_ROW_AND_COLUMN.astype(bool), (2, 3, 3)), 16)
    dense = lambda: torch.tensor(rng.standard_normal(bst.q_shape(1, 4)), requires_grad=True)  # noqa: E731
    packed = lambda: torch.tensor(rng.standard_normal(bst.w_shape(1)), requires_grad=True)  # noqa: E731
    n = lambda t: t.detach().numpy()  # noqa: E731
    a, b, c, e = dense(), dense(), packed(), dense()
    (da,) = torch.autograd.grad((bst.nt_op(a, b) * c).sum(), a, create_graph=True)
    db, dc = torch.autograd.grad((da * e).sum(), (b, c))
    assert rel_error(da, R.nn(n(c), n(b))) < 1e-12
    assert rel_error(db, R.tn(n(c), n(e))) < 1e-12 and rel_error(dc, R.nt(n(e), n(b))) < 1e-12
    w, b, c, e = packed(), dense(), dense(), packed()
    (dw,) = torch.autograd.grad((bst.nn_op(w, b) * c).sum(), w, create_graph=True)
    db, dc = torch.autograd.grad((dw * e).sum(), (b, c))
    assert rel_error(dw, R.nt(n(c), n(b))) < 1e-12
    assert rel_error(db, R.tn(n(e), n(c))) < 1e-12 and rel_error(dc, R.nn(n(e), n(b))) < 1e-12


@BAD_MINIBATCH
def test_shape_helpers_reject_bad_minibatch(N, error):
    check_bad_minibatch(BlocksparseTransformer, N, error)
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=2)
    assert bst.w_shape(None)[0] is None and bst.q_shape(0, 8) == (0, 32, 8)


def test_mask_callback_must_give_a_block_mask():
    for bad in (lambda *a: np.ones((8, 8)), lambda *a: None, lambda *a: np.ones((16, 16, 1))):
        with pytest.raises(ValueError, match="mask_callback"):
            BlocksparseTransformer(np.ones((2, 2)), block_size=16, heads=1, mask_callback=bad)


# --------------------------------------------------------------------------- fused attention
FUSED = {
    # name: (layout, causal, seqlens); B = 3, HQ = 4, HK = 2, S = 64, bs = 16
    "gqa-causal-zero-and-over-long-lengths": (layouts.causal(4), True, [0, 64, 200]),
    "gqa-per-head-negative-length": (layouts.sliding_window(4, 1, heads=4), False, [-5, 17, 64]),
    "one-block-row-dense": (np.ones((4, 4)), False, None),
}


@pytest.mark.parametrize("name", list(FUSED))
def test_fused_values_and_gradients(name, rng):
    layout, causal, seqlens = FUSED[name]
    B, HQ, HK, S, D, bs = 3, 4, 2, 64, 16, 16
    q, k, v = _qkv(rng, B, HQ, HK, S, D, torch.float64)
    do = torch.tensor(rng.standard_normal((B, HQ, S, D)))
    lens = None if seqlens is None else torch.tensor(seqlens)
    o = attention(q, k, v, layout, causal=causal, seqlens=lens)
    o.backward(do)
    want = reference_and_grads(q, k, v, _layout_keep(layout, bs, causal), D ** -0.5, do, seqlens)
    for got, ref in zip((o, q.grad, k.grad, v.grad), want):
        assert not torch.isnan(got).any()
        assert rel_error(got, ref.numpy()) < 1e-10
    if seqlens is not None and seqlens[0] <= 0:
        assert not o[0].any() and not q.grad[0].any() and not k.grad[0].any()


def test_fused_single_block_and_batch_of_one(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 16, 32, torch.float32)
    o = attention(q, k, v, np.ones((1, 1)))
    want = reference_and_grads(q, k, v, np.ones((1, 16, 16), bool), 32 ** -0.5, torch.zeros(1, 2, 16, 32))
    assert rel_error(o, want[0].numpy()) < tolerance(torch.float32)


def test_fused_empty_batch(rng):
    q, k, v = _qkv(rng, 0, 2, 1, 32, 16, torch.float32)
    o = attention(q, k, v, layouts.causal(2), causal=True)
    assert tuple(o.shape) == (0, 2, 32, 16)
    o.sum().backward()
    assert tuple(q.grad.shape) == (0, 2, 32, 16) and tuple(k.grad.shape) == (0, 1, 32, 16)


def test_fused_strided_inputs(rng):
    B, H, S, D = 2, 2, 32, 16
    q = torch.tensor(rng.standard_normal((B, H, D, S))).transpose(2, 3)
    k = torch.tensor(rng.standard_normal((B, S, H, D))).transpose(1, 2)
    v = torch.tensor(rng.standard_normal((B, H, S, 2 * D)))[..., ::2]
    o = attention(q, k, v, layouts.causal(2), causal=True)
    want = reference_and_grads(q, k, v, _layout_keep(layouts.causal(2), 16, True), D ** -0.5, torch.zeros(B, H, S, D))
    assert rel_error(o, want[0].numpy()) < 1e-12


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_fused_without_autograd(mode, rng):
    q, k, v = _qkv(rng, 1, 2, 1, 32, 16, torch.float64)
    with getattr(torch, mode)():
        o = attention(q, k, v, layouts.causal(2), causal=True)
    assert not o.requires_grad
    want = reference_and_grads(q, k, v, _layout_keep(layouts.causal(2), 16, True), 16 ** -0.5,
                               torch.zeros(1, 2, 32, 16))
    assert rel_error(o, want[0].numpy()) < 1e-12


def test_fused_meta_device():
    q = torch.empty(2, 4, 64, 32, device="meta", dtype=torch.float16)
    k = torch.empty(2, 2, 64, 32, device="meta", dtype=torch.float16)
    o = attention(q, k, k, AttentionLayout(layouts.causal(4), 16), causal=True)
    assert (o.device.type, tuple(o.shape), o.dtype) == ("meta", (2, 4, 64, 32), torch.float16)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_attention_layout_copies(how, rng):
    lay = AttentionLayout(layouts.fixed(4, stride=2), block_size=16)
    other = copy.deepcopy(lay) if how == "deepcopy" else pickle.loads(pickle.dumps(lay))
    assert other == lay and hash(other) == hash(lay)
    q, k, v = _qkv(rng, 1, 2, 2, 64, 16, torch.float64)
    assert torch.equal(attention(q, k, v, other), attention(q, k, v, lay))


def test_fused_numpy_bool_causal_and_layout_of_key_heads(rng):
    q, k, v = _qkv(rng, 1, 4, 2, 32, 16, torch.float64)
    assert torch.equal(attention(q, k, v, layouts.causal(2), causal=np.bool_(True)),
                       attention(q, k, v, layouts.causal(2), causal=True))
    with pytest.raises(ValueError, match="heads"):     # per-head layouts follow the query heads
        attention(q, k, v, layouts.causal(2, heads=2))


def test_softmax_second_derivatives(rng):
    """The masked softmax is differentiable twice (its gradient op has a gradient), across blocks
    of a row, with in-block masks and ``autoregress_at_key``."""
    def callback(blk_shape, head, q_blk, k_blk, blk_id):
        return np.random.default_rng([q_blk, k_blk]).random(blk_shape) < 0.6

    bst = BlocksparseTransformer(np.ones((1, 2)), block_size=8, heads=1, mask_callback=callback)
    x = torch.tensor(rng.standard_normal(bst.w_shape(1)), requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: bst.masked_softmax(t, scale=0.7, autoregress_at_key=3), (x,))


def test_fused_double_backward_is_a_clear_error(rng):
    q, k, v = _qkv(rng, 1, 2, 1, 32, 16, torch.float64)
    (dq,) = torch.autograd.grad(attention(q, k, v, layouts.causal(2)).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.sum().backward()


def test_fused_compile_with_a_raw_layout(rng):
    """``layout`` may be a plain 0/1 array under ``torch.compile(fullgraph=True)`` too."""
    q, k, v = _qkv(rng, 1, 2, 1, 32, 16, torch.float64)
    layout = np.array([[1, 0], [1, 1]])
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, layout, causal=True), fullgraph=True,
                             backend="aot_eager")
    o = compiled(q, k, v)
    o.backward(torch.ones_like(o))
    want = reference_and_grads(q, k, v, _layout_keep(layout, 16, True), 16 ** -0.5, torch.ones(1, 2, 32, 16))
    for got, ref in zip((o, q.grad, k.grad, v.grad), want):
        assert rel_error(got, ref.numpy()) < 1e-10


@pytest.mark.parametrize("call, name", [
    (lambda: layouts.fixed(8, 4, causal="yes"), "causal"),
    (lambda: layouts.fixed(8, 4, vary_heads="x", heads=2), "vary_heads"),
    (lambda: layouts.sliding_window(4, 1, causal="no"), "causal"),
    (lambda: layouts.bigbird(4, 1, 1, 1, seed=0, causal=None), "causal"),
    (lambda: layouts.from_mask(np.ones((16, 16)), 8, return_block_masks="x"), "return_block_masks"),
], ids=["fixed-causal", "fixed-vary-heads", "window-causal", "bigbird-causal", "from-mask-flag"])
def test_layout_builder_flags_must_be_bools(call, name):
    with pytest.raises(TypeError, match=name):
        call()


def test_autocast_leaves_float64_alone(rng):
    """As torch's own ops (``F.linear``, ``F.scaled_dot_product_attention``): autocast casts
    float32 inputs, never float64 ones."""
    bst = BlocksparseTransformer(np.tril(np.ones((2, 2))), block_size=16, heads=2)
    x = torch.tensor(rng.standard_normal(bst.q_shape(1, 8)))
    q, k, v = _qkv(rng, 1, 2, 2, 32, 16, torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert bst.query_key_op(x, x).dtype == torch.float64
        assert attention(q, k, v, layouts.causal(2)).dtype == torch.float64
        assert bst.query_key_op(x.float(), x.float()).dtype == torch.bfloat16


def test_transformer_forward_mode_tangents(rng):
    """``torch.func.jvp`` and ``forward_ad`` duals get true tangents (the custom ops have reverse
    mode only: such calls take the reference path as plain PyTorch ops)."""
    import torch.autograd.forward_ad as fwAD

    bst = BlocksparseTransformer(EMPTY_ROW_AND_COLUMN, block_size=16, heads=2)
    R = Ref(np.broadcast_to(EMPTY_ROW_AND_COLUMN.astype(bool), (2, 3, 3)), 16)
    q, t = (torch.tensor(rng.standard_normal(bst.q_shape(1, 8))) for _ in range(2))
    _, tangent = torch.func.jvp(lambda x: bst.query_key_op(x, q), (q,), (t,))
    assert rel_error(tangent, R.nt(t.numpy(), q.numpy())) < 1e-12
    w, tw = (torch.tensor(rng.standard_normal(bst.w_shape(1))) for _ in range(2))
    with fwAD.dual_level():
        y = bst.weight_value_op(fwAD.make_dual(w, tw), q)
        assert rel_error(fwAD.unpack_dual(y).tangent, R.nn(tw.numpy(), q.numpy())) < 1e-12
        p = fwAD.unpack_dual(bst.masked_softmax(fwAD.make_dual(w, tw), scale=0.5, autoregress_at_key=0))
    probs = R.softmax(w.numpy(), 0.5, 0)
    assert rel_error(p.tangent, R.softmax_grad(tw.numpy(), probs, 0.5)) < 1e-12   # the Jacobian is symmetric


def test_fused_forward_mode_tangents_and_vmap(rng):
    q, k, v = (t.detach() for t in _qkv(rng, 1, 2, 2, 32, 16, torch.float64))
    t = torch.tensor(rng.standard_normal(v.shape))
    _, tangent = torch.func.jvp(lambda x: attention(q, k, x, layouts.causal(2)), (v,), (t,))
    assert rel_error(tangent, attention(q, k, t, layouts.causal(2)).numpy()) < 1e-12   # linear in v
    batched = torch.stack([q, q.flip(2)])
    got = torch.func.vmap(lambda x: attention(x, k, v, layouts.causal(2), causal=True))(batched)
    for g, x in zip(got, batched):
        assert torch.allclose(g, attention(x, k, v, layouts.causal(2), causal=True), rtol=0, atol=1e-12)


def test_fused_per_head_dense_mask_exact(rng):
    """A per-head element mask through ``from_mask``: block size 32, every query head on one
    key/value head, a row that keeps nothing in head 1, a ragged batch -- exact masking."""
    H, S, D, bs = 2, 64, 16, 32
    mask = rng.random((H, S, S)) < 0.3
    mask[1, 5] = False
    layout, block_masks = layouts.from_mask(mask, bs, return_block_masks=True)
    q, k, v = _qkv(rng, 2, H, 1, S, D, torch.float64)
    do = torch.tensor(rng.standard_normal((2, H, S, D)))
    o = attention(q, k, v, AttentionLayout(layout, bs, block_masks=block_masks), seqlens=torch.tensor([64, 40]))
    o.backward(do)
    want = reference_and_grads(q, k, v, mask, D ** -0.5, do, [64, 40])
    for got, ref in zip((o, q.grad, k.grad, v.grad), want):
        assert rel_error(got, ref.numpy()) < 1e-10
    assert not o[:, 1, 5].any() and not q.grad[:, 1, 5].any()
