"""The transformer kernels (nt / nn / tn, softmax and its gradient) through Triton's interpreter on
small shapes, launched directly, against the float64 references; outputs are NaN-poisoned."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.ops.transformer.lut import AttentionLayout  # noqa: E402
from blocksparse.testing import attention as ref  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.torch._transformer import launch  # noqa: E402
from blocksparse.torch._transformer import state as _state  # noqa: E402

pytestmark = pytest.mark.interpreter

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# (heads, shared layout, QB, KB, block size, head_dim): head_dim 136 walks two slices of 128
CASES = {
    "bs16-per-head-d24": (2, False, 4, 3, 16, 24),
    "bs32-shared-d16": (3, True, 2, 3, 32, 16),
    "bs16-d136": (1, False, 2, 2, 16, 136),
}


def _setup(rng, case, masked=False):
    heads, shared, QB, KB, bs, d = CASES[case]
    mask = ref.random_layout(rng, 1 if shared else heads, QB, KB, 0.5, empty_rows=1)
    lay = AttentionLayout(mask[0] if shared else mask, bs, heads=heads)
    masks = lay.block_masks(lambda s, *_: rng.random(s) < 0.6) if masked else None
    return lay, masks, _state.state(_state.handle(lay, masks, lay)).tables(torch.device("cpu")), d


def _t(rng, shape, dtype):
    return torch.from_numpy(rng.standard_normal(shape)).to(DTYPES[dtype])


def _np(t):
    return t.double().numpy()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_products(rng, case, dtype):
    lay, _, tables, d = _setup(rng, case)
    n = 2
    a = _t(rng, (n, lay.ctx_q, lay.heads * d), dtype)
    b = _t(rng, (n, lay.ctx_k, lay.heads * d), dtype)
    w = _t(rng, (n, lay.heads, lay.blocks, lay.block_size, lay.block_size), dtype)
    kw = dict(heads=lay.heads, lut_heads=lay.lut_heads, bs=lay.block_size, precision="ieee")
    got = {
        "nt": launch.nt(a, b, tables, blocks=lay.blocks, **kw),
        "nn": launch.xn(w, b, tables, trans=False, out_ctx=lay.ctx_q, **kw),
        "tn": launch.xn(w, a, tables, trans=True, out_ctx=lay.ctx_k, **kw),
    }
    want = {"nt": ref.nt(lay, _np(a), _np(b)), "nn": ref.nn(lay, _np(w), _np(b)), "tn": ref.tn(lay, _np(w), _np(a))}
    for name in got:
        assert got[name].dtype == DTYPES[dtype], name
        assert rel_error(got[name], want[name]) < tolerance(dtype), name


def test_products_strided_activations(rng):
    """Activations that are slices of a wider tensor (features of q, k, v packed side by side)."""
    lay, _, tables, d = _setup(rng, "bs16-per-head-d24")
    qkv = _t(rng, (2, lay.ctx_q, 3 * lay.heads * d), "float32")
    q, k = qkv[..., :lay.heads * d], qkv[..., lay.heads * d:2 * lay.heads * d]
    kw = dict(heads=lay.heads, lut_heads=lay.lut_heads, bs=lay.block_size, precision="ieee")
    got = launch.nt(q, k[:, :lay.ctx_k], tables, blocks=lay.blocks, **kw)
    assert rel_error(got, ref.nt(lay, _np(q), _np(k[:, :lay.ctx_k]))) < tolerance("float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked, autoregress", [(False, None), (True, None), (True, 5), (False, 0)],
                         ids=["plain", "masked", "masked-ar5", "causal"])
def test_softmax_and_grad(rng, dtype, masked, autoregress):
    lay, masks, tables, _ = _setup(rng, "bs16-per-head-d24", masked)
    shape = (2, lay.heads, lay.blocks, lay.block_size, lay.block_size)
    x, dy = (_t(rng, shape, dtype) * 3 for _ in range(2))
    kw = dict(lut_heads=lay.lut_heads, q_blocks=lay.QB)
    y = launch.softmax(x, tables, scale=0.4, autoregress_at_key=autoregress, masked=masked, dtype=x.dtype, **kw)
    y_ref = ref.softmax(lay, _np(x), 0.4, masks, autoregress)
    assert rel_error(y, y_ref) < tolerance(dtype)
    dx = launch.softmax_grad(dy, y, tables, scale=0.4, dtype=torch.float32, **kw)
    assert dx.dtype == torch.float32
    assert rel_error(dx, ref.softmax_grad(lay, _np(dy), _np(y), 0.4)) < tolerance(dtype)


def test_softmax_rows_that_keep_nothing(rng):
    """Empty layout rows, whole blocks masked out, and rows the autoregressive rule empties: zeros."""
    lay, _, _, _ = _setup(rng, "bs16-per-head-d24")
    masks = lay.block_masks(lambda s, h, q, k, b: np.zeros(s) if b % 2 else np.triu(np.ones(s), 1))
    tables = _state.state(_state.handle(lay, masks, lay)).tables(torch.device("cpu"))
    x = _t(rng, (1, lay.heads, lay.blocks, 16, 16), "float32")
    y = launch.softmax(x, tables, scale=1.0, autoregress_at_key=None, masked=True, dtype=x.dtype,
                       lut_heads=lay.lut_heads, q_blocks=lay.QB)
    y_ref = ref.softmax(lay, _np(x), 1.0, masks)
    assert torch.isfinite(y).all() and rel_error(y, y_ref) < tolerance("float32")
    assert (ref.unpack(lay, y_ref).sum(axis=-1) == 0).any()  # the case really has empty rows


def test_too_many_program_rows(rng):
    """CUDA grids allow 65535 program rows (batch * heads): a clear error instead of a failed launch."""
    lay, _, tables, _ = _setup(rng, "bs16-per-head-d24")
    a = torch.zeros(65536 // lay.heads + 1, lay.ctx_q, lay.heads)
    with pytest.raises(ValueError, match="at most 65535 batch \\* heads"):
        launch.nt(a, a[:, :lay.ctx_k], tables, heads=lay.heads, lut_heads=lay.lut_heads, blocks=lay.blocks,
                  bs=lay.block_size, precision="ieee")
