"""The PyTorch transformer ops' compiled launches: a GPU call of every kernel gets its spec (planned
here for sm_90 with a small kernel library built from the source tree, on CPU tensors) with its
arguments packed as the JIT passes them; what the library does not hold (head dimensions that are
not multiples of 16, dtypes it lacks, a softmax into another dtype, older GPUs) takes the JIT."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from launch_checks import assert_packed_like_jit  # noqa: E402

from blocksparse.ops.transformer import aot  # noqa: E402
from blocksparse.torch import BlocksparseTransformer  # noqa: E402
from blocksparse.torch._transformer import launch, state  # noqa: E402

BS = 32
SPECS = [s.name for s in aot.specializations((90,)) if s.dtype == "bf16" and s.block_size == BS]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from kernel_build import build_subset, can_build

    from blocksparse.aot.abi import KernelLibrary

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    return KernelLibrary(build_subset(tmp_path_factory.mktemp("transformer-torch"), "transformer", SPECS))


def _launches(rng, head_dim, dtype=torch.bfloat16, softmax_dtype=None, heads=2):
    """Every launch of one layer's calls, with its call tensors: ``(name, launch, tensors)``."""
    layout = np.tril(np.ones((heads, 3, 3), bool))  # the same number of blocks per head
    layout[:, 0, 2] = rng.random() < 0.5
    bst = BlocksparseTransformer(layout, BS)
    st = state.state(bst._handle)
    lay, tables = st.layout, st.tables("cpu")
    n, f = 2, heads * head_dim
    a, b = torch.randn(n, lay.ctx_q, f).to(dtype), torch.randn(n, lay.ctx_k, f).to(dtype)
    w = torch.randn(n, heads, lay.blocks, BS, BS).to(dtype)
    common = dict(heads=heads, lut_heads=lay.lut_heads, bs=BS, precision="ieee")
    out = [("nt", launch.nt_launch(a, b, tables, blocks=lay.blocks, **common), [a, b, torch.empty_like(w)]),
           ("nn", launch.xn_launch(w, b, tables, trans=False, out_ctx=lay.ctx_q, **common),
            [w, b, torch.empty_like(a)]),
           ("tn", launch.xn_launch(w, a, tables, trans=True, out_ctx=lay.ctx_k, **common),
            [w, a, torch.empty_like(b)])]
    y = torch.empty_like(w, dtype=softmax_dtype or dtype)
    for ar in (None, 2):
        out.append((f"softmax ar={ar}", launch.softmax_launch(w, tables, scale=0.5, autoregress_at_key=ar, masked=False,
                                                               lut_heads=lay.lut_heads, q_blocks=lay.QB,
                                                               dtype=y.dtype), [w, y]))
    out.append(("softmax_grad", launch.softmax_grad_launch(w, w, tables, scale=0.5, lut_heads=lay.lut_heads,
                                                           q_blocks=lay.QB, dtype=dtype), [w, w, torch.empty_like(w)]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [16, 64])
def test_a_gpu_call_gets_its_compiled_specs_packed_as_the_jit_launches(kernels, rng, head_dim):
    for name, one, tensors in _launches(rng, head_dim):
        runner = launch._PLANS.prepare_on(one, kernels, 90, 0)
        assert runner.path == "aot", (name, runner.reason)
        for word, index in runner.slots:
            runner._words[word] = tensors[index].data_ptr()
        assert_packed_like_jit(runner, tensors)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["head-dim-24", "float16", "softmax-into-float32", "sm_80"])
def test_what_the_library_does_not_hold_takes_the_jit(kernels, rng, case):
    kw = {"head-dim-24": dict(head_dim=24), "float16": dict(head_dim=32, dtype=torch.float16),
          "softmax-into-float32": dict(head_dim=32, softmax_dtype=torch.float32), "sm_80": dict(head_dim=32)}[case]
    for name, one, _ in _launches(rng, **kw):
        if case == "softmax-into-float32" and not name.startswith("softmax ar"):
            continue
        if case == "head-dim-24" and name.startswith("softmax"):
            continue  # the softmax does not see the head dimension
        runner = launch._PLANS.prepare_on(one, kernels, 80 if case == "sm_80" else 90, 0)
        assert runner.path == "jit", (case, name)
        if case == "head-dim-24":  # a spec of its head slice exists: its arguments refuse the call
            assert "head_dim = 24 is not a multiple of 16" in runner.reason
