"""The README's TensorFlow attention example runs as printed and computes dense causal attention."""
import numpy as np

from blocksparse.testing import attention as ref
from blocksparse.testing import rel_error, tolerance
from readme_examples import run_readme_example


def test_tf_example():
    scope = run_readme_example("transformer-tf")
    bst, q, k, v, y, dq = (scope[n] for n in ("bst", "q", "k", "v", "y", "dq"))
    o, dq_ref, _, _ = ref.attention(bst.layout, q.numpy(), k.numpy(), v.numpy(), np.ones(y.shape),
                                    scope["head_dim"] ** -0.5, bst.masks)
    assert rel_error(y, o) < tolerance("float32") and rel_error(dq, dq_ref) < tolerance("float32")
    # the layout and callback together are plain causal attention
    assert (ref.kept_mask(bst.layout, bst.masks) == np.tril(np.ones((1024, 1024), bool))).all()
