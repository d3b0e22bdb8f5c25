"""blocksparse.torch.attention: outputs and gradients against float64 dense attention with the same
mask, for every layout builder, on the reference path and on the kernels (Triton's interpreter);
grouped-query heads, ragged lengths, fully masked rows, element masks, torch.compile, autocast,
AttentionLayout reuse, and bad input."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.layouts import attention as layouts  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.flash import attention_grads, element_mask, keep_mask  # noqa: E402
from blocksparse.torch import AttentionLayout, attention  # noqa: E402
from readme_examples import run_readme_example  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
#: P and dS are rounded to the input dtype before their products: gradients get twice the bound.
GRAD_FACTOR = 2


def _layout(name, nb, heads, seed):
    """Each builder of blocksparse.layouts.attention, sized ``nb`` blocks."""
    return {
        "causal": lambda: layouts.causal(nb, heads=heads),
        "fixed": lambda: layouts.fixed(nb, 2, 1, heads=heads),
        "window": lambda: layouts.sliding_window(nb, 1, heads=heads),
        "bigbird": lambda: layouts.bigbird(nb, 0, 1, 1, seed, heads=heads),
    }[name]()


def _inputs(rng, B, HQ, HK, S, D, dtype):
    t = lambda *shape: torch.from_numpy(rng.standard_normal(shape)).to(DTYPES[dtype])  # noqa: E731
    return t(B, HQ, S, D), t(B, HK, S, D), t(B, HK, S, D), t(B, HQ, S, D)


def _check(rng, layout, *, bs, causal=False, B=1, HQ=2, HK=2, D=16, dtype="float16", seqlens=None,
           block_masks=None, dense=None, scale=None, prepare=True):
    """Run attention + backward on fresh random inputs and compare with float64."""
    S = np.asarray(layout).shape[-1] * bs
    q, k, v, do = _inputs(rng, B, HQ, HK, S, D, dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    lens = None if seqlens is None else torch.tensor(seqlens)
    if prepare:
        lay, kwargs = AttentionLayout(layout, bs, block_masks=block_masks), {}
    else:
        lay, kwargs = layout, {"block_masks": block_masks}
    o = attention(q, k, v, lay, causal=causal, scale=scale, seqlens=lens, **kwargs)
    o.backward(do)
    mask = element_mask(layout, bs) if dense is None else dense
    refs = attention_grads(q, k, v, keep_mask(mask, causal=causal, seqlens=seqlens),
                           D ** -0.5 if scale is None else scale, do)
    tol = tolerance(dtype)
    for name, got, ref, bound in zip(("o", "dq", "dk", "dv"), (o, q.grad, k.grad, v.grad), refs,
                                     (tol, *(GRAD_FACTOR * tol,) * 3)):
        assert got.dtype == DTYPES[dtype] and got.shape == ref.shape, name
        assert rel_error(got, ref) < bound, name
    return o.detach(), (q.grad, k.grad, v.grad)


# --------------------------------------------------------------------------- reference path
@pytest.fixture
def reference(monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", ["causal", "fixed", "window", "bigbird"])
@pytest.mark.parametrize("heads", [None, 2], ids=["shared", "per-head"])
def test_reference_every_layout(rng, reference, name, heads, causal):
    _check(rng, _layout(name, 6, heads, int(rng.integers(1 << 30))), bs=16, causal=causal, B=2,
           dtype="float32")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reference_dtypes(rng, reference, dtype):
    _check(rng, layouts.bigbird(4, 1, 1, 1, 3), bs=32, D=32, dtype=dtype, scale=0.3)


def test_reference_gqa_ragged_empty(rng, reference):
    layout = layouts.sliding_window(4, 1)
    layout[2] = 0
    o, (dq, dk, dv) = _check(rng, layout, bs=16, B=3, HQ=4, HK=1, dtype="float32", seqlens=[64, 23, 0],
                             causal=True)
    assert (o[:, :, 32:48] == 0).all() and (o[1, :, 23:] == 0).all() and (o[2] == 0).all()
    assert (dq[2] == 0).all() and (dk[2] == 0).all() and (dv[1, :, 23:] == 0).all()


@pytest.mark.parametrize("backend, dtype", [("reference", "float32"),
                                            pytest.param("triton", "float16", marks=pytest.mark.interpreter)])
def test_nan_padding_past_the_lengths_stays_out(rng, monkeypatch, backend, dtype):
    """A ragged batch whose padding (past each length) holds NaN / inf, as an uninitialised buffer
    may: the rows that are in, and every gradient inside the lengths, are what zero padding gives;
    rows past the lengths, and their gradients, are zeros (never NaN)."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    layout, lens = layouts.sliding_window(4, 1), torch.tensor([40, 64, 7])
    q, k, v, do = _inputs(rng, 3, 2, 2, 64, 16, dtype)
    inside = (torch.arange(64)[None, None, :, None] < lens[:, None, None, None])

    def run(fill):
        leaves = [torch.where(inside, t, fill).to(t.dtype).requires_grad_() for t in (q, k, v)]
        o = attention(*leaves, layout, block_size=16, seqlens=lens)
        grads = torch.autograd.grad(o, leaves, torch.where(inside, do, fill).to(do.dtype))
        return o, *grads

    clean = run(0.0)
    assert all(torch.isfinite(t).all() for t in clean)
    for fill in (float("nan"), float("inf")):
        for got, want in zip(run(fill), clean):
            torch.testing.assert_close(got, torch.where(inside, want, 0.0), rtol=0, atol=0)


def test_unsigned_lengths_and_numpy_scales(rng, reference):
    """``seqlens`` of any integer dtype (unsigned 16-64-bit too, lengths past S clamped to S, a
    uint64 past int64's range too) and a numpy float32 ``scale`` (no overflow warning from the
    finiteness check) give what int64 lengths and a Python float give."""
    import warnings

    q, k, v, _ = _inputs(rng, 2, 2, 2, 64, 16, "float32")
    layout = layouts.sliding_window(4, 1)
    want = attention(q, k, v, layout, block_size=16, seqlens=torch.tensor([37, 64]), scale=0.3)
    for dtype in (d for d in ("uint16", "uint32", "uint64") if hasattr(torch, d)):
        lens = torch.tensor([37, 64 if dtype != "uint64" else 2 ** 63], dtype=getattr(torch, dtype))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = attention(q, k, v, layout, block_size=16, seqlens=lens, scale=np.float32(0.3))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_reference_from_mask(rng, reference):
    dense = rng.random((2, 64, 64)) < 0.2
    dense[1, 7] = False
    layout, bm = layouts.from_mask(dense, 16, return_block_masks=True)
    o, _ = _check(rng, layout, bs=16, block_masks=bm, dense=dense, dtype="float64", prepare=False)
    assert (o[:, 1, 7] == 0).all()


# --------------------------------------------------------------------------- kernels (interpreter)
@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")


@pytest.mark.interpreter
@pytest.mark.parametrize("name, causal", [("causal", True), ("fixed", True), ("window", False),
                                          ("bigbird", False)], ids=["causal", "fixed", "window", "bigbird"])
def test_kernels_every_layout(rng, kernels, name, causal):
    _check(rng, _layout(name, 4, 2, int(rng.integers(1 << 30))), bs=16, causal=causal, dtype="bfloat16")


@pytest.mark.interpreter
@pytest.mark.parametrize("causal", [False, True])
def test_kernels_sparse_layout_backward_by_head_first(rng, kernels, monkeypatch, causal):
    """At head dim 64 a layout kept at most ``SPARSE_HEADS_FIRST`` runs its backward on the grid
    ordered by head (``heads_first``), with float64's values; a denser one keeps the table's grid."""
    from blocksparse.ops.attention.configs import SPARSE_HEADS_FIRST
    from blocksparse.torch._attention import launch

    seen, bwd = [], launch.bwd
    monkeypatch.setattr(launch, "bwd", lambda *a, cfg, **kw: seen.append(cfg) or bwd(*a, cfg=cfg, **kw))
    sparse = np.eye(8, dtype=bool)
    sparse[:, 0] = True                                 # a global key block: 15 of 64 blocks
    assert sparse.mean() <= SPARSE_HEADS_FIRST[64]
    _check(rng, sparse, bs=16, HQ=2, HK=1, D=64, causal=causal, dtype="bfloat16")
    dense = np.tril(np.ones((4, 4), bool))
    _check(rng, dense, bs=16, HQ=2, HK=2, D=64, causal=True, dtype="bfloat16")
    assert [c.heads_first for c in seen] == [True, False]


@pytest.mark.interpreter
def test_kernels_gqa_ragged_empty(rng, kernels):
    layout = layouts.fixed(4, 2, causal=False, heads=2)
    layout[1, 3] = 0                                   # head 1, query block 3: nothing
    o, (dq, dk, dv) = _check(rng, layout, bs=16, B=2, HQ=2, HK=1, D=32, seqlens=[50, 9])
    assert (o[:, 1, 48:] == 0).all() and (o[1, :, 9:] == 0).all()
    assert torch.isfinite(dq).all() and (dk[1, :, 9:] == 0).all() and (dv[1, :, 9:] == 0).all()


@pytest.mark.interpreter
def test_kernels_from_mask_and_strided_inputs(rng, kernels):
    dense = np.tril(rng.random((32, 32)) < 0.5) | np.eye(32, dtype=bool)
    layout, bm = layouts.from_mask(dense, 16, return_block_masks=True)
    prepared = AttentionLayout(layout, 16, block_masks=bm)
    # (B, S, H, D) storage seen as (B, H, S, D), and a gradient with broadcast strides
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 32, 2, 16))).half().transpose(1, 2).requires_grad_()
               for _ in range(3))
    o = attention(q, k, v, prepared, causal=True)
    o.float().sum().backward()
    refs = attention_grads(q, k, v, keep_mask(dense, causal=True), 0.25, np.ones(q.shape))
    for got, ref in zip((o, q.grad, k.grad, v.grad), refs):
        assert rel_error(got, ref) < GRAD_FACTOR * tolerance("float16")


def test_torch_compile_fullgraph(rng, reference):
    lay = AttentionLayout(layouts.causal(4), 16)
    q, k, v, do = _inputs(rng, 1, 2, 1, 64, 16, "float32")
    lens = torch.tensor([40])

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = fn(*leaves, lens)
        o.backward(do)
        return o.detach(), *(t.grad for t in leaves)

    def step(q, k, v, lens):
        return attention(q, k, v, lay, causal=True, seqlens=lens) * 2.0

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for got, want in zip(run(compiled), run(step)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("form", ["from-shape", "argument"])
def test_torch_compile_with_a_symbolic_scale(rng, reference, form):
    """``scale`` as users write it -- ``head_dim ** -0.5`` of a dynamic shape, or a float argument that
    changes between calls (which makes it symbolic) -- traces whole; values as the eager call's."""
    lay = AttentionLayout(layouts.causal(4), 16)
    torch._dynamo.reset()
    if form == "from-shape":
        fn = torch.compile(lambda q, k, v: attention(q, k, v, lay, causal=True, scale=q.shape[-1] ** -0.5),
                           backend="aot_eager", fullgraph=True, dynamic=True)
        cases = [((q, k, v), q.shape[-1] ** -0.5) for q, k, v, _ in (_inputs(rng, 1, 2, 2, 64, d, "float32")
                                                                    for d in (16, 32))]
    else:
        fn = torch.compile(lambda q, k, v, s: attention(q, k, v, lay, causal=True, scale=s), backend="aot_eager",
                           fullgraph=True)
        q, k, v, _ = _inputs(rng, 1, 2, 2, 64, 16, "float32")
        cases = [((q, k, v, s), s) for s in (0.25, 0.5, 0.75)]
    for args, scale in cases:
        torch.testing.assert_close(fn(*args), attention(*args[:3], lay, causal=True, scale=scale))


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_torch_compile_of_raw_layouts_at_several_lengths(rng, reference, dynamic):
    """A raw array layout passed as an argument, one compiled function at two lengths (the second
    makes the length symbolic) and two batch sizes: the inferred block size specialises it."""
    compiled = torch.compile(lambda q, k, v, lay: attention(q, k, v, lay, causal=True), backend="aot_eager",
                             fullgraph=True, dynamic=dynamic)
    torch._dynamo.reset()
    for batch, blocks in ((1, 2), (3, 4), (2, 4)):
        q, k, v, _ = _inputs(rng, batch, 2, 2, 16 * blocks, 16, "float32")
        lay = layouts.causal(blocks)
        torch.testing.assert_close(compiled(q, k, v, lay), attention(q, k, v, lay, causal=True))


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_torch_compile_of_per_head_raw_layouts_at_two_head_counts(rng, reference, dynamic):
    """A raw per-head layout (heads, blocks, blocks), one compiled function at two query head counts
    (the second makes the head count symbolic): each call as the eager one."""
    compiled = torch.compile(lambda q, k, v, lay: attention(q, k, v, lay, causal=True), backend="aot_eager",
                             fullgraph=True, dynamic=dynamic)
    torch._dynamo.reset()
    for heads in (2, 4, 4):
        q, k, v, _ = _inputs(rng, 1, heads, heads, 64, 16, "float32")
        lay = layouts.causal(4, heads=heads)
        torch.testing.assert_close(compiled(q, k, v, lay), attention(q, k, v, lay, causal=True))


def test_torch_compile_with_a_block_size_argument(rng, reference):
    """``block_size`` of a raw layout as an argument of one compiled function that changes between
    calls (torch.compile then makes it symbolic): each call as the eager one."""
    torch._dynamo.reset()
    fn = lambda q, k, v, bs: attention(q, k, v, layouts.causal(64 // bs), block_size=bs, causal=True)  # noqa: E731
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    q, k, v, _ = _inputs(rng, 1, 2, 2, 64, 16, "float32")
    for bs in (16, 32, 16, 64):
        torch.testing.assert_close(compiled(q, k, v, bs), fn(q, k, v, bs))


@pytest.mark.parametrize("form", ["numpy", "tensor", "in-place"])
def test_compiled_call_follows_the_raw_layout_it_is_given(rng, reference, form):
    """One compiled function called with raw layouts of one shape but other contents (another array,
    a tensor, the same array edited in place): each call attends by the layout it passes, forward
    and backward (dynamo guards the array's shape, not its values)."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, lay: attention(q, k, v, lay), backend="aot_eager", fullgraph=True)
    first = layouts.causal(4)
    layout = first.copy() if form == "in-place" else first
    q, k, v, do = _inputs(rng, 1, 2, 2, 64, 16, "float64")
    for step in range(3):
        if step:
            other = rng.random((4, 4)) < 0.5
            other[np.arange(4), rng.integers(0, 4, 4)] = True  # every row attends somewhere
            if form == "in-place":
                layout[...] = other
            else:
                layout = other
        lay = torch.from_numpy(layout) if form == "tensor" else layout
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = compiled(*leaves, lay)
        o.backward(do)
        refs = attention_grads(q, k, v, keep_mask(element_mask(layout, 16)), 16 ** -0.5, do)
        for got, ref in zip((o, *(t.grad for t in leaves)), refs):
            assert rel_error(got, ref) < 1e-10, step


def test_shared_block_masks_with_per_head_layout(rng, reference):
    """A 2-D ``BlockMasks`` (one head's ``from_mask``) with a per-head layout of that mask: shared by
    every head, as a 2-D layout is, each head masking within its own layout."""
    dense = rng.random((64, 64)) < 0.3
    layout, bm = layouts.from_mask(dense, 16, return_block_masks=True)
    heads = np.stack([layout] * 3)
    _check(rng, heads, bs=16, block_masks=bm, dense=np.stack([dense] * 3), HQ=3, HK=3, dtype="float64")
    # a head that drops blocks the mask keeps (in part or whole) skips them: the mask within its layout
    heads[1] &= np.abs(np.subtract.outer(np.arange(4), np.arange(4))) <= 1
    heads[2, 0] = False
    within = np.stack([dense & np.kron(h, np.ones((16, 16), dtype=bool)).astype(bool) for h in heads])
    _check(rng, heads, bs=16, block_masks=bm, dense=within, HQ=3, HK=3, dtype="float64")


def test_eager_calls_bypass_the_dispatcher(rng, reference, monkeypatch):
    """Eager calls run the implementations directly (the custom ops are torch.compile's); a
    backward that builds a graph still refuses double backward clearly."""
    from blocksparse.torch._attention import ops

    def refuse(*args):
        raise AssertionError("the custom op was called eagerly")

    lay = AttentionLayout(layouts.bigbird(3, 1, 1, 1, 0), 16)
    q, k, v, do = _inputs(rng, 1, 2, 2, 48, 16, "float64")
    monkeypatch.setattr(ops, "attention_fwd", refuse)
    assert attention(q, k, v, lay).grad_fn is None             # no gradient wanted: no autograd
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attention(*leaves, lay)
    assert type(o.grad_fn).__name__ == "AttentionFunctionBackward"
    monkeypatch.setattr(ops, "attention_bwd", refuse)
    o.backward(do)
    refs = attention_grads(q, k, v, keep_mask(element_mask(lay.layout, 16)), 0.25, do)
    for got, ref in zip((o, *(t.grad for t in leaves)), refs):
        assert rel_error(got, ref) < 1e-12
    monkeypatch.undo()
    (dq,) = torch.autograd.grad(attention(*leaves, lay).sum(), leaves[0], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.sum().backward()


def test_autocast(rng, reference):
    lay = AttentionLayout(layouts.sliding_window(2, 0), 16)
    q, k, v, _ = _inputs(rng, 1, 1, 1, 32, 16, "float32")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = attention(q, k, v, lay)
    assert o.dtype == torch.bfloat16
    ref = attention_grads(q.bfloat16(), k.bfloat16(), v.bfloat16(), keep_mask(element_mask(lay.layout, 16)), 0.25)
    assert rel_error(o, ref) < tolerance("bfloat16")


def test_backend_choice(monkeypatch):
    from blocksparse.torch._attention.ops import use_triton

    half = torch.zeros(1, 1, 16, 64, dtype=torch.float16)
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "auto")
    assert use_triton(half, 16) is False              # CPU tensors take the reference path
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton(half, 16) is True
    assert use_triton(half.float(), 16) is False       # float32 takes the reference path
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        use_triton(half, 16)


# --------------------------------------------------------------------------- AttentionLayout
def test_attention_layout_is_shared_and_reused(rng, reference):
    a = AttentionLayout(layouts.causal(4), 16)
    b = AttentionLayout(torch.tensor(layouts.causal(4)), 16)
    assert a == b and hash(a) == hash(b) and a._handle == b._handle
    assert a != AttentionLayout(layouts.causal(4), 32) and a != AttentionLayout(layouts.causal(4, heads=2), 16)
    assert (a.heads, a.blocks, a.seq_len, a.density) == (1, 4, 64, 10 / 16)
    assert "blocks=4" in repr(a) and not a.layout.flags.writeable
    # a raw layout infers block_size = S // blocks and gives the same answer as the prepared one
    q, k, v, _ = _inputs(rng, 1, 1, 1, 64, 16, "float32")
    assert torch.equal(attention(q, k, v, layouts.causal(4)), attention(q, k, v, a))


BAD = {
    "q-not-tensor": (lambda q, k, v, lay: attention(q.numpy(), k, v, lay), TypeError, "q must be a torch.Tensor"),
    "q-3d": (lambda q, k, v, lay: attention(q[0], k, v, lay), ValueError, "q must be 4-D \\(B, H, S, D\\)"),
    "int-dtype": (lambda q, k, v, lay: attention(q.long(), k, v, lay), TypeError, "q must be one of"),
    "mixed-dtype": (lambda q, k, v, lay: attention(q, k.double(), v, lay), TypeError, "one dtype"),
    "k-v-shapes": (lambda q, k, v, lay: attention(q, k, v[:, :1], lay), ValueError, "k and v must have the same shape"),
    "k-seq": (lambda q, k, v, lay: attention(q, k[:, :, :32], v[:, :, :32], lay), ValueError,
              "k must have shape \\(1, HK, 64, 16\\)"),
    "head-dim": (lambda q, k, v, lay: attention(*(t[..., :12] for t in (q, k, v)), lay), ValueError,
                 "head dim \\(last size\\) must be one of \\(16, 32, 64, 128\\); got 12"),
    "gqa": (lambda q, k, v, lay: attention(q[:, :3], k, v, lay), ValueError, "multiple of k's .* HQ = 3, HK = 2"),
    "layout-heads": (lambda q, k, v, lay: attention(q, k, v, layouts.causal(4, heads=3)), ValueError,
                     "1 or 4 \\(the query heads\\) heads; got 3"),
    "layout-blocks": (lambda q, k, v, lay: attention(q, k, v, layouts.causal(3)), ValueError,
                      "S // block_size blocks per axis; got 3 blocks for S = 64"),
    "layout-block-size": (lambda q, k, v, lay: attention(q, k, v, np.tril(np.ones((8, 8)))), ValueError,
                          "layout must cover the sequence in blocks of 16, 32, 64, 128: its 8 blocks a side do not "
                          "divide S = 64"),
    "layout-cover": (lambda q, k, v, lay: attention(q, k, v, AttentionLayout(layouts.causal(2), 16)), ValueError,
                     "2 \\* 16 = 32, but q has S = 64"),
    "layout-values": (lambda q, k, v, lay: attention(q, k, v, np.full((4, 4), 2)), ValueError,
                      "layout must hold only 0 and 1"),
    "layout-empty": (lambda q, k, v, lay: attention(q, k, v, np.zeros((4, 4))), ValueError,
                     "at least one nonzero block"),
    "layout-rect": (lambda q, k, v, lay: attention(q, k, v, np.ones((4, 2))), ValueError, "square"),
    "layout-ragged": (lambda q, k, v, lay: attention(q, k, v, [[1, 0], [1]]), ValueError,
                      "layout must be a \\(NB, NB\\) or \\(heads, NB, NB\\) array"),
    "block-size": (lambda q, k, v, lay: attention(q, k, v, lay, block_size=32), ValueError,
                   "None or the AttentionLayout's 16; got 32"),
    "block-size-8": (lambda q, k, v, lay: AttentionLayout(layouts.causal(8), 8), ValueError,
                     "block_size must be one of \\(16, 32, 64, 128\\); got 8"),
    "causal-type": (lambda q, k, v, lay: attention(q, k, v, lay, causal="yes"), TypeError, "causal must be a bool"),
    "scale": (lambda q, k, v, lay: attention(q, k, v, lay, scale=float("nan")), ValueError, "scale must be a finite"),
    "scale-type": (lambda q, k, v, lay: attention(q, k, v, lay, scale="0.5"), TypeError, "scale must be a finite"),
    "seqlens-float": (lambda q, k, v, lay: attention(q, k, v, lay, seqlens=torch.ones(1)), TypeError,
                      "seqlens must hold integers"),
    "seqlens-shape": (lambda q, k, v, lay: attention(q, k, v, lay, seqlens=torch.ones(2, dtype=torch.int32)),
                      ValueError, "seqlens must have shape \\(1,\\)"),
    "masks-with-prepared": (lambda q, k, v, lay: attention(q, k, v, lay, block_masks=_masks()), ValueError,
                            "block_masks must be None with an AttentionLayout"),
    "masks-type": (lambda q, k, v, lay: AttentionLayout(layouts.causal(4), 16, block_masks=np.zeros(3)), TypeError,
                   "block_masks must be a blocksparse.layouts.attention.BlockMasks"),
    "masks-shape": (lambda q, k, v, lay: AttentionLayout(layouts.causal(2), 16, block_masks=_masks()), ValueError,
                    "block_masks.index must have the layout's shape"),
    "masks-dropped": (lambda q, k, v, lay: AttentionLayout(np.eye(4), 16, block_masks=_masks()), ValueError,
                      "-1 wherever the layout drops a block"),
}


def _masks():
    """Block masks of a 64 x 64 causal mask at block size 16 (the diagonal blocks are partial)."""
    return layouts.from_mask(np.tril(np.ones((64, 64), dtype=bool)) | (np.arange(64)[None] == 63), 16,
                             return_block_masks=True)[1]


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(rng, reference, case):
    call, error, match = BAD[case]
    q, k, v, _ = _inputs(rng, 1, 4, 2, 64, 16, "float32")
    with pytest.raises(error, match=match):
        call(q, k, v, AttentionLayout(layouts.causal(4), 16))


def test_readme_example():
    scope = run_readme_example("torch-attention")
    q, k, v, o, o2, S, bs = (scope[n] for n in ("q", "k", "v", "o", "o2", "S", "bs"))
    assert o.shape == q.shape and q.grad is not None and k.grad.shape == k.shape
    # the padded second sequence, query heads 0-1 (key/value head 0)
    sub = [t[1:, :2].detach() for t in (q, k[:, :1], v[:, :1])]
    keep = keep_mask(element_mask(layouts.fixed(S // bs, 4), bs), causal=True, seqlens=[300])
    assert rel_error(o[1:, :2], attention_grads(*sub, keep, 0.125)) < tolerance(o.dtype)
    keep2 = keep_mask(scope["mask"])
    assert rel_error(o2[1:, :2], attention_grads(*sub, keep2, 0.125)) < tolerance(o.dtype)


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_empty_batch(monkeypatch, backend):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    q = torch.randn(0, 2, 32, 16, dtype=torch.float16, requires_grad=True)
    o = attention(q, q, q, AttentionLayout(layouts.causal(2), 16), causal=True)
    o.sum().backward()
    assert o.shape == q.shape and q.grad.shape == q.shape


@pytest.mark.parametrize("form", [list, tuple, np.asarray], ids=["list", "tuple", "numpy"])
def test_lengths_as_plain_ints(rng, reference, form):
    """Lengths given as a list, tuple or numpy array of ints act as the same tensor would."""
    q, k, v, _ = _inputs(rng, 3, 2, 2, 48, 16, "float32")
    lay = layouts.sliding_window(3, 1)
    want = attention(q, k, v, lay, causal=True, seqlens=torch.tensor([48, 17, 0]))
    got = attention(q, k, v, lay, causal=True, seqlens=form([48, 17, 0]))
    assert torch.equal(got, want) and (got[1, :, 17:] == 0).all() and not torch.equal(got, attention(q, k, v, lay))
    with pytest.raises(TypeError, match="seqlens must hold integers"):
        attention(q, k, v, lay, seqlens=form([48.0, 17.5, 0.0]))
    with pytest.raises(ValueError, match="seqlens must have shape \\(3,\\)"):
        attention(q, k, v, lay, seqlens=form([48, 17]))


@pytest.mark.parametrize("length", [2**31, 2**32 + 5, 2**40])
def test_lengths_past_int32_are_clamped(length):
    """Lengths are clamped to 0 .. S before the kernels' int32: 2**32 + 5 once read as 5."""
    gen = torch.Generator().manual_seed(length % 1000)
    q, k, v = (torch.randn(1, 1, 32, 16, generator=gen) for _ in range(3))
    lay = np.tril(np.ones((2, 2)))
    full = attention(q, k, v, lay)
    got = attention(q, k, v, lay, seqlens=torch.tensor([length], dtype=torch.int64))
    assert torch.equal(got, full)


def test_layouts_that_drop_no_block_are_known_as_dense():
    from blocksparse.torch.fused_attention import _dense_kind

    nb = 6
    full, tril = np.ones((2, nb, nb), bool), np.broadcast_to(np.tril(np.ones((nb, nb), bool)), (2, nb, nb))
    assert _dense_kind(full) == "full"
    assert _dense_kind(tril.copy()) == "causal" == _dense_kind(layouts.causal(nb)[None].astype(bool))
    extra = tril.copy()
    extra[1, 0, 4] = True  # a block above the diagonal: causal masking drops it anyway
    assert _dense_kind(extra) == "causal"
    for h, i, j in [(0, 3, 3), (1, 5, 0), (0, 2, 1)]:  # one block on or below the diagonal missing
        holed = tril.copy()
        holed[h, i, j] = False
        assert _dense_kind(holed) is None
    assert _dense_kind(layouts.sliding_window(nb, 1)[None].astype(bool)) is None
    assert AttentionLayout(layouts.causal(nb), 16)._dense == "causal"
    assert AttentionLayout(np.ones((nb, nb)), 16)._dense == "full"
    dense = np.ones((2, nb * 16, nb * 16), bool)
    dense[0, 5, 7] = False  # kept blocks with element masks are not dense
    layout, bm = layouts.from_mask(dense, 16, return_block_masks=True)
    assert AttentionLayout(layout, 16, block_masks=bm)._dense is None


@pytest.mark.parametrize("case", ["ok", "ok-full-causal", "sparse", "causal-layout-not-causal", "cpu", "float32",
                                  "gqa", "seqlens", "traced-raw", "env-off", "reference"])
def test_which_calls_dense_attention_computes(monkeypatch, case):
    """The rule of :func:`_dense_serves`, on stand-ins for CUDA tensors (no GPU here; the GPU tests
    check the values)."""
    from types import SimpleNamespace

    from blocksparse.torch.fused_attention import _dense_serves

    def fake(heads, dtype=torch.bfloat16, cuda=True):
        return SimpleNamespace(is_cuda=cuda, dtype=dtype, shape=(2, heads, 256, 64))

    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference" if case == "reference" else "auto")
    monkeypatch.setenv("BLOCKSPARSE_ATTENTION_SDPA", "off" if case == "env-off" else "auto")
    dense = {"sparse": None, "ok-full-causal": "full"}.get(case, "causal")
    causal = case != "causal-layout-not-causal"
    q = fake(4, torch.float32 if case == "float32" else torch.bfloat16, case != "cpu")
    k = fake(2 if case == "gqa" else 4)
    seqlens = torch.ones(2) if case == "seqlens" else None
    assert _dense_serves(dense, causal, q, k, seqlens, case == "traced-raw") == case.startswith("ok")
    assert _dense_serves("full", False, fake(4), fake(4), None, False) == (case not in ("env-off", "reference"))
