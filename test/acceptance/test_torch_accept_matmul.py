"""Acceptance tests of ``blocksparse.torch.BlocksparseMatMul`` as README documents it: both feature
axes, ``__call__(x, w)``, the shape helpers and attributes, every dtype, edge cases and bad input."""
import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_setup import poison_empty  # noqa: E402,F401  (NaN-filled torch.empty; sets TRITON_INTERPRET on CPU)

from blocksparse.torch import BlocksparseMatMul  # noqa: E402
from blocksparse.testing.matmul import random_layout  # noqa: E402
from torch_acceptance import DTYPES, block_grads, close, dense_from_coords, draw, f64  # noqa: E402


def _layout(rng, cb=3, kb=2):
    return random_layout(rng, cb, kb, 0.6, cover=True)


def _check(bsmm, x, w, dtype, rng, need=(True, True)):
    """Forward and gradients of ``bsmm(x, w)`` against float64 numpy, ``x`` in its own layout."""
    x.requires_grad_(need[0])
    w.requires_grad_(need[1])
    y = bsmm(x, w)
    assert y.dtype == dtype and tuple(y.shape) == bsmm.o_shape(x.shape[1 - bsmm.axis])
    coords = [bsmm.block_coord(b) for b in range(bsmm.blocks)]
    dense = dense_from_coords(coords, f64(w), bsmm.block_size, bsmm.C, bsmm.K)
    xn = f64(x) if bsmm.axis == 1 else f64(x).T                                 # (N, C)
    close(y if bsmm.axis == 1 else y.t(), xn @ dense, dtype)
    dy = draw(rng, tuple(y.shape), dtype)
    y.backward(dy)
    dyn = f64(dy) if bsmm.axis == 1 else f64(dy).T
    if need[0]:
        close(x.grad if bsmm.axis == 1 else x.grad.t(), dyn @ dense.T, dtype)
    else:
        assert x.grad is None
    if need[1]:
        assert w.grad.dtype == w.dtype
        close(w.grad, block_grads(coords, xn, dyn, bsmm.block_size), dtype)
    else:
        assert w.grad is None


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("n", [1, 7, 0], ids=["N1", "N7", "N0"])
def test_values_and_gradients(rng, axis, dtype, n):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8, feature_axis=axis)
    x = draw(rng, bsmm.i_shape(n), dtype)
    w = draw(rng, bsmm.w_shape, dtype)
    _check(bsmm, x, w, dtype, rng)


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_positional_constructor_z_order_and_block_16(rng, axis):
    bsmm = BlocksparseMatMul(_layout(rng, 2, 3), 16, axis, z_order=True)
    assert bsmm.block_size == 16 and bsmm.axis == axis
    _check(bsmm, draw(rng, bsmm.i_shape(5), torch.float32), draw(rng, bsmm.w_shape, torch.float32), torch.float32,
           rng)


@pytest.mark.parametrize("need", [(True, False), (False, True)], ids=["x-only", "w-only"])
def test_gradient_of_one_input(rng, need):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8)
    _check(bsmm, draw(rng, (4, bsmm.C), torch.float32), draw(rng, bsmm.w_shape, torch.float32), torch.float32,
           rng, need)


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_transposed_and_strided_inputs(rng, axis):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8, feature_axis=axis)
    shape = bsmm.i_shape(6)
    x = draw(rng, shape[::-1], torch.float32).t()                      # transposed view
    assert not x.is_contiguous()
    _check(bsmm, x.detach(), draw(rng, bsmm.w_shape, torch.float32), torch.float32, rng)
    wide = draw(rng, (shape[0], 2 * shape[1]), torch.float32)[:, ::2]  # every other column
    _check(bsmm, wide.detach(), draw(rng, bsmm.w_shape, torch.float32), torch.float32, rng)


def test_shape_helpers_and_attributes(rng):
    mask = _layout(rng, 3, 2)
    bsmm = BlocksparseMatMul(mask, block_size=16)
    blocks = int(mask.astype(bool).sum())
    assert bsmm.w_shape == (blocks, 16, 16)
    assert (bsmm.blocks, bsmm.C, bsmm.K, bsmm.block_size) == (blocks, 48, 32, 16)
    assert tuple(bsmm.i_shape(5)) == (5, 48) and tuple(bsmm.o_shape(5)) == (5, 32)
    cn = BlocksparseMatMul(mask, block_size=16, feature_axis=0)
    assert tuple(cn.i_shape(5)) == (48, 5) and tuple(cn.o_shape(None)) == (32, None)
    coords = sorted(bsmm.block_coord(b) for b in range(blocks))
    assert coords == sorted(map(tuple, np.argwhere(mask).tolist()))
    np.testing.assert_array_equal(np.asarray(bsmm.layout.mask, dtype=bool), mask.astype(bool))


def test_weight_shared_by_two_calls(rng):
    """One weight used twice in one graph (and two objects sharing a layout): gradients add up."""
    mask = _layout(rng, 2, 2)
    bsmm = BlocksparseMatMul(mask, block_size=8)
    other = BlocksparseMatMul(mask, block_size=8)
    x = draw(rng, (5, 16), torch.float64, requires_grad=True)
    w = draw(rng, bsmm.w_shape, torch.float64, requires_grad=True)
    y = other(bsmm(x, w), w)
    dy = draw(rng, (5, 16), torch.float64)
    y.backward(dy)
    dense = torch.tensor(dense_from_coords([bsmm.block_coord(b) for b in range(bsmm.blocks)], f64(w), 8, 16, 16),
                         requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    (x_ref @ dense @ dense).backward(dy)
    close(y, f64(x_ref @ dense @ dense), torch.float64)
    close(x.grad, f64(x_ref.grad), torch.float64)
    coords = [bsmm.block_coord(b) for b in range(bsmm.blocks)]
    dw_ref = np.stack([f64(dense.grad)[c * 8:(c + 1) * 8, k * 8:(k + 1) * 8] for c, k in coords])
    close(w.grad, dw_ref, torch.float64)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_pickle_and_deepcopy(rng, how):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8, feature_axis=0)
    twin = pickle.loads(pickle.dumps(bsmm)) if how == "pickle" else copy.deepcopy(bsmm)
    x, w = draw(rng, bsmm.i_shape(3), torch.float32), draw(rng, bsmm.w_shape, torch.float32)
    assert (twin.w_shape, twin.axis) == (bsmm.w_shape, bsmm.axis)
    torch.testing.assert_close(twin(x, w), bsmm(x, w), rtol=0, atol=0)


def test_torch_compile_fullgraph(rng):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8)
    fn = torch.compile(lambda a, b: bsmm(a, b).square().sum(), fullgraph=True, backend="aot_eager")
    x = draw(rng, (4, bsmm.C), torch.float32, requires_grad=True)
    w = draw(rng, bsmm.w_shape, torch.float32, requires_grad=True)
    fn(x, w).backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    bsmm(x2, w2).square().sum().backward()
    close(x.grad, f64(x2.grad), torch.float32)
    close(w.grad, f64(w2.grad), torch.float32)


def test_autocast_cpu_bfloat16(rng):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8)
    x = draw(rng, (5, bsmm.C), torch.float32, requires_grad=True)
    w = draw(rng, bsmm.w_shape, torch.float32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = bsmm(x, w)
    assert y.dtype == torch.bfloat16
    coords = [bsmm.block_coord(b) for b in range(bsmm.blocks)]
    xb, wb = f64(x.to(torch.bfloat16)), f64(w.to(torch.bfloat16))
    close(y, xb @ dense_from_coords(coords, wb, 8, bsmm.C, bsmm.K), torch.bfloat16)
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


def test_vmap_is_correct_or_refused(rng):
    """``torch.func.vmap`` either gives the per-sample products or raises an error naming vmap."""
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8)
    x = draw(rng, (3, 4, bsmm.C), torch.float32)
    w = draw(rng, bsmm.w_shape, torch.float32)
    try:
        y = torch.func.vmap(lambda t: bsmm(t, w))(x)
    except RuntimeError as exc:
        assert "vmap" in str(exc)
        return
    close(y, np.stack([f64(bsmm(t, w)) for t in x]), torch.float32)


@pytest.mark.interpreter
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("n", [5, 0], ids=["N5", "N0"])
def test_triton_kernels_tiny(rng, monkeypatch, axis, n):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bsmm = BlocksparseMatMul(_layout(rng, 2, 2), block_size=16, feature_axis=axis)
    _check(bsmm, draw(rng, bsmm.i_shape(n), torch.float32), draw(rng, bsmm.w_shape, torch.float32), torch.float32,
           rng)


# ---------------------------------------------------------------------------------------- bad input
def _bad_calls():
    f32 = torch.float32
    return [
        ("x-3d", lambda b: (torch.zeros(2, 3, b.C), torch.zeros(b.w_shape)), ValueError, "x must be 2-D"),
        ("x-features", lambda b: (torch.zeros(3, b.C + 1), torch.zeros(b.w_shape)), ValueError,
         f"x must have .* features"),
        ("w-shape", lambda b: (torch.zeros(3, b.C), torch.zeros(b.blocks + 1, 8, 8)), ValueError, "w must have shape"),
        ("x-int", lambda b: (torch.zeros(3, b.C, dtype=torch.int32), torch.zeros(b.w_shape)), TypeError,
         "x must be floating point"),
        ("x-numpy", lambda b: (np.zeros((3, b.C)), torch.zeros(b.w_shape)), TypeError, "x must be a torch.Tensor"),
        ("w-list", lambda b: (torch.zeros(3, b.C), [0.0]), TypeError, "w must be a torch.Tensor"),
        ("dtype-mismatch", lambda b: (torch.zeros(3, b.C, dtype=torch.float16), torch.zeros(b.w_shape, dtype=f32)),
         TypeError, "same dtype"),
        ("device-mismatch", lambda b: (torch.zeros(3, b.C, device="meta"), torch.zeros(b.w_shape)), ValueError,
         "one device"),
    ]


@pytest.mark.parametrize("make, err, words", [c[1:] for c in _bad_calls()], ids=[c[0] for c in _bad_calls()])
def test_bad_calls(rng, make, err, words):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8)
    with pytest.raises(err, match=words):
        bsmm(*make(bsmm))


@pytest.mark.parametrize("kwargs, err, words", [
    ({"block_size": 12}, ValueError, "block_size"),
    ({"block_size": 8.0}, TypeError, "block_size"),
    ({"feature_axis": 2}, ValueError, "feature_axis"),
    ({"layout": np.zeros((2, 2))}, ValueError, "layout"),
    ({"layout": np.ones(4)}, ValueError, "layout"),
], ids=["block-size-12", "block-size-float", "feature-axis-2", "empty-layout", "1d-layout"])
def test_bad_constructor_args(kwargs, err, words):
    args = {"layout": np.ones((2, 2)), "block_size": 8, **kwargs}
    with pytest.raises(err, match=words):
        BlocksparseMatMul(**args)


def test_block_coord_out_of_range(rng):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8)
    for bad in (-1, bsmm.blocks):
        with pytest.raises(ValueError, match="block must be in"):
            bsmm.block_coord(bad)


def test_layout_object_and_keyword_options(rng):
    from blocksparse.layout import Layout

    mask = _layout(rng)
    lay = Layout(mask, 8)
    bsmm = BlocksparseMatMul(lay, block_size=8, feature_axis=1, allow_tf32=True)
    assert bsmm.layout is lay and bsmm.allow_tf32
    _check(bsmm, draw(rng, (3, bsmm.C), torch.float32), draw(rng, bsmm.w_shape, torch.float32), torch.float32, rng)
    with pytest.raises(ValueError, match="block_size must match the Layout's block size 8; got 16"):
        BlocksparseMatMul(lay, block_size=16)


def test_autocast_leaves_float64_alone(rng):
    bsmm = BlocksparseMatMul(_layout(rng), block_size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _check(bsmm, draw(rng, (3, bsmm.C), torch.float64), draw(rng, bsmm.w_shape, torch.float64), torch.float64,
               rng)


@pytest.mark.interpreter
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_triton_kernels_tiny_half_transposed(rng, monkeypatch, axis, dtype):
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", "triton")
    bsmm = BlocksparseMatMul(_layout(rng, 2, 2), block_size=16, feature_axis=axis)
    x = draw(rng, bsmm.i_shape(6)[::-1], dtype).t()
    w = draw(rng, bsmm.w_shape, dtype).transpose(1, 2)
    _check(bsmm, x.detach(), w.detach(), dtype, rng)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_torch_func_transforms(rng, monkeypatch, backend, axis):
    """vmap, grad and jvp of the matmul (the kernels cannot take batched tensors: the transforms
    run the dense product of the blocks) against per-sample products and float64 formulas."""
    monkeypatch.setenv("BLOCKSPARSE_BACKEND", backend)
    bsmm = BlocksparseMatMul(_layout(rng, 2, 3), block_size=16, feature_axis=axis)
    coords = [bsmm.block_coord(b) for b in range(bsmm.blocks)]
    w = draw(rng, bsmm.w_shape, torch.float64)
    dense = torch.from_numpy(dense_from_coords(coords, w.numpy(), 16, bsmm.C, bsmm.K))
    nc = lambda t: t if axis == 1 else t.t()  # noqa: E731  (N, C) views
    xs = draw(rng, (4,) + tuple(bsmm.i_shape(3)), torch.float64)
    got = torch.func.vmap(lambda t: bsmm(t, w))(xs)
    close(got, torch.stack([nc(nc(x) @ dense) for x in xs]), torch.float64)
    dw = torch.func.grad(lambda v: bsmm(xs[0], v).square().sum())(w)
    x0 = nc(xs[0]).numpy()
    close(dw, block_grads(coords, x0, 2 * x0 @ dense.numpy(), 16), torch.float64)
    tangent = torch.randn_like(xs[0])
    _, dy = torch.func.jvp(lambda t: bsmm(t, w), (xs[0],), (tangent,))
    close(dy, nc(nc(tangent) @ dense), torch.float64)
    # forward-mode tangents of torch.autograd.forward_ad (dual tensors, no transform): carried, not dropped
    import torch.autograd.forward_ad as fwad
    w_tangent = torch.randn_like(w)
    dense_tangent = torch.from_numpy(dense_from_coords(coords, w_tangent.numpy(), 16, bsmm.C, bsmm.K))
    for needs_grad in (False, True):
        with fwad.dual_level():
            y = bsmm(fwad.make_dual(xs[0].clone().requires_grad_(needs_grad), tangent), fwad.make_dual(w, w_tangent))
            dy = fwad.unpack_dual(y).tangent
        assert dy is not None
        close(dy, nc(nc(tangent) @ dense + nc(xs[0]) @ dense_tangent), torch.float64)
