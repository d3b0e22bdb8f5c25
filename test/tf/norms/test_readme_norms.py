"""The README's ``tf-ew-norms`` example runs as printed and its gradients match float64 numpy; the
docstring examples of the modules run too."""
import doctest
import importlib

import numpy as np
import pytest

from blocksparse.testing import norms as ref
from blocksparse.testing import rel_error, tolerance
from readme_examples import run_readme_example


def test_readme_ew_norms_example():
    scope = run_readme_example("tf-ew-norms")  # eager: no process-wide switch
    z = np.asarray(scope["z"].numpy(), np.float64)
    g, b = scope["g"].numpy().astype(np.float64), scope["b"].numpy().astype(np.float64)
    mask, k = scope["mask"].numpy(), scope["K"]
    zn = ref.layer_norm(z, g, b, axis=1, segments=4)
    c = np.zeros((scope["N"], k))
    dh = mask / 0.9                                   # d loss / d h_next through the dropout
    dzn = ref.lstm_gates_grad(np.zeros_like(c), dh, c, zn)[1]
    _, dg, db = ref.layer_norm_grad(dzn, z, g, b, axis=1, segments=4)
    assert rel_error(scope["dg"], dg) < tolerance("bfloat16")
    assert rel_error(scope["db"], db) < tolerance("bfloat16")


@pytest.mark.parametrize("module", ["blocksparse.ew", "blocksparse.lstm", "blocksparse.norms", "blocksparse.keras"])
def test_doctests(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
