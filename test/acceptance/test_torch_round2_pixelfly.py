"""Second acceptance audit of ``blocksparse.layouts.butterfly`` and ``blocksparse.torch.PixelflyLinear``:
the layout rule of the module docstring re-derived independently (units, overlaps, de-interleaving),
block sizes 1, 3, 48 and 256 against float64 (every impl, autocast), gradient modes, double
backward, ``.to(dtype)``, dynamic ``torch.compile``, the meta device and the ``cost_model`` argument."""
import json
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_setup import poison_empty  # noqa: E402,F401

from blocksparse.dispatch import CostModel, Table  # noqa: E402
from blocksparse.layouts.butterfly import butterfly_layout, default_butterfly_size  # noqa: E402
from blocksparse.torch import PixelflyLinear  # noqa: E402
from torch_acceptance import block_grads, close, dense_weight, draw, f64  # noqa: E402


# ---------------------------------------------------------------------------------------- layouts
def _rule(fin, fout, bs, n, n_factors, stretch):
    """The documented layout, written out loop by loop with exact fractions: block ``(c, k)`` exists
    when a butterfly unit its features touch on each side are joined (``i XOR j`` in ``{0, 2**f}``);
    without ``stretch`` the longer side's lines are then ordered by ``(i % r, i // r)``."""
    joined = {0} | {1 << f for f in range(n_factors)}

    def units(blocks, features):
        width = Fraction(features, n)   # unit u covers features [u * width, (u + 1) * width)
        return [{u for u in range(n) if u * width < (a + 1) * bs and (u + 1) * width > a * bs}
                for a in range(blocks)]

    rows, cols = units(fin // bs, fin), units(fout // bs, fout)
    mask = np.array([[any((u ^ v) in joined for u in r for v in c) for c in cols] for r in rows])
    cb, kb = mask.shape
    if not stretch and cb != kb:
        r = max(cb, kb) // min(cb, kb)
        order = sorted(range(max(cb, kb)), key=lambda i: (i % r, i // r))
        mask = mask[:, order] if kb > cb else mask[order, :]
    return mask


LAYOUT_CASES = [  # in, out, block size, butterfly size, n_factors, stretch
    (64, 64, 8, 4, 2, False), (64, 64, 8, 8, 1, False), (48, 48, 4, 16, 3, False),  # units wider / narrower
    (40, 120, 8, 4, None, False), (40, 120, 8, 4, None, True),                      # rectangles, both ways
    (96, 24, 3, 8, 2, True), (96, 24, 3, 8, 2, False),
    (56, 24, 8, 4, 2, False), (56, 24, 8, 4, 2, True),                              # long side not a multiple
    (7, 7, 1, 8, 3, False),                                                          # block size 1
    (24, 48, 8, 8, 2, False), (24, 48, 8, 8, 2, True),                              # more units than blocks
]


@pytest.mark.parametrize("fin, fout, bs, n, f, stretch", LAYOUT_CASES,
                         ids=[f"{c[0]}x{c[1]}-bs{c[2]}-n{c[3]}-f{c[4]}-{'stretch' if c[5] else 'repeat'}"
                              for c in LAYOUT_CASES])
def test_butterfly_layout_follows_the_documented_rule(fin, fout, bs, n, f, stretch):
    got = butterfly_layout(fin, fout, bs, n, f, stretch=stretch)
    assert got.dtype == bool and got.shape == (fin // bs, fout // bs)
    np.testing.assert_array_equal(got, _rule(fin, fout, bs, n, f or int(np.log2(n)), stretch))


@pytest.mark.parametrize("fin, fout, bs, want", [(384, 1536, 48, 8), (48, 48, 8, 8), (24, 96, 8, 4), (8, 8, 8, 2),
                                                 (40, 200, 8, 8)])
def test_default_butterfly_size_is_the_shorter_side_rounded_up(fin, fout, bs, want):
    assert default_butterfly_size(fin, fout, bs) == want
    np.testing.assert_array_equal(butterfly_layout(fin, fout, bs), butterfly_layout(fin, fout, bs, want, None))
    layer = PixelflyLinear(fin, fout, bs)
    assert (layer.butterfly_size, layer.n_factors) == (want, int(np.log2(want)))


@pytest.mark.parametrize("n, f", [(8, 3), (16, 2), (64, 6)])
def test_each_input_unit_feeds_n_factors_plus_one_output_units(n, f):
    """README: in pixelfly's domain every row and every column holds the same number of blocks.  Here the
    (2n, 2n) square (2 blocks per unit, 2 (f + 1) per line) repeats twice along the outputs."""
    lay = butterfly_layout(4 * n, 8 * n, 2, n, f)
    assert set(lay.sum(1).tolist()) == {4 * (f + 1)} and set(lay.sum(0).tolist()) == {2 * (f + 1)}
    stretched = butterfly_layout(4 * n, 8 * n, 2, n, f, stretch=True)   # 2 blocks per unit in, 4 out
    assert set(stretched.sum(1).tolist()) == {4 * (f + 1)} and set(stretched.sum(0).tolist()) == {2 * (f + 1)}


# ---------------------------------------------------------------------------------------- the layer
def _reference(layer, x):
    """float64 dense ``(in, out)`` matrix of the layer from its parameters and the documented layout."""
    mask = _rule(layer.in_features, layer.out_features, layer.block_size, layer.butterfly_size, layer.n_factors,
                 layer.stretch)
    dense = dense_weight(mask, f64(layer.weight), layer.block_size)
    if layer.lowrank_first is not None:
        dense = dense + f64(layer.lowrank_first).T @ f64(layer.lowrank_second).T
    return mask, dense


def _check(layer, x, rng, dtype=None):
    """Output and every gradient of ``layer(x)`` against float64 (tolerance of ``dtype``, default x's)."""
    dtype = dtype or x.dtype
    x.requires_grad_()
    y = layer(x)
    mask, dense = _reference(layer, x)
    x2 = f64(x).reshape(-1, layer.in_features)
    bias = f64(layer.bias) if layer.bias is not None else 0
    close(y.reshape(-1, layer.out_features), x2 @ dense + bias, dtype)
    dy = draw(rng, tuple(y.shape), y.dtype)
    y.backward(dy)
    dy2 = f64(dy).reshape(-1, layer.out_features)
    close(x.grad.reshape(x2.shape), dy2 @ dense.T, dtype)
    close(layer.weight.grad, block_grads(np.argwhere(mask), x2, dy2, layer.block_size), dtype)
    if layer.bias is not None:
        close(layer.bias.grad, dy2.sum(0), dtype)
    if layer.lowrank_first is not None:  # each gradient is a product of a product: two roundings
        close(layer.lowrank_first.grad, (dy2 @ f64(layer.lowrank_second)).T @ x2, dtype, roundings=2)
        close(layer.lowrank_second.grad, dy2.T @ (x2 @ f64(layer.lowrank_first).T), dtype, roundings=2)
    return y


BLOCK_CASES = {  # id: (in, out, block size, butterfly size, n_factors, lowrank)
    "bs1": (8, 16, 1, 4, None, 2),
    "bs3-stretch": (9, 27, 3, 4, 1, 0),
    "bs48": (96, 192, 48, None, None, 3),
    "bs256": (256, 512, 256, 2, 1, 0),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
@pytest.mark.parametrize("name", list(BLOCK_CASES))
def test_any_block_size_against_float64(rng, name, impl, dtype):
    fin, fout, bs, n, f, r = BLOCK_CASES[name]
    layer = PixelflyLinear(fin, fout, bs, n, f, r, stretch=name.endswith("stretch"), impl=impl, dtype=dtype)
    _check(layer, draw(rng, (2, 3, fin), dtype), rng)


@pytest.mark.parametrize("name", ["bs48", "bs256"])
def test_reference_impl_on_refinable_block_sizes(rng, name):
    fin, fout, bs, n, f, r = BLOCK_CASES[name]
    _check(PixelflyLinear(fin, fout, bs, n, f, r, impl="reference"), draw(rng, (3, fin), torch.float32), rng)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
@pytest.mark.parametrize("name", ["bs1", "bs3-stretch"])
def test_any_block_size_under_autocast(rng, name, impl):
    """CPU autocast to bfloat16: a bfloat16 result within bfloat16's tolerance of the float64 answer."""
    fin, fout, bs, n, f, r = BLOCK_CASES[name]
    layer = PixelflyLinear(fin, fout, bs, n, f, r, stretch=name.endswith("stretch"), impl=impl)
    x = draw(rng, (4, fin), torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = _check(layer, x, rng, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("impl", ["auto", "portable", "dense", "reference"])
def test_without_gradient(rng, impl, mode):
    layer = PixelflyLinear(32, 64, 16, 2, 1, 3, impl=impl)
    x = draw(rng, (5, 32), torch.float32, requires_grad=True)
    with getattr(torch, mode)():
        y = layer(x)
    assert not y.requires_grad
    close(y, f64(x) @ _reference(layer, x)[1] + f64(layer.bias), torch.float32)


@pytest.mark.parametrize("to", ["double", "half", "bfloat16"])
def test_moved_with_to_dtype(rng, to):
    layer = PixelflyLinear(12, 24, 3, lowrank_size=2)
    dtype = {"double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}[to]
    layer = getattr(layer, to)() if to != "bfloat16" else layer.to(dtype)
    assert {p.dtype for p in layer.parameters()} == {dtype}
    _check(layer, draw(rng, (3, 12), dtype), rng)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_double_backward_is_right_or_refused(rng, impl):
    layer = PixelflyLinear(12, 24, 3, lowrank_size=2, impl=impl, dtype=torch.float64)
    x = draw(rng, (4, 12), torch.float64, requires_grad=True)
    y = layer(x)
    try:
        gx, = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        gx.sum().backward()
    except RuntimeError as err:   # the portable path's segment sum has no second derivative in torch
        assert impl == "portable" and "derivative" in str(err)
        return
    mask, dense = _reference(layer, x)
    xn, ones = f64(x), np.ones((4, 12))
    # sum(gx) = 2 sum(y * s), s = column sums of the dense matrix: d/dW = 2 x^T (1 s) + 2 1^T y
    ref = 2 * xn.T @ (ones @ dense) + 2 * ones.T @ (xn @ dense + f64(layer.bias))
    close(layer.weight.grad, np.stack([ref[c * 3:(c + 1) * 3, k * 3:(k + 1) * 3] for c, k in np.argwhere(mask)]),
          torch.float64)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_compiled_with_dynamic_shapes(rng, impl):
    layer = PixelflyLinear(12, 24, 3, lowrank_size=2, impl=impl)
    torch._dynamo.reset()   # one code object for every layer: earlier tests' graphs count to its limit
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=True)
    for n in (3, 8):
        x = draw(rng, (n, 12), torch.float32, requires_grad=True)
        y = compiled(x)
        close(y, f64(x) @ _reference(layer, x)[1] + f64(layer.bias), torch.float32)
        y.backward(torch.ones_like(y))
        close(x.grad, np.ones((n, 24)) @ _reference(layer, x)[1].T, torch.float32)


@pytest.mark.parametrize("impl", ["auto", "portable", "dense"])
def test_on_the_meta_device(impl):
    layer = PixelflyLinear(12, 24, 3, lowrank_size=2, impl=impl, device="meta")
    y = layer(torch.empty(4, 12, device="meta"))
    assert y.is_meta and y.shape == (4, 24)


def test_plans_from_a_given_table(rng, tmp_path):
    layer = PixelflyLinear(12, 24, 3, lowrank_size=2)
    lay = layer.layout
    rows = [{"tokens": 5, "in_features": 12, "out_features": 24, "block_size": 3, "density": float(lay.density),
             "dtype": "float32", "structured": s, "fwd_ms": {"dense": 2.0, "portable": 1.0},
             "fwdbwd_ms": {"dense": 1.0, "portable": 3.0}} for s in (False, True)]
    path = tmp_path / "pixelfly-table.json"
    path.write_text(json.dumps({"format": 1, "framework": "torch", "device": "cpu", "rows": rows}))
    layer = PixelflyLinear(12, 24, 3, lowrank_size=2, cost_model=CostModel(Table.load(path)))
    assert layer.plan(5).impl == "dense" and layer.plan(5, backward=False).impl == "portable"
    assert layer.plan(5).source == "pixelfly-table.json"
    _check(layer, draw(rng, (5, 12), torch.float32), rng)


@pytest.mark.parametrize("bad, words", [("table.json", "str"), (3, "int"), (None, None)], ids=["path", "int", "none"])
def test_cost_model_argument_is_checked(tmp_path, bad, words):
    if words is None:
        assert PixelflyLinear(12, 24, 3, cost_model=bad).plan(4).source != "override"
        return
    with pytest.raises(TypeError, match=f"cost_model must be a blocksparse.dispatch.CostModel or None; got {words}"):
        PixelflyLinear(12, 24, 3, cost_model=bad)


@pytest.mark.parametrize("impl", ["portable", "dense"])
def test_refuses_a_replaced_weight_of_the_wrong_shape(rng, impl):
    layer = PixelflyLinear(12, 24, 3, impl=impl)
    blocks = layer.weight.shape[0]
    layer.weight = torch.nn.Parameter(draw(rng, (blocks + 1, 3, 3), torch.float32))
    with pytest.raises(ValueError, match="weight must have shape"):
        layer(draw(rng, (3, 12), torch.float32))
