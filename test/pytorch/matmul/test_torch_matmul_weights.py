"""The PyTorch ``BlocksparseMatMul``'s initializers and ``l2_normalize``, against float64 numpy."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing.matmul import l2_normalize_dense, random_layout  # noqa: E402
from blocksparse.torch import BlocksparseMatMul  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng()


def _bsmm(rng, cb=4, kb=3, bs=8, **kw):
    layout = random_layout(rng, cb, kb, 0.5)
    layout[:, 0] = 0  # an empty layout column: its features stay zero, never NaN
    layout[0, 1] = 1
    return BlocksparseMatMul(layout, block_size=bs, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("gain_shape", [None, "k", "1k", "k1"])
def test_l2_normalize_against_float64(rng, dtype, gain_shape):
    bsmm = _bsmm(rng)
    w64 = rng.standard_normal(bsmm.w_shape) * rng.uniform(0.5, 3)
    g64 = rng.uniform(0.5, 2, bsmm.K).astype(np.float32).astype(np.float64)  # exact in the gain's dtype
    shape = {"k": (bsmm.K,), "1k": (1, bsmm.K), "k1": (bsmm.K, 1)}.get(gain_shape)
    w = torch.tensor(w64, dtype=dtype, requires_grad=True)
    gain = None if shape is None else torch.tensor(g64.reshape(shape), dtype=torch.float32, requires_grad=True)
    out = bsmm.l2_normalize(w, gain, dtype=dtype)
    assert out.dtype == dtype and tuple(out.shape) == bsmm.w_shape
    want = bsmm.layout.pack(l2_normalize_dense(bsmm.layout.dense(w.detach().double().numpy()),
                                               None if shape is None else g64))
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    np.testing.assert_allclose(out.detach().double().numpy(), want, rtol=tol, atol=tol)
    # gradients: of sum(out * r) against float64 torch autograd on the dense formula
    r = torch.randn(bsmm.w_shape, dtype=torch.float64)
    (out.double() * r).sum().backward()
    w_ref = w.detach().double().requires_grad_()
    g_ref = None if gain is None else torch.tensor(g64, requires_grad=True)
    cols = torch.tensor(bsmm.layout.coords[:, 1], dtype=torch.int64)
    sq = torch.zeros(bsmm.layout.KB, bsmm.block_size, dtype=torch.float64).index_add(0, cols, (w_ref ** 2).sum(1))
    scale = sq.clamp_min(1e-6).rsqrt()
    if g_ref is not None:
        scale = scale * g_ref.view(bsmm.layout.KB, -1)
    (w_ref * scale[cols][:, None, :] * r).sum().backward()
    gtol = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    np.testing.assert_allclose(w.grad.double().numpy(), w_ref.grad.numpy(), rtol=gtol, atol=gtol)
    if gain is not None:
        gtol = max(gtol, 1e-6)  # the gain's gradient comes back in its dtype, float32
        np.testing.assert_allclose(gain.grad.double().numpy().reshape(-1), g_ref.grad.numpy(), rtol=gtol, atol=gtol)


def test_l2_normalize_matches_the_numpy_helper(rng):
    bsmm = _bsmm(rng, cb=3, kb=5, bs=16)
    w = rng.standard_normal(bsmm.w_shape)
    out = bsmm.l2_normalize(torch.tensor(w), epsilon=1e-3, dtype=torch.float64)
    np.testing.assert_allclose(out.numpy(), bsmm.l2_normalize_test(w, epsilon=1e-3), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call, err, words", [
    (lambda b, w: b.l2_normalize(w[:-1]), ValueError, "w must have shape"),
    (lambda b, w: b.l2_normalize(w.numpy()), TypeError, "w must be"),
    (lambda b, w: b.l2_normalize(w, torch.ones(b.K + 1)), ValueError, "gain must have shape (K,)"),
    (lambda b, w: b.l2_normalize(w, torch.ones(2, b.K)), ValueError, "gain must have shape (K,)"),
    (lambda b, w: b.l2_normalize(w, epsilon=0.0), ValueError, "epsilon"),
    (lambda b, w: b.l2_normalize(w, dtype=torch.int32), TypeError, "dtype"),
    (lambda b, w: b.identity_init(gpu="yes"), TypeError, "gpu"),
    (lambda b, w: b.ortho_init()((3, 3)), ValueError, "w_shape"),
    (lambda b, w: b.ortho_init()(dtype=torch.int64), TypeError, "dtype"),
])
def test_bad_arguments(rng, call, err, words):
    bsmm = _bsmm(rng)
    with pytest.raises(err, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(bsmm, torch.randn(bsmm.w_shape))


def test_identity_init(rng):
    bsmm = _bsmm(rng, cb=4, kb=2)
    w = bsmm.identity_init()(bsmm.w_shape, dtype=torch.float64)
    assert w.dtype == torch.float64 and tuple(w.shape) == bsmm.w_shape
    dense = bsmm.layout.dense(w.numpy())
    c, k = np.indices(dense.shape)
    bs = bsmm.block_size
    on = ((c // bs) % bsmm.layout.KB == (k // bs) % bsmm.layout.CB) & (c % bs == k % bs)
    present = np.kron(bsmm.layout.mask != 0, np.ones((bs, bs))) > 0
    np.testing.assert_array_equal(dense, (on & present).astype(float))


@pytest.mark.parametrize("dense_layout", [False, True])
def test_ortho_init(rng, dense_layout):
    layout = np.ones((3, 2)) if dense_layout else random_layout(rng, 6, 3, 0.5)
    bsmm = BlocksparseMatMul(layout, block_size=8)
    np.random.seed(int(rng.integers(1 << 31)))
    state = np.random.get_state()
    w = bsmm.ortho_init()(dtype=torch.float64)
    np.random.set_state(state)
    assert torch.equal(w, bsmm.ortho_init()(dtype=torch.float64))  # seeded by numpy's global generator
    dense = bsmm.layout.dense(w.numpy())
    if dense_layout:  # C >= K: orthonormal columns
        np.testing.assert_allclose(dense.T @ dense, np.eye(bsmm.K), atol=1e-5)
    else:
        for k in range(bsmm.layout.KB):
            cols = dense[:, k * 8:(k + 1) * 8]
            if bsmm.layout.mask[:, k].any():
                np.testing.assert_allclose(cols.T @ cols, np.eye(8), atol=1e-5)
    # it initialises a weight that the product takes
    y = bsmm(torch.randn(5, bsmm.C, dtype=torch.float64), w)
    assert torch.isfinite(y).all()
