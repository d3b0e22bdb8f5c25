"""The README's PyTorch convolution example runs as printed and computes the right outputs."""
import pathlib
import re

import numpy as np

from blocksparse.testing import rel_error
from blocksparse.testing.conv import case_of, conv_products

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def example(name):
    match = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", README.read_text("utf-8"), re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)


def test_conv_example():
    scope = {}
    exec(compile(example("conv-torch"), "README:conv-torch", "exec"), scope)
    conv, F, x, y, z, out = (scope[k] for k in ("conv", "F", "x", "y", "z", "out"))
    case = case_of(conv, [(list(c), list(k)) for c, k in scope["BCK"]], "SAME", False)
    want = conv_products(case, F.detach().double().cpu().numpy(), x.double().cpu().numpy(), np.zeros(y.shape))[0]
    assert y.shape == (4, 128, 8, 8) and rel_error(y, want) < 1e-5
    assert z.shape == (4, 128, 16, 16) and out.shape == (4, 128, 50)
