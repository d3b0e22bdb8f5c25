"""LSTM gate kernel logic (merged and separate gates, bias, feature and token edge masks, the
persistent backward and its dbias partial sums) through Triton's interpreter, against float64."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from blocksparse.ops.lstm.configs import GatesConfig, lstm_gates_config  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from blocksparse.testing import norms as ref  # noqa: E402
from blocksparse.torch._lstm import launch  # noqa: E402

pytestmark = pytest.mark.interpreter

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: several feature tiles with a partial last one, several token tiles per persistent program
SMALL = GatesConfig(BN=4, BK=16, num_warps=4, programs_per_sm=1)


def _gates(h, merged):
    return list(h.split(h.shape[1] // 4, dim=1)) if merged else [t.contiguous() for t in h.split(h.shape[1] // 4, 1)]


SHAPES = {"n5-k24": (5, 24), "n1-k40": (1, 40), "n13-k8": (13, 8)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cfg", [None, SMALL], ids=["table", "small"])
def test_dtypes(rng, dtype, shape, cfg):
    _check(rng, dtype, *SHAPES[shape], True, True, cfg)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "four"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cfg", [None, SMALL], ids=["table", "small"])
def test_packings(rng, shape, merged, bias, cfg):
    """Merged or separate gates, with or without the bias (and its partial sums)."""
    _check(rng, "float32", *SHAPES[shape], merged, bias, cfg)


def _check(rng, dtype, n, k, merged, bias, cfg):
    c, h, b, dcn, dhn = (torch.from_numpy(a).to(DTYPES[dtype]) for a in ref.draw_lstm_gates(rng, n, k))
    b = b if bias else None
    f64 = lambda t: None if t is None else t.double().numpy()  # noqa: E731
    want = ref.lstm_gates(f64(c), f64(h), bias=f64(b), forget_bias=0.7)
    want_grads = ref.lstm_gates_grad(f64(dcn), f64(dhn), f64(c), f64(h), bias=f64(b), forget_bias=0.7)
    gates = _gates(h, merged)
    c_next, h_next = launch.lstm_gates_fwd(c, gates, b, forget_bias=0.7, cfg=cfg or lstm_gates_config(k))
    dc, dgates, db = launch.lstm_gates_bwd(c, gates, b, dcn, dhn, forget_bias=0.7, merged=merged,
                                           cfg=cfg or lstm_gates_config(k, backward=True))
    if not merged:
        assert len(dgates) == 4 and all(t.shape == (n, k) for t in dgates)
        dgates = torch.cat(dgates, 1)
    tol = tolerance(dtype)
    for name, got, exp in zip(("c_next", "h_next", "dc", "dh"), (c_next, h_next, dc, dgates),
                              (*want, *want_grads[:2])):
        assert got.dtype == c.dtype, name
        assert rel_error(got, exp) < tol, name
    if bias:
        assert db.dtype == b.dtype and rel_error(db, want_grads[2]) < tol
    else:
        assert db is None


def test_strided_rows_and_float32_bias(rng):
    """Gates read through their row strides (a slice of a wider buffer); a float32 bias with
    bfloat16 gates gives a float32 dbias."""
    c64, h64, b64, dcn64, dhn64 = ref.draw_lstm_gates(rng, 6, 16)
    wide = torch.zeros(6, 80, dtype=torch.bfloat16)
    wide[:, 8:72] = torch.from_numpy(h64)
    c, dcn, dhn = (torch.from_numpy(a).bfloat16() for a in (c64, dcn64, dhn64))
    h, b = wide[:, 8:72], torch.from_numpy(b64).float()
    gates = list(h.split(16, 1))
    c_next, h_next = launch.lstm_gates_fwd(c, gates, b, forget_bias=1.0)
    dc, dh, db = launch.lstm_gates_bwd(c, gates, b, dcn, dhn, forget_bias=1.0, merged=True, cfg=SMALL)
    f64 = lambda t: t.double().numpy()  # noqa: E731
    want = (*ref.lstm_gates(f64(c), f64(h), bias=b64),
            *ref.lstm_gates_grad(f64(dcn), f64(dhn), f64(c), f64(h), bias=b64))
    for got, exp in zip((c_next, h_next, dc, dh), want):
        assert rel_error(got, exp) < tolerance("bfloat16")
    assert db.dtype == torch.float32 and rel_error(db, want[-1]) < tolerance("float32")


def test_empty_batch():
    c, h, b = torch.empty(0, 8), torch.empty(0, 32), torch.ones(32)
    c_next, h_next = launch.lstm_gates_fwd(c, list(h.split(8, 1)), b, forget_bias=1.0)
    assert c_next.shape == h_next.shape == (0, 8)
    dc, dh, db = launch.lstm_gates_bwd(c, list(h.split(8, 1)), b, c, c, forget_bias=1.0, merged=True)
    assert dc.shape == (0, 8) and dh.shape == (0, 32) and torch.equal(db, torch.zeros(32))
