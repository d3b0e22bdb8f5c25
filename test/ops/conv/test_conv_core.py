"""The convolution family's numpy core: BCK validation, geometry, edge patterns, the grouped plan;
and the float64 reference itself, pinned against PyTorch's float64 convolutions."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from blocksparse.ops.conv import ConvSpec
from blocksparse.ops.conv.blocks import ConvBlocks, parse_bck
from blocksparse.ops.conv.geometry import make_geometry
from blocksparse.ops.conv.grouping import grouped_plan, worth_grouping
from blocksparse.testing.conv import Case, conv_products, edge_patterns, random_bck

BCK4 = [([0, 1], [0, 1]), ([2, 3], [2, 3])]

# (TRS, DHW, strides, dilates, padding) -> output size, worked out by hand from the documented rules
CONV_SIZES = [
    pytest.param((3,), (9,), 2, 1, "SAME", (5,), id="1d-same-stride2"),
    pytest.param((3, 3), (6, 5), (2, 1), (1, 2), "SAME", (3, 5), id="2d-same-stride-dilate"),
    pytest.param((2, 3), (6, 5), 1, 1, "SAME", (6, 5), id="2d-same-even-filter"),
    pytest.param((3, 2), (7, 6), 2, (2, 1), "VALID", (2, 3), id="2d-valid-stride-dilate"),
    pytest.param((3, 3), (5, 6), (2, 1), 1, ((2, 0), 1), (3, 6), id="2d-explicit-asymmetric"),
    pytest.param((1, 1, 3), (1, 1, 32), (1, 1, 2), (1, 1, 1), "SAME", (1, 1, 16), id="original-3tuple-1d"),
    pytest.param((5,), (10,), (1, 1, 1), (1, 1, 1), "SAME", (10,), id="1d-3tuple-defaults"),
    pytest.param((3, 3), (8, 8), (2, 2, 2), (3, 1, 1), (0, 1, 1), (4, 4), id="2d-3tuples-absent-axis-ignored"),
    pytest.param((3, 3, 3), (4, 5, 6), 1, 1, (1, 0, 2), (4, 3, 8), id="3d-explicit"),
    pytest.param((1, 1), (5, 5), 2, 1, 1, (4, 4), id="1x1-padded"),
]
DECONV_SIZES = [
    pytest.param((3,), (9,), 2, 1, "SAME", (18,), id="1d-same-stride2"),
    pytest.param((3, 2), (7, 6), 2, (2, 1), "VALID", (17, 12), id="2d-valid-stride-dilate"),
    pytest.param((4,), (8,), 2, 1, 1, (16,), id="k4-s2-p1-upsample"),
    pytest.param((3,), (5,), 1, 1, "VALID", (7,), id="1d-valid"),
    pytest.param((3, 3), (4, 4), 1, 1, "SAME", (4, 4), id="2d-same"),
]


@pytest.mark.parametrize("TRS, DHW, strides, dilates, padding, MPQ", CONV_SIZES)
def test_conv_output_size(TRS, DHW, strides, dilates, padding, MPQ):
    g = make_geometry(TRS, DHW, None, strides, dilates, padding)
    assert g.MPQ == MPQ and g.DHW == DHW and g.TRS == TRS
    assert make_geometry(TRS, DHW, MPQ, strides, dilates, padding).MPQ == MPQ  # a matching MPQ is fine


@pytest.mark.parametrize("TRS, DHW, strides, dilates, padding, MPQ", DECONV_SIZES)
def test_deconv_default_output_size(TRS, DHW, strides, dilates, padding, MPQ):
    g = make_geometry(TRS, DHW, None, strides, dilates, padding, transposed=True)
    assert g.MPQ == MPQ and g.DHW == DHW
    # the forward convolution of the output brings the input size back
    assert make_geometry(TRS, MPQ, None, strides, dilates, padding).MPQ == DHW


def test_same_padding_amounts():
    g = make_geometry((3, 2, 3), (8, 8, 8), None, (2, 1, 1), (1, 1, 2), "SAME")
    assert g.pads == ((1, 0), (0, 1), (2, 2))   # stride 2: the last window stops short of the end


@pytest.mark.parametrize("padding", [((0, 0), (1, 2), (2, 1)), [[0, 0], [1, 2], [2, 1]], [0, [1, 2], (2, 1)],
                                     [[1, 2], [2, 1]]], ids=["tuples", "lists", "mixed", "two-lists"])
def test_explicit_pairs_as_lists_or_tuples(padding):
    """A 2-D convolution takes (before, after) pairs as lists too, with a neutral leading entry."""
    assert make_geometry((3, 3), (5, 5), None, 1, 1, padding).pads == ((1, 2), (2, 1))


def test_deconv_mpq_resolves_strided_sizes():
    for mpq in (7, 8):
        assert make_geometry((3,), (4,), (mpq,), 2, 1, "SAME", transposed=True).MPQ == (mpq,)
    with pytest.raises(ValueError, match=r"MPQ\[0\] must be in \[7, 8\].*got 9"):
        make_geometry((3,), (4,), (9,), 2, 1, "SAME", transposed=True)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(TRS=(3, 3), DHW=(5,)), ValueError, "DHW must have as many dimensions as TRS"),
    (dict(TRS=(3, 3, 3, 3), DHW=(5, 5, 5, 5)), ValueError, "TRS must have 1 to 3 dimensions"),
    (dict(TRS=(0,), DHW=(5,)), ValueError, "TRS must hold sizes >= 1"),
    (dict(TRS=(3.0,), DHW=(5,)), TypeError, "TRS must hold ints"),
    (dict(TRS=3, DHW=(5,)), TypeError, "TRS must be a tuple"),
    (dict(TRS=(3,), DHW=(5,), padding="FULL"), ValueError, "padding must be 'SAME', 'VALID'"),
    (dict(TRS=(3,), DHW=(5,), padding=(-1,)), ValueError, "padding must be >= 0"),
    (dict(TRS=(3, 3), DHW=(5, 5), padding=(1, 1, 1)), ValueError, "leading 1 must be 0"),
    (dict(TRS=(3, 3), DHW=(5, 5), strides=(1, 2, 2, 2)), ValueError, "strides must have 2 entries"),
    (dict(TRS=(3, 3), DHW=(5, 5), strides=(0, 2, 2)), ValueError, "strides must be >= 1"),
    (dict(TRS=(3,), DHW=(5,), strides=0), ValueError, "strides must be >= 1"),
    (dict(TRS=(3,), DHW=(5,), dilates=(1.5,)), TypeError, "dilates must be an int"),
    (dict(TRS=(5,), DHW=(3,), padding="VALID"), ValueError, "smaller than the dilated filter"),
    (dict(TRS=(3,), DHW=(8,), MPQ=(5,)), ValueError, r"MPQ\[0\] must be 8"),
    (dict(TRS=(3,), DHW=(8,), MPQ=(0,)), ValueError, "MPQ must hold sizes >= 1"),
    (dict(TRS=(3,), DHW=(10**30,)), ValueError, "DHW must hold sizes <= 2\\*\\*31 - 1"),
    (dict(TRS=(3,), DHW=(8,), strides=10**30), ValueError, "strides must be <= 2\\*\\*31 - 1"),
    (dict(TRS=(3,), DHW=(8,), dilates=(2**31,)), ValueError, "dilates must be <= 2\\*\\*31 - 1"),
    (dict(TRS=(3,), DHW=(8,), padding=10**30), ValueError, "padding must be <= 2\\*\\*31 - 1"),
    (dict(TRS=(3,), DHW=(4,), padding=3, transposed=True), ValueError, "smaller than the dilated filter"),
])
def test_bad_geometry(kwargs, error, match):
    with pytest.raises(error, match=match):
        make_geometry(**kwargs)


@pytest.mark.parametrize("BCK, error, match", [
    pytest.param([([0, -1], [0])], ValueError, r"BCK\[0\]\[0\].*out-of-range channel index -1", id="negative-c"),
    pytest.param([([0], [0]), ([1], [-3])], ValueError, r"BCK\[1\]\[1\].*out-of-range", id="negative-k"),
    pytest.param([([0, 1], [0]), ([0, 1], [0])], ValueError, "blocks 0 and 1 are the same block", id="duplicate-block"),
    pytest.param([([1, 0], [2]), ([0, 1], [2])], ValueError, "same block", id="duplicate-block-reordered"),
    pytest.param([([0, 1], [0, 1]), ([1, 2], [1, 2])], ValueError,
                 "blocks 0 and 1 both connect input channel 1 to output channel 1", id="overlapping-pair"),
    pytest.param([([], [0])], ValueError, r"BCK\[0\]\[0\].*is empty", id="empty-c"),
    pytest.param([([0], [0]), ([1], [])], ValueError, r"BCK\[1\]\[1\].*is empty", id="empty-k"),
    pytest.param([([0, 0], [1])], ValueError, "lists channel 0 twice", id="repeated-channel"),
    pytest.param([], ValueError, "at least one block", id="no-blocks"),
    pytest.param([([0], [1], [2])], TypeError, r"BCK\[0\] must be a pair", id="triple"),
    pytest.param([([0.5], [1])], TypeError, "sequence of ints", id="float-index"),
    pytest.param([([True], [1])], TypeError, "sequence of ints", id="bool-index"),
    pytest.param([([0, True], [1])], TypeError, "sequence of ints", id="bool-among-ints"),
    pytest.param([([0], [np.bool_(True)])], TypeError, r"BCK\[0\]\[1\].*sequence of ints", id="numpy-bool-among-ints"),
    pytest.param([(np.array([0, 1], dtype=bool), [1])], TypeError, "sequence of ints", id="bool-array"),
    pytest.param([(np.array([2 ** 63], dtype=np.uint64), [0])], ValueError,
                 "out-of-range channel index 9223372036854775808", id="uint64-index-reported-as-given"),
    pytest.param([([0, 2 ** 70], [0])], ValueError, f"out-of-range channel index {2 ** 70}", id="huge-python-int"),
    pytest.param([(0, [1])], TypeError, "sequence of ints", id="scalar-list"),
    pytest.param("blocks", TypeError, "BCK must be a sequence", id="string"),
])
def test_bad_bck(BCK, error, match):
    with pytest.raises(error, match=match):
        ConvSpec(BCK, (3,), (8,))


def test_bck_channels_and_filter_shapes():
    bck = [([5, 0, 2], [1, 3]), (np.array([1, 4]), range(0, 3))]
    spec = ConvSpec(bck, (3, 2), (6, 6))
    assert (spec.blocks.C, spec.blocks.K) == (6, 4)       # max index + 1; channel 3 of C unused
    assert spec.filter_shape() == [3 * 2 * 6 + 2 * 3 * 6]  # unequal blocks: flat
    assert spec.filter_shape(0) == [2, 3, 3, 2] and spec.filter_shape(1) == [3, 2, 3, 2]
    deconv = ConvSpec(bck, (3, 2), (6, 6), transposed=True)
    assert deconv.filter_shape(0) == [3, 2, 3, 2]          # input channels first
    uniform = ConvSpec(BCK4, (3,), (8,))
    assert uniform.filter_shape() == [2, 2, 2, 3]
    assert uniform.filter_form((2, 2, 2, 3)) == "stacked" and uniform.filter_form((24,)) == "flat"
    with pytest.raises(ValueError, match=r"F must have shape \(2, 2, 2, 3\) or \(24,\)"):
        uniform.filter_form((2, 2, 3, 2))
    with pytest.raises(ValueError, match=r"block must be in \[0, 2\)"):
        uniform.filter_shape(2)


def test_bck_channel_lists_as_tensors():
    """Channel lists given as framework tensors read as their values (torch's here); non-integer
    or 0-d tensors are refused by name as lists are."""
    as_lists = ConvSpec([([5, 0, 2], [1, 3]), ([1, 4], [0, 1, 2])], (3,), (8,))
    as_tensors = ConvSpec([(torch.tensor([5, 0, 2]), torch.tensor([1, 3])),
                           (torch.tensor([1, 4], dtype=torch.int32), torch.arange(3))], (3,), (8,))
    assert (as_tensors.blocks.C, as_tensors.blocks.K) == (as_lists.blocks.C, as_lists.blocks.K)
    assert as_tensors.filter_shape() == as_lists.filter_shape()
    assert np.array_equal(as_tensors.blocks.flat_index(0), as_lists.blocks.flat_index(0))
    for bad, match in ((torch.tensor([0.0, 1.0]), "must be a flat sequence of ints"),
                       (torch.tensor([True]), "must be a flat sequence of ints"),
                       (torch.tensor(1), "must be a sequence of ints")):
        with pytest.raises(TypeError, match=r"BCK\[0\]\[0\] \(input channels of block 0\) " + match):
            ConvSpec([(bad, [0])], (3,), (8,))


def test_dense_index_places_every_element_once(rng):
    bck = random_bck(rng, 9, 7, 5, 4, 3)
    for transposed in (False, True):
        blocks = ConvBlocks(*parse_bck(bck), trs=4, transposed=transposed)
        idx = blocks.dense_index
        assert np.unique(idx).size == idx.size == blocks.size
        rows, cols, taps = np.unravel_index(idx, blocks.dense_shape)
        for b, (cs, ks) in enumerate(bck):
            part = slice(blocks.offsets[b], blocks.offsets[b + 1])
            c, k = (rows, cols) if transposed else (cols, rows)
            shape = blocks.channel_shape(b) + (4,)
            want_c = np.broadcast_to(np.asarray(cs)[:, None, None] if transposed
                                     else np.asarray(cs)[None, :, None], shape)
            assert np.array_equal(c[part].reshape(shape), want_c)
            assert set(k[part].tolist()) == set(ks) and set(taps[part].tolist()) == set(range(4))


EDGE_CASES = [((3,), (7,), 1, 1, "SAME"), ((5,), (9,), 2, 1, "SAME"), ((3, 3), (5, 6), (1, 2), (2, 1), "SAME"),
              ((2, 3), (4, 5), 1, 1, ((1, 0), (2, 2))), ((2, 2, 3), (3, 4, 4), (1, 2, 1), 1, "SAME"),
              ((3, 3), (5, 5), 1, 1, "VALID"), ((3, 3), (3, 4), 1, 1, 2)]


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
@pytest.mark.parametrize("TRS, DHW, strides, dilates, padding", EDGE_CASES,
                         ids=["1d", "1d-k5-s2", "2d-s-d", "2d-explicit", "3d", "2d-valid", "2d-pad2"])
def test_edge_patterns_match_position_by_position(TRS, DHW, strides, dilates, padding, transposed):
    spec = ConvSpec(BCK4, TRS, DHW, None, strides, dilates, padding, edge_bias=True, transposed=transposed)
    g = spec.geometry
    pad = padding if isinstance(padding, str) else g.pads
    case = Case(tuple(BCK4), g.TRS, g.strides, g.dilates, pad, g.MPQ, transposed)
    want, count = edge_patterns(case, g.DHW)
    assert spec.edges.count == count
    assert np.array_equal(np.where(want < 0, count, want), spec.edges.pattern)


def test_edge_pattern_counts():
    assert ConvSpec(BCK4, (3, 3), (8, 8), edge_bias=True).edges.count == 8   # 4 sides, 4 corners
    assert ConvSpec(BCK4, (5,), (8,), edge_bias=True).edges.count == 4
    assert ConvSpec(BCK4, (3, 3), (8, 8), padding="VALID", edge_bias=True).edges.count == 0
    no_flag = ConvSpec(BCK4, (3, 3), (8, 8))
    assert no_flag.edge_count == 0 and no_flag.edges.count == 8


MIXED_BCK = [([8, 9], [0, 1, 2]), ([0, 3, 5, 7], [0, 1, 2]), ([1, 2], [4, 6]), ([3, 4], [4, 6]),
             ([6], [3, 5, 4]), ([0, 1], [7, 8])]   # a two-block column, unequal sizes, shuffled channels


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
@pytest.mark.parametrize("layout", ["mixed", "random"])
def test_grouped_plan_covers_every_filter_element(rng, transposed, layout):
    bck = MIXED_BCK if layout == "mixed" else random_bck(rng, 10, 9, 6, 4, 3)
    blocks = ConvBlocks(*parse_bck(bck), trs=2, transposed=transposed)
    plan = grouped_plan(blocks)
    seen = np.concatenate([b.weight.ravel() for b in plan.buckets])
    assert np.array_equal(np.sort(seen), np.arange(blocks.size))
    rows, cols, _ = np.unravel_index(blocks.dense_index, blocks.dense_shape)
    owner_c, owner_k = (rows, cols) if transposed else (cols, rows)
    for bucket in plan.buckets:
        r, c = np.indices(bucket.weight.shape[:2])
        group = r // (bucket.cin if transposed else bucket.cout)
        c_pos, k_pos = (r, group * bucket.cout + c) if transposed else (group * bucket.cin + c, r)
        owner = bucket.weight[..., 0]
        assert np.array_equal(owner_c[owner], bucket.inputs[c_pos])
        assert np.array_equal(owner_k[owner], bucket.outputs[k_pos])


def test_grouped_plan_assembly_kinds():
    diagonal = ConvBlocks(*parse_bck([(range(0, 4), range(0, 4)), (range(4, 8), range(4, 8))]), trs=1)
    assert grouped_plan(diagonal).assemble == "identity"
    assert grouped_plan(diagonal).buckets[0].input_span == (0, 8) and len(grouped_plan(diagonal).buckets) == 1
    swapped = ConvBlocks(*parse_bck([([0, 1], [2, 3]), ([2, 3], [0, 1])]), trs=1)
    plan = grouped_plan(swapped)
    assert plan.assemble == "permute" and plan.buckets[0].input_span == (0, 4)
    assert np.array_equal(np.concatenate([b.outputs for b in plan.buckets])[plan.order], np.arange(4))
    shared = ConvBlocks(*parse_bck([([0], [0, 1]), ([1], [1, 2])]), trs=1)
    assert grouped_plan(shared).assemble == "add"
    column = ConvBlocks(*parse_bck([([0, 1], [0, 1]), ([2, 3], [0, 1]), ([0, 1], [2, 3])]), trs=1)
    plan = grouped_plan(column)  # blocks 0 and 1 write the same outputs: one column of 4 inputs
    assert sorted((b.groups, b.cin, b.cout) for b in plan.buckets) == [(1, 2, 2), (1, 4, 2)]


def test_grouping_policy():
    def blocks(bs, CB, density):
        keep = [(c, k) for c in range(CB) for k in range(CB) if (c + k) % round(1 / density) == 0]
        return ConvBlocks(*parse_bck([(range(c * bs, (c + 1) * bs), range(k * bs, (k + 1) * bs))
                                      for c, k in keep]), trs=9)
    # the measured rule: wide blocks (>= GROUPED_MIN_CHANNELS) at density <= GROUPED_MAX_DENSITY only
    for spec, want in ((blocks(128, 4, 0.25), True), (blocks(256, 8, 0.125), True),
                       (blocks(128, 4, 0.5), False), (blocks(64, 8, 0.25), False),
                       (blocks(32, 8, 0.125), False), (blocks(128, 2, 1.0), False)):
        assert worth_grouping(spec, grouped_plan(spec)) is want


def _grid(bs, coords, shift=0):
    return [(range(c * bs + shift, (c + 1) * bs + shift), range(k * bs, (k + 1) * bs)) for c, k in coords]


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
def test_pointwise_plan_packs_the_matmul_weight(transposed):
    coords = [(2, 0), (0, 1), (1, 1), (0, 0)]       # not in the layout's (row-major) order
    spec = ConvSpec(_grid(16, coords), (1, 1), (4, 4), transposed=transposed)
    plan = spec.pointwise
    assert plan.layout.block_size == 16 and plan.layout.blocks == 4 and plan.strides == (1, 1)
    blocks = spec.blocks
    for b, (c, k) in enumerate(np.asarray(plan.layout.coords)):
        owner = coords.index((c, k))
        index = blocks.flat_index(owner)[..., 0]
        assert np.array_equal(plan.weight[b], index if transposed else index.T)   # rows along C


@pytest.mark.parametrize("bck, kwargs", [
    pytest.param(_grid(16, [(0, 0)]), dict(TRS=(3, 3)), id="3x3"),
    pytest.param(_grid(16, [(0, 0)]), dict(TRS=(1, 1), padding=1), id="padded"),
    pytest.param(_grid(16, [(0, 0)], shift=8), dict(TRS=(1, 1)), id="unaligned"),
    pytest.param(_grid(8, [(0, 0)]), dict(TRS=(1, 1)), id="block-8"),
    pytest.param([(range(16), range(32))], dict(TRS=(1, 1)), id="not-square"),
    pytest.param([([1, 0] + list(range(2, 16)), range(16))], dict(TRS=(1, 1)), id="shuffled-channels"),
    pytest.param(_grid(16, [(0, 0)]), dict(TRS=(1, 1), strides=2, transposed=True), id="strided-deconv"),
])
def test_pointwise_plan_only_for_1x1_block_grids(bck, kwargs):
    assert ConvSpec(bck, DHW=(4, 4), **kwargs).pointwise is None


# ---------------------------------------------------------------------------- the reference itself
ORACLE = [((3,), (9,), 2, 1, 1), ((3, 3), (6, 7), (2, 1), (1, 2), (1, 2)), ((2, 2), (5, 5), 1, 1, 0),
          ((3, 1, 2), (4, 3, 5), (1, 1, 2), (2, 1, 1), (2, 0, 1))]


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "deconv"])
@pytest.mark.parametrize("TRS, DHW, strides, dilates, pad", ORACLE, ids=["1d", "2d", "2d-even", "3d"])
def test_reference_matches_torch_float64(rng, TRS, DHW, strides, dilates, pad, transposed):
    """The numpy reference against PyTorch's own (transposed) convolutions, values and gradients."""
    ndim = len(TRS)
    expand = lambda v: (v,) * ndim if isinstance(v, int) else tuple(v)  # noqa: E731
    strides, dilates, pad = expand(strides), expand(dilates), expand(pad)
    bck = random_bck(rng, 5, 4, 3, 3, 2)
    N = 2
    if transposed:
        out = tuple((q - 1) * s - 2 * p + (t - 1) * d + 1 for q, s, p, t, d in zip(DHW, strides, pad, TRS, dilates))
    else:
        out = tuple((x + 2 * p - (t - 1) * d - 1) // s + 1 for x, s, p, t, d in zip(DHW, strides, pad, TRS, dilates))
    case = Case(tuple(bck), TRS, strides, dilates, tuple((p, p) for p in pad), out, transposed)
    C, K = case.C, case.K
    blocks = [rng.standard_normal(case.block_shape(b)) for b in range(len(bck))]
    flat = np.concatenate([b.ravel() for b in blocks])
    x = rng.standard_normal((N, C) + DHW)
    dy = rng.standard_normal((N, K) + out)
    y, dx, dF, _ = conv_products(case, flat, x, dy)
    W = torch.zeros((C, K) + TRS if transposed else (K, C) + TRS, dtype=torch.float64)
    for (cs, ks), f in zip(bck, blocks):
        rows, cols = (cs, ks) if transposed else (ks, cs)
        W[np.ix_(rows, cols)] = torch.from_numpy(f)
    xt = torch.from_numpy(x).requires_grad_()
    W.requires_grad_()
    op = getattr(F, f"conv_transpose{ndim}d" if transposed else f"conv{ndim}d")
    yt = op(xt, W, stride=strides, padding=pad, dilation=dilates)
    yt.backward(torch.from_numpy(dy))
    dF_t = np.concatenate([W.grad.numpy()[np.ix_(*((cs, ks) if transposed else (ks, cs)))].ravel()
                           for cs, ks in bck])
    for got, want in ((y, yt.detach().numpy()), (dx, xt.grad.numpy()), (dF, dF_t)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_reference_edge_bias_gradient_is_a_sum(rng):
    case = Case(tuple(BCK4), (3,), (1,), (1,), "SAME", (6,))
    x, dy = rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 4, 6))
    eb = rng.standard_normal((4, 2))
    y0, *_ = conv_products(case, np.zeros(24), x, dy)
    y, _, _, deb = conv_products(case, np.zeros(24), x, dy, eb)
    assert np.allclose(y[:, :, 0], eb[:, 0]) and np.allclose(y[:, :, -1], eb[:, 1]) and np.allclose(y0, 0)
    assert np.allclose(deb, np.stack([dy[:, :, 0].sum(0), dy[:, :, -1].sum(0)], axis=1))
    assert np.all(y[:, :, 1:-1] == 0)


def test_the_edge_map_is_built_only_for_an_edge_bias():
    """The edge map holds an entry per output position (a 256^3 volume: 16.7M): a layer without an
    edge bias never builds it, one with an edge bias builds it once."""
    big = ConvSpec([([0, 1], [0, 1])], (3, 3, 3), (256, 256, 256))
    assert big.edge_count == 0 and "edges" not in vars(big)
    small = ConvSpec([([0, 1], [0, 1])], (3,), (7,), edge_bias=True)
    assert small.edge_count == 2 and small.edges is small.edges
