"""The README's TensorFlow convolution example runs as printed and computes the right output."""
import pathlib
import re

import numpy as np

from blocksparse.testing import rel_error
from blocksparse.testing.conv import case_of, conv_products, l2_normalize_products

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def example(name):
    match = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", README.read_text("utf-8"), re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)


def test_conv_example():
    scope = {}
    exec(compile(example("conv-tf"), "README:conv-tf", "exec"), scope)
    conv, F, x, y, eb = (scope[k] for k in ("conv", "F", "x", "y", "eb"))
    case = case_of(conv, [(list(c), list(k)) for c, k in scope["BCK"]], "SAME", False)
    Fn = l2_normalize_products(case, F.numpy(), np.zeros(conv.f_shape()))[0]
    want = conv_products(case, Fn, x.numpy(), np.zeros(conv.o_shape(8)), eb.numpy())[0]
    assert y.shape == (8, 96, 16, 16) and rel_error(y.numpy(), want) < 1e-5
    assert scope["dF"].shape == F.shape and scope["deb"].shape == conv.edge_bias_shape() == (96, 8)
