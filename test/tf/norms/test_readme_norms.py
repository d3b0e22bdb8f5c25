"""The README's ``tf-ew-norms`` example runs as printed and its gradients match float64 numpy; the
docstring examples of the modules run too."""
import doctest
import importlib
import re
from pathlib import Path

import numpy as np
import pytest

from blocksparse.testing import norms as ref
from blocksparse.testing import rel_error, tolerance

README = Path(__file__).resolve().parents[3] / "README.md"


def example(name):
    match = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", README.read_text("utf-8"), re.S)
    assert match, f"README has no example {name!r}"
    return match.group(1)


def test_readme_ew_norms_example():
    scope = {}
    exec(compile(example("tf-ew-norms"), "README.md", "exec"), scope)  # eager: no process-wide switch
    z = np.asarray(scope["z"].numpy(), np.float64)
    g, b = scope["g"].numpy().astype(np.float64), scope["b"].numpy().astype(np.float64)
    mask, k = scope["mask"].numpy(), scope["K"]
    zn = ref.layer_norm(z, g, b, axis=1, segments=4)
    c = np.zeros((scope["N"], k))
    dh = mask / 0.9                                   # d loss / d h_next through the dropout
    dgates = ref.lstm_gates_grad(np.zeros_like(c), dh, c, *np.split(zn, 4, axis=1))[1:5]
    _, dg, db = ref.layer_norm_grad(np.concatenate(dgates, axis=1), z, g, b, axis=1, segments=4)
    assert rel_error(scope["dg"], dg) < tolerance("bfloat16")
    assert rel_error(scope["db"], db) < tolerance("bfloat16")


@pytest.mark.parametrize("module", ["blocksparse.ew", "blocksparse.lstm", "blocksparse.norms", "blocksparse.keras"])
def test_doctests(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
