"""Layer-norm kernel logic (segments, both layouts, one-chunk and chunked tiles, edge masks, the
persistent backward and its partial sums) through Triton's interpreter on small shapes, against
float64 references."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.ops.norms.configs import (SPLIT_FWD, SPLIT_FWD_MIN_ELEMENTS, UNALIGNED_TOKEN_TILES,  # noqa: E402
                                           NormConfig, SplitConfig, layer_norm_config, split_backward_config,
                                           split_forward_config)
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch._norms import launch  # noqa: E402
from blocksparse.torch._reduce import sum_rows  # noqa: E402

pytestmark = pytest.mark.interpreter

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: tiles smaller than the segments: several chunks per segment, a partial last chunk
CHUNKED = NormConfig(BN=4, BC=32, num_warps=4, programs_per_sm=1)
#: whole segments, two tokens a tile: programs take several tiles each (one per SM), or one each
PERSISTENT = NormConfig(BN=2, BC=256, num_warps=4, programs_per_sm=1)
PER_TILE = NormConfig(BN=2, BC=256, num_warps=4, programs_per_sm=0)
#: the split forward (three launches) and backward (two): slices of 16 features walked 8 at a time
#: (partial last slices and steps)
SPLIT = SplitConfig(BN=4, R=8, num_warps=4, FS=16, MIN_FS=8, programs_per_sm=0)
CONFIGS = dict(table=None, chunked=CHUNKED, persistent=PERSISTENT, per_tile=PER_TILE, split=SPLIT)
SHAPES = [(7, 96, 1), (1, 200, 4), (10, 80, 2)]


def _run(rng, dtype, axis, n, c, segments, relu, cfg, *, affine=(True, True), offset=0.0):
    """Forward and backward through the launchers; returns (got, reference) pairs by name."""
    t = lambda a: torch.from_numpy(a).to(DTYPES[dtype])  # noqa: E731
    x, g, b, dy = (t(a) for a in ref.draw_layer_norm(rng, n, c, axis, offset))
    g, b = (p if keep else None for p, keep in zip((g, b), affine))
    f64 = lambda a: None if a is None else a.double().numpy()  # noqa: E731
    kw = dict(axis=axis, epsilon=1e-5, relu=relu, segments=segments)
    y_ref = ref.layer_norm(f64(x), f64(g), f64(b), **kw)
    dy = t(ref.relu_safe(f64(dy), y_ref)) if relu else dy
    grads_ref = ref.layer_norm_grad(f64(dy), f64(x), f64(g), f64(b), **kw)
    cs = c // segments
    y, mean, rstd = launch.layer_norm_fwd(x, g, b, cfg=cfg, **kw)  # None: the launcher's table
    del kw["epsilon"]
    dx, dg, db = launch.layer_norm_bwd(dy, x, g, b, mean, rstd, cfg=cfg, **kw)
    assert y.dtype == dx.dtype == x.dtype
    for p, dp in ((g, dg), (b, db)):
        assert (p is None and dp is None) or dp.dtype == p.dtype
    xs = f64(x if axis == 1 else x.t()).reshape(n, segments, cs)
    stats_ref = xs.mean(-1).T, 1 / np.sqrt(xs.var(-1) + 1e-5).T
    return dict(zip(("y", "mean", "rstd", "dx", "dg", "db"),
                    zip((y, mean, rstd, dx, dg, db), (y_ref, *stats_ref, *grads_ref))))


def _check(results, dtype):
    for name, (got, want) in results.items():
        if want is None:
            assert got is None, name
            continue
        bound = tolerance("float32") if name in ("mean", "rstd") else tolerance(dtype)
        assert rel_error(got, want) < bound, name


SHAPE_IDS = [f"n{n}-c{c}-s{s}" for n, c, s in SHAPES]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("n, c, segments", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS)
def test_layer_norm(rng, dtype, axis, n, c, segments, cfg):
    _check(_run(rng, dtype, axis, n, c, segments, False, cfg), dtype)


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("n, c, segments", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS)
def test_fused_relu(rng, axis, n, c, segments, cfg):
    """The relu after the affine; the backward masks by the recomputed output."""
    _check(_run(rng, "float32", axis, n, c, segments, True, cfg), "float32")


@pytest.mark.parametrize("affine", [(True, False), (False, True), (False, False)], ids=["g", "b", "none"])
@pytest.mark.parametrize("cfg", [None, CHUNKED, SPLIT], ids=["table", "chunked", "split"])
@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_without_gain_or_bias(rng, affine, cfg, axis):
    _check(_run(rng, "float32", axis, 9, 48, 3, True, cfg, affine=affine), "float32")


@pytest.mark.parametrize("cfg", [None, CHUNKED, SPLIT], ids=["table", "chunked", "split"])
def test_large_mean(rng, cfg):
    """A mean far from zero: statistics from centred values (chunks merged pairwise).

    With mean 300 and std 2, float32 itself bounds the result to ~eps * 300 / 2 ~ 1e-5 (the mean
    is rounded), while E[x^2] - E[x]^2 would lose ~eps * 300^2 / 4 ~ 1e-3: the bound sits between.
    """
    for name, (got, want) in _run(rng, "float32", 1, 5, 80, 1, False, cfg, offset=300.0).items():
        assert rel_error(got, want) < 1e-4, name


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
def test_strided_activations(rng, axis):
    """The kernels read any strides: a slice of a wider tensor, in either layout."""
    x64, g64, b64, dy64 = ref.draw_layer_norm(rng, 6, 40, axis)
    wide = torch.randn(6, 56) if axis == 1 else torch.randn(40, 20)
    x = wide[:, 8:48] if axis == 1 else wide[:, 4:10]
    x.copy_(torch.from_numpy(x64))
    dy = torch.from_numpy(dy64).float().t().contiguous().t()  # the other memory order
    g, b = torch.from_numpy(g64).float(), torch.from_numpy(b64).float()
    y, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=axis, epsilon=1e-6, relu=False, segments=2)
    dx, dg, db = launch.layer_norm_bwd(dy, x, g, b, mean, rstd, axis=axis, relu=False, segments=2)
    kw = dict(axis=axis, segments=2)
    assert rel_error(y, ref.layer_norm(x64, g64, b64, **kw)) < tolerance("float32")
    for got, want in zip((dx, dg, db), ref.layer_norm_grad(dy64, x64, g64, b64, **kw)):
        assert rel_error(got, want) < tolerance("float32")


def test_long_token_major_segments_take_the_split_backward():
    """``(C, N)`` segments longer than the table's backward tile, loaded as vectors, take the two
    launches; short segments, ``(N, C)`` and unaligned calls the one-launch kernel."""
    for size in (2, 4):
        long = 2 * layer_norm_config(0, 1 << 20, size, backward=True).BC
        assert isinstance(split_backward_config(0, long, size), SplitConfig)
        assert split_backward_config(0, 16, size) is None
        assert split_backward_config(0, long, size, aligned=False) is None
        assert split_backward_config(1, 1 << 16, size) is None


def test_large_token_major_calls_take_the_split_forward():
    """From ``SPLIT_FWD_MIN_ELEMENTS`` tokens x segment features, aligned ``(C, N)`` calls whose
    segments the table's tile chunks take the three launches; smaller, unaligned, one-chunk and
    ``(N, C)`` calls the one-launch kernel."""
    for size in (2, 4):
        least = SPLIT_FWD_MIN_ELEMENTS[size]
        long = 2 * layer_norm_config(0, 1 << 20, size).BC
        assert split_forward_config(0, least // long, long, size) is SPLIT_FWD[size]
        assert split_forward_config(0, least // long - 16, long, size) is None
        assert split_forward_config(0, least // long, long, size, aligned=False) is None
        assert split_forward_config(1, least // long, long, size) is None
        short = layer_norm_config(0, 16, size).BC  # a segment one tile holds: x read once
        assert split_forward_config(0, 2 * least // short, short, size) is None


def test_split_forward_partials_beside_y(rng):
    """Partial statistics that do not fit in ``y`` (one feature a slice, 16-bit) take a buffer of
    their own; the result is the same."""
    tiny = SplitConfig(BN=4, R=1, num_warps=1, FS=1, MIN_FS=1, programs_per_sm=0)
    x64, g64, b64, _ = ref.draw_layer_norm(rng, 7, 12, 0)
    x, g, b = torch.from_numpy(x64).half(), torch.from_numpy(g64).float(), torch.from_numpy(b64).float()
    y, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=0, epsilon=1e-6, relu=False, segments=2, cfg=tiny)
    assert rel_error(y, ref.layer_norm(x.double().numpy(), g64, b64, axis=0, segments=2)) < tolerance("float16")


def test_split_slices_fill_the_gpu():
    """Slices halve until the grid holds ``programs_per_sm`` programs a SM, never below ``MIN_FS``."""
    cfg = SplitConfig(BN=128, R=16, FS=512, MIN_FS=64, programs_per_sm=2)
    assert cfg.slice_features(16384, 8192, 1, 132) == 512      # 128 tiles x 16 slices
    assert cfg.slice_features(16384, 1024, 1, 132) == 256      # 128 x 2 < 264: 128 x 4
    assert cfg.slice_features(4096, 1024, 1, 132) == 64        # 32 x 16 = 512
    assert cfg.slice_features(128, 1024, 1, 132) == 64         # never below MIN_FS
    assert cfg.slice_features(16384, 1024, 4, 132) == 512      # the segments count too
    assert cfg.slice_features(128, 1 << 26, 1, 132) == 1 << 11  # at most 65535 slices (the grid's y)


def test_split_backward_reads_any_strides(rng):
    """The split kernels address activations by strides like the one-launch kernel: a slice of a
    wider ``(C, N)`` tensor, ``dy`` in the other memory order."""
    x64, g64, b64, dy64 = ref.draw_layer_norm(rng, 6, 40, 0)
    x = torch.randn(40, 20)[:, 4:10]
    x.copy_(torch.from_numpy(x64))
    dy = torch.from_numpy(dy64).float().t().contiguous().t()
    g, b = torch.from_numpy(g64).float(), torch.from_numpy(b64).float()
    _, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=0, epsilon=1e-6, relu=False, segments=2)
    got = launch.layer_norm_bwd(dy, x, g, b, mean, rstd, axis=0, relu=False, segments=2, cfg=SPLIT)
    for got, want in zip(got, ref.layer_norm_grad(dy64, x64, g64, b64, axis=0, segments=2)):
        assert rel_error(got, want) < tolerance("float32")


def test_token_tiles_follow_the_alignment():
    """float32 ``(C, N)`` calls whose rows Triton cannot load as vectors (token count, row stride or
    address not a multiple of 16 elements / bytes) take the small unaligned tiles; 16-bit ones keep
    the aligned tile (faster there); ``(N, C)`` ones do not care."""
    wide = torch.empty(8, 4112)
    assert launch._aligned(0, 4096, wide[:, :4096]) and launch._aligned(1, 7, wide[:, :7])
    assert not launch._aligned(0, 4097, torch.empty(8, 4097))
    assert not launch._aligned(0, 4096, wide[:, 1:4097])         # address off by 4 bytes
    assert not launch._aligned(0, 16, torch.empty(8, 24)[:, :16])  # row stride 24
    for backward in (False, True):
        assert layer_norm_config(0, 64, 4, backward, aligned=False) == UNALIGNED_TOKEN_TILES[backward]
        assert layer_norm_config(0, 64, 4, backward) != UNALIGNED_TOKEN_TILES[backward]
        assert layer_norm_config(0, 64, 2, backward, aligned=False) == layer_norm_config(0, 64, 2, backward)


def test_float32_parameters_with_bfloat16_activations(rng):
    x64, g64, b64, dy64 = ref.draw_layer_norm(rng, 5, 32, 1)
    x, dy = (torch.from_numpy(a).bfloat16() for a in (x64, dy64))
    g, b = torch.from_numpy(g64).float(), torch.from_numpy(b64).float()
    y, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=1, epsilon=1e-6, relu=False, segments=1)
    dx, dg, db = launch.layer_norm_bwd(dy, x, g, b, mean, rstd, axis=1, relu=False, segments=1)
    assert (y.dtype, dx.dtype, dg.dtype, db.dtype) == (torch.bfloat16,) * 2 + (torch.float32,) * 2
    x64, dy64 = x.double().numpy(), dy.double().numpy()
    assert rel_error(y, ref.layer_norm(x64, g64, b64)) < tolerance("bfloat16")
    _, dg_ref, db_ref = ref.layer_norm_grad(dy64, x64, g64, b64)
    assert rel_error(dg, dg_ref) < tolerance("float32")
    assert rel_error(db, db_ref) < tolerance("float32")


def test_backward_is_deterministic(rng):
    """Partial sums per program, added in a fixed order: the same bits on every run."""
    x, g, b, dy = (torch.from_numpy(a).float() for a in ref.draw_layer_norm(rng, 37, 24, 1))
    y, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=1, epsilon=1e-6, relu=False, segments=1)
    cfg = NormConfig(BN=2, BC=32, num_warps=4, programs_per_sm=3)
    runs = [launch.layer_norm_bwd(dy, x, g, b, mean, rstd, axis=1, relu=False, segments=1, cfg=cfg)
            for _ in range(2)]
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def test_empty_batch():
    x = torch.empty(0, 16)
    g, b = torch.ones(16), torch.zeros(16)
    y, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=1, epsilon=1e-6, relu=False, segments=1)
    assert y.shape == (0, 16) and mean.shape == (1, 0)
    dx, dg, db = launch.layer_norm_bwd(y, x, g, b, mean, rstd, axis=1, relu=False, segments=1)
    assert dx.shape == (0, 16) and torch.equal(dg, torch.zeros(16)) and torch.equal(db, torch.zeros(16))


@pytest.mark.parametrize("P, M", [(3, 10), (600, 20)], ids=["one-step", "looped"])
def test_sum_rows(rng, P, M):
    """Column sums of partial buffers, one or two at a time, more rows than one step holds."""
    a, b = rng.standard_normal((P, M)), rng.standard_normal((P, M))
    ta, tb = torch.from_numpy(a).float(), torch.from_numpy(b).float()
    sa, sb = sum_rows([(ta, torch.float32), (tb, torch.bfloat16)])
    assert sb.dtype == torch.bfloat16
    assert rel_error(sa, a.sum(0)) < tolerance("float32")
    assert rel_error(sb, b.sum(0)) < tolerance("bfloat16")
    (single,) = sum_rows([(tb, torch.float32)])
    assert rel_error(single, b.sum(0)) < tolerance("float32")


@pytest.mark.parametrize("axis", [1, 0], ids=["NC", "CN"])
@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS)
def test_constant_rows_give_the_bias(rng, axis, cfg):
    """Rows of one value whose float32 sum rounds (3.3 x 100): the mean is corrected to the value, so
    ``x - mean`` is 0 and ``y = b`` exactly even with a tiny epsilon (not ``b +- g``)."""
    n, c = 5, 200
    x = np.full((n, c), 3.3, np.float32)
    x[2] = rng.standard_normal(c)  # one ordinary row beside them
    g = (rng.random(c) + 0.5).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    xt = torch.from_numpy(x if axis == 1 else np.ascontiguousarray(x.T))
    y, mean, _ = launch.layer_norm_fwd(xt, torch.from_numpy(g), torch.from_numpy(b), axis=axis, epsilon=1e-12,
                                       relu=False, segments=2, cfg=cfg)
    y = (y if axis == 1 else y.t()).double().numpy()
    for row in (0, 1, 3, 4):
        np.testing.assert_array_equal(y[row], b.astype(np.float64))
    want = ref.layer_norm(x.astype(np.float64), g.astype(np.float64), b.astype(np.float64), axis=1, segments=2,
                          epsilon=1e-12)
    assert rel_error(y[2], want[2]) < tolerance("float32")
    np.testing.assert_array_equal(mean.double().numpy()[:, 0], np.full(2, np.float32(3.3), np.float64))


@pytest.mark.parametrize("cfg", [None, CHUNKED], ids=["table", "chunked"])
def test_rows_near_the_float32_limit_keep_a_finite_mean(cfg):
    """A first value near float32's largest (3e38) is no shift: ``x - x0`` would overflow; the row
    ``[3e38, -3e38, 0, ...]`` has mean 0 and, with no variance left in float32, ``y = b``."""
    x = torch.zeros(3, 64)
    x[0, 0], x[0, 1] = 3e38, -3e38
    x[1] = torch.arange(64.0)
    x[2] = 3.3
    b = torch.full((64,), 0.5)
    y, mean, _ = launch.layer_norm_fwd(x, None, b, axis=1, epsilon=1e-5, relu=False, segments=1, cfg=cfg)
    assert torch.isfinite(y).all() and mean[0, 0] == 0.0 and mean[0, 2] == np.float32(3.3)
    want = ref.layer_norm(x[1:2].double().numpy(), None, b.double().numpy(), axis=1, epsilon=1e-5)
    assert rel_error(y[1:2], want) < tolerance("float32") and torch.equal(y[2], b)
