"""blocksparse.torch.BlocksparseTransformer on a CUDA GPU: the Triton kernels through the public API
against float64 dense attention, every op against the reference path, torch.compile (inductor).
Skipped without a GPU."""
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import attention as ref  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.torch import BlocksparseTransformer  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _inputs(rng, bst, dtype, head_dim, batch):
    t = lambda shape: torch.from_numpy(rng.standard_normal(shape)).to(DTYPES[dtype]).cuda()  # noqa: E731
    features = bst.heads * head_dim
    return t((batch, bst.ctx_q, features)), t((batch, bst.ctx_k, features)), t((batch, bst.ctx_k, features)), \
        t((batch, bst.ctx_q, features))


def _check(rng, bst, dtype, head_dim, batch=2, autoregress_at_key=None):
    q, k, v, do = _inputs(rng, bst, dtype, head_dim, batch)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    scale = head_dim ** -0.5
    p = bst.masked_softmax(bst.query_key_op(leaves[0], leaves[1]), scale, autoregress_at_key)
    o = bst.weight_value_op(p, leaves[2])
    o.backward(do)
    want = ref.attention(bst.layout, *(x.double().cpu().numpy() for x in (q, k, v, do)), scale, bst.masks,
                         autoregress_at_key)
    for name, got, exp in zip(("o", "dq", "dk", "dv"), (o.detach(), *(x.grad for x in leaves)), want):
        assert got.dtype == DTYPES[dtype] and got.is_cuda
        assert rel_error(got, exp) < 3 * tolerance(dtype), name


@pytest.mark.parametrize("head_dim", [64, 128, 40])
@pytest.mark.parametrize("bs", [16, 32, 64, 128])
def test_bf16_causal(rng, bs, head_dim):
    bst = BlocksparseTransformer(ref.causal_layout(1024 // bs), bs, heads=4, mask_callback=ref.diagonal_causal)
    _check(rng, bst, "bfloat16", head_dim)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("bs", [32, 64])
def test_other_dtypes_per_head_layouts(rng, dtype, bs):
    layout = ref.random_layout(rng, 3, 512 // bs, 768 // bs, 0.3, empty_rows=1)
    bst = BlocksparseTransformer(layout, bs, mask_callback=lambda s, *_: rng.random(s) < 0.9)
    _check(rng, bst, dtype, 64, autoregress_at_key=100)


@pytest.mark.parametrize("bs", [16, 64, 128])
def test_kernels_match_the_reference_path(rng, bs, monkeypatch):
    layout = ref.random_layout(rng, 2, 512 // bs, 512 // bs, 0.4, empty_rows=1)
    bst = BlocksparseTransformer(layout, bs, mask_callback=lambda s, *_: rng.random(s) < 0.7)
    q, k, v, _ = _inputs(rng, bst, "bfloat16", 64, 2)

    def run():
        w = bst.query_key_op(q, k)
        p = bst.masked_softmax(w, 0.125, autoregress_at_key=37)
        return w, p, bst.weight_value_op(p, v), bst.tn_op(p, q)

    kernels = run()
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "reference")
    for name, got, exp in zip(("nt", "softmax", "nn", "tn"), kernels, run()):
        assert rel_error(got, exp) < tolerance("bfloat16"), name


def test_block_size_8_reference_on_gpu(rng):
    _check(rng, BlocksparseTransformer(ref.random_layout(rng, 2, 6, 6, 0.5), 8), "float32", 16)


def test_torch_compile_inductor(rng):
    bst = BlocksparseTransformer(ref.causal_layout(8), 64, heads=4, mask_callback=ref.diagonal_causal)
    q, k, v, _ = _inputs(rng, bst, "bfloat16", 64, 2)

    def attend(q, k, v):
        return bst.weight_value_op(bst.masked_softmax(bst.query_key_op(q, k), 0.125), v)

    torch.testing.assert_close(torch.compile(attend, fullgraph=True)(q, k, v), attend(q, k, v))
