"""The persistent Gluon fprop / bprop (:mod:`blocksparse.ops.matmul.xprop_gluon`) on the CPU: its
own source run program by program through :mod:`blocksparse.testing.gluon` (numpy for TMA, mbarriers
and wgmma), against float64 products, with the pipeline's ordering rules checked at every step --
and the stand-ins shown to catch a kernel that breaks them."""
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton.experimental.gluon")

from blocksparse.layout import Layout  # noqa: E402
from blocksparse.ops.matmul import xprop_gluon as gluon_module  # noqa: E402
from blocksparse.ops.matmul.refine import refine  # noqa: E402
from blocksparse.ops.matmul.xprop_gluon import GluonTile, split_empty, xprop_gluon  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing.gluon import PipelineError  # noqa: E402
from blocksparse.testing.matmul import dense_products, random_layout  # noqa: E402


def _run(module, rng, lay, op, tile, n, programs, dtype=torch.bfloat16, bias=True, storage=None, pack=1):
    """``module``'s launcher emulated on one random problem: (output, float64 reference)."""
    coarse = storage or lay
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dtype)  # noqa: E731
    x, dy = t(rng.standard_normal((n, coarse.C))), t(rng.standard_normal((n, coarse.K)))
    w = t(rng.standard_normal(coarse.w_shape) / np.sqrt(coarse.block_size))
    b = t(rng.standard_normal(coarse.K)) if bias and op == "fprop" else None
    y_ref, dx_ref, _ = dense_products(coarse, x.double().numpy(), w.double().numpy(), dy.double().numpy(), 1)
    lut = getattr(lay, op)(None, group=1)
    headers, empty = module.split_empty(torch.from_numpy(lut.headers.copy()), lay.block_size)
    got = module.xprop_gluon(x if op == "fprop" else dy, w, headers, torch.from_numpy(lut.entries.copy()),
                             bs=lay.block_size, trans=op == "bprop", out_features=coarse.K if op == "fprop" else coarse.C,
                             tile=tile, bias=b, empty=empty, programs=programs, pack=pack, emulate=True)
    ref = (y_ref + (b.double().numpy() if b is not None else 0)) if op == "fprop" else dx_ref
    return got, ref


@pytest.mark.parametrize("op", ["fprop", "bprop"])
@pytest.mark.parametrize("bs, tile, n, programs", [
    (32, GluonTile(32, 32, 16, 3, 4), 70, 3),     # two steps an entry, a clipped token tile
    (64, GluonTile(16, 32, 32, 2, 4), 40, 5),     # two output slices a block, the shortest ring
    (64, GluonTile(32, 64, 64, 4, 4), 96, 64),    # more programs than tiles
    (16, GluonTile(16, 16, 16, 5, 4), 33, 2),     # a ring longer than most tiles
], ids=["bs32-BK16", "bs64-slices", "bs64-idle-programs", "bs16-long-ring"])
def test_emulated_against_float64(rng, op, bs, tile, n, programs):
    lay = Layout(random_layout(rng, 4, 5, 0.5, empty_cols=1, empty_rows=1), bs)
    got, ref = _run(gluon_module, rng, lay, op, tile, n, programs)
    assert got.dtype == torch.bfloat16 and rel_error(got, ref) < tolerance(torch.bfloat16)


@pytest.mark.parametrize("op", ["fprop", "bprop"])
def test_emulated_packed_refinement_and_float16(rng, op):
    coarse = Layout(random_layout(rng, 2, 3, 0.6, empty_cols=1), 32)
    fine = refine(coarse, 16, packed=True).layout
    got, ref = _run(gluon_module, rng, fine, op, GluonTile(16, 16, 16, 3, 4), 40, 3, dtype=torch.float16,
                    storage=coarse, pack=2)
    assert got.dtype == torch.float16 and rel_error(got, ref) < tolerance(torch.float16)


def test_split_empty_leaves_out_the_empty_segments():
    headers = torch.tensor([[0, 0, 2, 0], [1, 2, 0, 0], [2, 2, 1, 0]], dtype=torch.int32)
    kept, empty = split_empty(headers, 4)
    assert kept.tolist() == [[0, 0, 2, 0], [2, 2, 1, 0]] and empty.tolist() == [4, 5, 6, 7]
    assert split_empty(kept, 4)[1] is None


#: Kernels with one ordering rule broken: (text of the kernel, replacement, what must be caught).
BROKEN = {
    "product-not-retired": ("acc = warpgroup_mma_wait(0, deps=(acc, ))\n            produced",
                            "acc = warpgroup_mma_wait(1, deps=(acc, ))\n            produced", "while a wgmma"),
    "wrong-phase": ("(consumed // NB) & 1)", "(consumed // NB + 1) & 1)", "never complete"),
    "store-not-awaited": ("tma.store_wait(pendings=0)  # the last", "pass  # the last", "TMA store"),
    "ring-overrun": ("gl.static_range(NB - 1)", "gl.static_range(NB)", None),  # wrong values
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_emulation_catches_a_broken_pipeline(rng, tmp_path, name):
    old, new, message = BROKEN[name]
    source = open(gluon_module.__file__).read()
    assert old in source
    path = tmp_path / f"broken_{name.replace('-', '_')}.py"
    path.write_text(source.replace(old, new).replace("from ...testing.gluon", "from blocksparse.testing.gluon"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    broken = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(broken)
    lay = Layout(random_layout(rng, 3, 4, 0.7), 32)
    if message is None:
        got, ref = _run(broken, rng, lay, "fprop", broken.GluonTile(32, 32, 16, 3, 4), 70, 3)
        assert rel_error(got, ref) > 10 * tolerance(torch.bfloat16)
    else:
        with pytest.raises(PipelineError, match=message):
            _run(broken, rng, lay, "fprop", broken.GluonTile(32, 32, 16, 3, 4), 70, 3)
