"""The README's PyTorch attention example runs as printed and computes causal attention."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blocksparse.testing import attention as ref  # noqa: E402
from blocksparse.testing import rel_error, tolerance  # noqa: E402
from readme_examples import run_readme_example  # noqa: E402


def test_torch_example():
    scope = run_readme_example("transformer-torch")
    bst, q, k, v, y = (scope[n] for n in ("bst", "q", "k", "v", "y"))
    n = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    o, dq, dk, dv = ref.attention(bst.layout, n(q), n(k), n(v), np.ones(y.shape), 64 ** -0.5, None, 0)
    for got, want in ((y, o), (q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert rel_error(got, want) < tolerance("float32")
