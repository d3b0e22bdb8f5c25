"""The README's convolution examples run as printed and compute the right outputs."""
import numpy as np
import pytest

from blocksparse.testing import rel_error
from blocksparse.testing.conv import case_of, conv_products, l2_normalize_products
from readme_examples import run_readme_example


def run(name):
    scope = run_readme_example(name)
    conv = scope["conv"]
    return scope, conv, case_of(conv, [(list(c), list(k)) for c, k in scope["BCK"]], "SAME", False)


def test_tensorflow_example():
    pytest.importorskip("tensorflow")
    scope, conv, case = run("conv-tf")
    F, x, y, eb = (scope[k].numpy() for k in ("F", "x", "y", "eb"))
    Fn = l2_normalize_products(case, F, np.zeros(F.shape))[0]
    want = conv_products(case, Fn, x, np.zeros(y.shape), eb)[0]
    assert y.shape == (8, 96, 16, 16) and rel_error(y, want) < 1e-5
    assert scope["dF"].shape == F.shape and scope["deb"].shape == conv.edge_bias_shape() == (96, 8)


def test_torch_example():
    pytest.importorskip("torch")
    scope, conv, case = run("conv-torch")
    F, x, y, z, out = (scope[k] for k in ("F", "x", "y", "z", "out"))
    want = conv_products(case, F.detach().double().cpu().numpy(), x.double().cpu().numpy(), np.zeros(y.shape))[0]
    assert y.shape == (4, 128, 8, 8) and rel_error(y, want) < 1e-5
    assert z.shape == (4, 128, 16, 16) and out.shape == (4, 128, 50)
