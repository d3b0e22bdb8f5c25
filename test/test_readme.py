"""The README's TensorFlow examples run as printed and compute the right product.

Each example is the fenced ``python`` block after an ``<!-- example: NAME -->`` marker.  It runs
in its own interpreter (the ``tf.compat.v1`` example switches eager execution off for the whole
process), followed by a check that compares its ``result`` with float64 numpy.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from readme_examples import examples

# Run after each example, in its namespace: `result` is x @ W for x = ones, W the dense weight.
CHECKS = {
    "tf2": """
w_value = w.numpy()
y_value = result.numpy()
dw_value = dw.numpy()
""",
    "tf-compat-v1": """
w_value = sess.run(w)
y_value = result[0]
dw_value = None
""",
}
COMMON_CHECK = """
import numpy as _np
_dense = bsmm.layout.dense(w_value.astype(_np.float64))
_x = _np.ones((minibatch_size, hidden_size))
_ref = _x @ _dense
assert y_value.shape == (minibatch_size, hidden_size), y_value.shape
assert _np.linalg.norm(y_value - _ref) <= 1e-5 * _np.linalg.norm(_ref), "y differs from x @ W"
if dw_value is not None:  # loss = mean(y^2): dW = x.T @ (2 y / y.size), packed
    _dw_ref = bsmm.layout.pack(_x.T @ (2 * _ref / _ref.size))
    assert _np.linalg.norm(dw_value - _dw_ref) <= 1e-5 * _np.linalg.norm(_dw_ref), "dW is wrong"
print("README example checked")
"""


def test_readme_has_both_examples():
    assert set(examples()) >= set(CHECKS), f"README examples found: {sorted(examples())}"


def test_every_readme_example_is_tested():
    """Each marked example is named by some test: an example that no test runs goes stale."""
    tests = "".join(p.read_text("utf-8") for p in Path(__file__).resolve().parent.rglob("test_*.py"))
    untested = [name for name in examples() if f'"{name}"' not in tests]
    assert not untested, f"README examples without a test: {untested}"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_readme_example_runs(name, tmp_path):
    pytest.importorskip("tensorflow")
    code = examples()[name] + CHECKS[name] + COMMON_CHECK
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0, f"example {name!r} failed:\n{res.stderr[-4000:]}"
    assert "README example checked" in res.stdout
