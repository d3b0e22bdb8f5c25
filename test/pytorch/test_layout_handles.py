"""Layout handles -- what the custom ops, compiled graphs and exported programs hold in place of a
layout -- are digests of the layout's content: the same in every process, and a handle this process
has not prepared raises instead of naming another layout."""
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from blocksparse.layouts import attention as layouts
from blocksparse.torch import AttentionLayout, BlocksparseMatMul, BlocksparseTransformer, attention
from blocksparse.torch._attention import state as attention_state
from blocksparse.torch._matmul import plan
from blocksparse.torch._transformer import state as transformer_state

_HANDLES = """
import numpy as np
from blocksparse.layouts import attention as layouts
from blocksparse.torch import AttentionLayout, BlocksparseMatMul, BlocksparseTransformer
BlocksparseMatMul(np.ones((3, 3)), block_size=16)  # another layout prepared first
mask = np.array({mask})
print(BlocksparseMatMul(mask, block_size=16)._handle, AttentionLayout(layouts.causal(4), 16)._handle,
      BlocksparseTransformer(np.tril(np.ones((4, 4))), block_size=16, heads=2)._handle)
"""


def _run(code, stdin=b""):
    done = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().split()


def test_the_same_layouts_have_the_same_handles_in_another_process(rng):
    mask = (rng.random((4, 5)) < 0.5).astype(int)
    mask[0, 0] = 1
    here = [BlocksparseMatMul(mask, block_size=16)._handle, AttentionLayout(layouts.causal(4), 16)._handle,
            BlocksparseTransformer(np.tril(np.ones((4, 4))), block_size=16, heads=2)._handle]
    assert _run(_HANDLES.format(mask=mask.tolist())) == [str(h) for h in here]


def test_other_layouts_have_other_handles(rng):
    mask = np.ones((4, 4), int)
    other = mask.copy()
    other[1, 2] = 0
    assert BlocksparseMatMul(mask, block_size=16)._handle != BlocksparseMatMul(other, block_size=16)._handle
    assert BlocksparseMatMul(mask, block_size=16)._handle != BlocksparseMatMul(mask, block_size=32)._handle
    assert AttentionLayout(mask, 16)._handle != AttentionLayout(other, 16)._handle


@pytest.mark.parametrize("registry", [plan, attention_state, transformer_state], ids=["matmul", "attention",
                                                                                        "transformer"])
def test_an_unprepared_handle_raises(registry):
    with pytest.raises(ValueError, match="this process has prepared no"):
        registry.state(12345)


def test_a_pickled_attention_layout_prepares_itself_in_another_process(rng):
    lay = AttentionLayout(layouts.bigbird(8, 1, 1, 2, seed=3), block_size=16)
    code = """
import pickle, sys, torch
from blocksparse.layouts import attention as layouts
from blocksparse.torch import AttentionLayout, attention
AttentionLayout(layouts.causal(8), block_size=16)  # another layout prepared first
lay = pickle.loads(sys.stdin.buffer.read())
"""
    q = torch.from_numpy(rng.standard_normal((1, 1, 128, 16)))
    code += f"q = torch.tensor({q.tolist()}, dtype=torch.float64)\n"
    code += "print(repr(attention(q, q, q, lay).sum().item()))\n"
    got = float(_run(code, pickle.dumps(lay))[0])
    assert got == attention(q, q, q, lay).sum().item()


def test_one_compiled_function_over_several_layouts(rng):
    """A handle that changes between calls may become a symbolic int when the function recompiles."""
    mats = [BlocksparseMatMul(m, block_size=16) for m in ([[1, 0], [1, 1]], [[1, 1], [0, 1]], [[0, 1], [1, 1]])]
    compiled = torch.compile(lambda m, x, w: m(x, w) * 2, backend="aot_eager", fullgraph=True)
    x = torch.from_numpy(rng.standard_normal((4, 32))).float()
    w = torch.from_numpy(rng.standard_normal(mats[0].w_shape)).float()
    for m in mats:
        torch.testing.assert_close(compiled(m, x, w), m(x, w) * 2, rtol=0, atol=0)


def test_a_transformer_first_built_under_fake_tensors_serves_real_ones(rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    layout = np.tril(np.ones((3, 3), int))
    layout[2, 0] = 0
    with FakeTensorMode():
        BlocksparseTransformer(layout, block_size=16, heads=2)
    bst = BlocksparseTransformer(layout, block_size=16, heads=2)
    q, k = (torch.from_numpy(rng.standard_normal((1, 48, 32))) for _ in range(2))
    qh, kh = (t.reshape(1, 48, 2, 16).permute(0, 2, 1, 3) for t in (q, k))
    dense = (qh @ kh.transpose(-1, -2)).reshape(1, 2, 3, 16, 3, 16).permute(0, 1, 2, 4, 3, 5)
    want = dense[:, :, torch.from_numpy(np.nonzero(layout)[0]), torch.from_numpy(np.nonzero(layout)[1])]
    torch.testing.assert_close(bst.query_key_op(q, k), want)


def _prepared_count(registry):
    """Live states of a registry once collected owners are released (a handle call drains them)."""
    import gc

    gc.collect()
    keeper = BlocksparseMatMul(np.ones((1, 1)), block_size=16)  # any handle call applies the releases
    AttentionLayout(np.ones((1, 1, 1)), 16)
    BlocksparseTransformer(np.ones((1, 1)), block_size=16, heads=1)
    del keeper
    return len(registry._registry)


_MAKERS = {
    "matmul": (plan, lambda m: BlocksparseMatMul(m, block_size=16)),
    "linear": (plan, lambda m: __import__("blocksparse.torch", fromlist=["x"]).BlocksparseLinear(m, block_size=16)),
    "attention": (attention_state, lambda m: AttentionLayout(m[:, :m.shape[0]], 16)),
    "transformer": (transformer_state, lambda m: BlocksparseTransformer(m[:, :m.shape[0]], block_size=16, heads=1)),
}


@pytest.mark.parametrize("kind", _MAKERS)
def test_dropped_layouts_are_released(rng, kind):
    """A program building fresh layouts as it trains (dynamic sparsity) does not grow: a state lives
    while an object that prepared it does, and goes with the last of them."""
    registry, make = _MAKERS[kind]
    base = _prepared_count(registry)
    masks = [np.tril((rng.random((6, 6)) < 0.5) | np.eye(6, dtype=bool)).astype(int) for _ in range(40)]
    kept = make(masks[0])
    twin = make(masks[0])  # equal content: one state, two owners
    for m in masks[1:]:
        make(m)  # dropped at once
    assert _prepared_count(registry) <= base + 1
    del twin
    handle = kept.bsmm._handle if kind == "linear" else kept._handle
    assert registry.state(handle) is not None  # still owned by `kept`
    x = torch.from_numpy(rng.standard_normal((3, 96)))
    if kind == "matmul":
        w = torch.from_numpy(rng.standard_normal(kept.w_shape))
        torch.testing.assert_close(kept(x, w), x @ torch.from_numpy(kept.layout.dense(w.numpy())))
    del kept
    assert _prepared_count(registry) == base


def test_raw_attention_layouts_are_released_past_the_cache(rng):
    from blocksparse.torch import fused_attention

    base = _prepared_count(attention_state)
    q = torch.from_numpy(rng.standard_normal((1, 1, 128, 16)))
    for _ in range(fused_attention._CACHE_SIZE + 20):
        attention(q, q, q, np.tril(rng.random((8, 8)) < 0.6) | np.eye(8, dtype=bool))
    assert _prepared_count(attention_state) <= base + fused_attention._CACHE_SIZE


def test_a_compiled_raw_layout_call_outlives_the_cache(rng):
    """A raw layout traced by torch.compile keeps its state after the cache has moved on."""
    from blocksparse.torch import fused_attention

    q = torch.from_numpy(rng.standard_normal((1, 1, 128, 16))).float()  # (float64 traces the plain ops)
    lay = np.tril(np.ones((8, 8), int))
    compiled = torch.compile(lambda q, lay: attention(q, q, q, lay), backend="aot_eager", fullgraph=True)
    want = attention(q, q, q, lay)
    torch.testing.assert_close(compiled(q, lay), want)
    for _ in range(fused_attention._CACHE_SIZE + 5):  # push the traced layout out of the cache
        attention(q, q, q, np.tril(rng.random((8, 8)) < 0.6) | np.eye(8, dtype=bool))
    _prepared_count(attention_state)
    torch.testing.assert_close(compiled(q, lay), want)


def _other_layouts(rng, n, size=6):
    return [np.tril((rng.random((size, size)) < 0.5) | np.eye(size, dtype=bool)).astype(int) for _ in range(n)]


def test_a_backward_after_its_layouts_object_is_gone(rng):
    """The autograd record holds the layout's state: an inline ``BlocksparseMatMul(...)(x, w)`` or an
    ``AttentionLayout`` built in the call still differentiates after many other layouts came and went."""
    from blocksparse.torch import _registry

    mask = np.tril(np.ones((6, 6), int))
    x = torch.from_numpy(rng.standard_normal((5, 96))).requires_grad_()
    w = torch.from_numpy(rng.standard_normal((21, 16, 16))).float().requires_grad_()
    y = BlocksparseMatMul(mask, block_size=16)(x.float(), w)
    q = torch.from_numpy(rng.standard_normal((1, 1, 96, 16))).float().requires_grad_()
    o = attention(q, q, q, AttentionLayout(mask, 16))
    for m in _other_layouts(rng, _registry.GRACE + 10):  # past the released states kept anyway
        BlocksparseMatMul(m, block_size=16)
        AttentionLayout(m, 16)
    _prepared_count(plan)
    dense = torch.from_numpy(BlocksparseMatMul(mask, block_size=16).layout.dense(w.detach().double().numpy()))
    (y.sum() + o.sum()).backward()
    torch.testing.assert_close(x.grad, torch.ones(5, 96, dtype=torch.float64) @ dense.t().float().double(),
                               rtol=1e-5, atol=1e-5)
    assert torch.isfinite(q.grad).all()


def test_released_states_kept_are_bounded(rng):
    from blocksparse.torch import _registry
    import gc

    gc.collect()
    before = set(plan._registry._held.keys()) - set(plan._registry._grace)  # held by earlier tests' objects
    for m in _other_layouts(rng, _registry.GRACE + 30):
        BlocksparseMatMul(m, block_size=16)
    _prepared_count(plan)
    gc.collect()
    held = set(plan._registry._held.keys()) - before
    assert len(plan._registry._grace) <= _registry.GRACE and len(held) <= _registry.GRACE
