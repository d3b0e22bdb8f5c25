"""The fused attention's compiled launches: every launch a table config makes has a spec in the
family's registration, a GPU call gets it (planned here for sm_90 with a small kernel library built
from the source tree, on CPU tensors) with its arguments packed as the JIT passes them, and what the
library does not hold (element masks, ragged lengths, pointer tiles, older GPUs) takes the JIT."""
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from launch_checks import assert_packed_like_jit  # noqa: E402

from blocksparse.ops.attention import aot  # noqa: E402
from blocksparse.ops.attention import configs  # noqa: E402
from blocksparse.torch._attention import launch, state  # noqa: E402


class Manifest:
    """The registration's specs as a kernel library's manifest lists them, with its ``find``."""

    def __init__(self, arch=90):
        self.specs = [dict(aot.fields(s), family="attention", kernel=s.kernel, name=s.name)
                      for s in aot.specializations((arch,))]
        self.arch = arch

    def find(self, family, arch, **fields):
        found = [i for i, s in enumerate(self.specs)
                 if s["family"] == family and arch == self.arch and all(s.get(k, False) == v for k, v in fields.items())]
        assert len(found) <= 1, [self.specs[i]["name"] for i in found]
        return found[0] if found else None


def _tables(layout, bs, causal, masks=None):
    index = None if masks is None else np.where(layout, 0, -1).astype(np.int32)
    return state.LayoutState(layout, bs, index, masks).tables(causal, "cpu")


def _inputs(dtype, d, s, heads=2, kv_heads=2):
    q = torch.randn(1, heads, s, d).to(dtype)
    k, v = (torch.randn(1, kv_heads, s, d).to(dtype) for _ in range(2))
    return q, k, v


def _launches(q, k, v, tables, bs, causal, cfg_fwd, cfg_bwd, seqlens=False):
    o = torch.empty_like(q)
    fwd = launch.fwd_launch(q, k, v, seqlens, tables, block_size=bs, causal=causal, scale=0.125, cfg=cfg_fwd,
                            tma=cfg_fwd.tma)
    bwd = launch.bwd_launches(q, k, v, o, o, seqlens, tables, block_size=bs, causal=causal, scale=0.125,
                              cfg=cfg_bwd, tma=cfg_bwd.tma)
    return [(fwd, cfg_fwd)] + [(b, cfg_bwd) for b in bwd]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", aot.AOT_HEAD_DIMS)
@pytest.mark.parametrize("bs", aot.AOT_BLOCK_SIZES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("density", [None, 0.1])
def test_every_table_launch_has_a_registered_spec(dtype, d, bs, causal, density):
    manifest = Manifest()
    layout = np.ones((1, 2, 2), bool)
    q, k, v = _inputs(dtype, d, 2 * bs)
    cfg_bwd = configs.bwd_config(d, bs, density)
    for one, cfg in _launches(q, k, v, _tables(layout, bs, causal), bs, causal, configs.fwd_config(d, bs), cfg_bwd):
        index = launch._spec(manifest, 90, one, cfg)
        assert index is not None, (one.kernel_name, one.constexprs)
        assert manifest.specs[index]["kernel"] == one.kernel_name


def test_what_the_library_does_not_hold_finds_no_spec():
    manifest = Manifest()
    layout = np.ones((1, 2, 2), bool)
    q, k, v = _inputs(torch.bfloat16, 64, 128)
    fwd, bwd = configs.fwd_config(64, 64), configs.bwd_config(64, 64)
    masks = np.ones((1, 64, 64), np.uint8)
    cases = {"masks": (_tables(layout, 64, False, masks), fwd, bwd, False),
             "seqlens": (_tables(layout, 64, False), fwd, bwd, True),
             "pointer tiles": (_tables(layout, 64, False), replace(fwd, tma=False), replace(bwd, tma=False), False),
             "other tiles": (_tables(layout, 64, False), replace(fwd, BN=32), replace(bwd, BN2=32), False)}
    for name, (tables, f, b, seqlens) in cases.items():
        for one, cfg in _launches(q, k, v, tables, 64, False, f, b, seqlens):
            if name == "other tiles" and one.kernel is launch.attn_bwd_delta_kernel:
                continue
            assert launch._spec(manifest, 90, one, cfg) is None, (name, one.kernel_name)
    one, cfg = _launches(q, k, v, _tables(layout, 64, False), 64, False, fwd, bwd)[0]
    assert launch._spec(Manifest(), 80, one, cfg) is None      # built for sm_90 only
    assert aot.specializations((80, 86)) == []                  # tensor-descriptor tiles: sm_90 and newer
    names = [s.name for s in aot.specializations((90, 100))]
    assert len(names) == len(set(names))


# --------------------------------------------------------------------------- with a built library
SPECS = [s for s in aot.specializations((90,)) if s.dtype == "bf16" and s.block_size == 64
         and ((s.head_dim, s.causal) in ((64, False), (128, True)) or (s.head_dim, s.product) == (128, "delta"))]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from kernel_build import build_subset, can_build

    from blocksparse.aot.abi import KernelLibrary

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    return KernelLibrary(build_subset(tmp_path_factory.mktemp("attention"), "attention", [s.name for s in SPECS]))


@pytest.mark.slow
@pytest.mark.parametrize("d, causal, density, kv_heads", [(64, False, None, 4), (64, False, 0.1, 2), (128, True, None, 4)])
def test_a_gpu_call_gets_its_compiled_specs_packed_as_the_jit_launches(kernels, d, causal, density, kv_heads):
    bs = 64
    layout = np.ones((1, 3, 3), bool)
    q, k, v = _inputs(torch.bfloat16, d, 3 * bs, heads=4, kv_heads=kv_heads)
    o, lse, delta = torch.empty_like(q), torch.empty(q.shape[:3]), torch.empty(q.shape[:3])
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = [q, k, v, o, o, dq, dk, dv, lse, delta, None]
    launches = _launches(q, k, v, _tables(layout, bs, causal), bs, causal, configs.fwd_config(d, bs),
                         configs.bwd_config(d, bs, density))
    for i, (one, cfg) in enumerate(launches):
        runner = launch.prepare_on(one, cfg, kernels, 90, 0)
        assert runner.path == "aot", runner.reason
        unit = kernels.specs[runner.spec_index].get("unit")
        assert unit == (kv_heads == 4) or one.kernel is launch.attn_bwd_delta_kernel  # GROUP = HL = 1 compiled in
        call = [q, k, v, o, lse, None] if i == 0 else tensors
        for word, index in runner.slots:
            runner._words[word] = call[index].data_ptr()
        assert_packed_like_jit(runner, call)
    kinds = [one.kernel_name for one, _ in launches]
    want = ["attn_fwd_kernel"] + (["attn_bwd_delta_kernel", "attn_bwd_kernel"] if d == 128 else ["attn_bwd_kernel"] * 2)
    assert kinds == want
    # an older GPU, and a ragged batch, take the JIT
    assert launch.prepare_on(launches[0][0], launches[0][1], kernels, 80, 0).path == "jit"
    ragged = _launches(q, k, v, _tables(layout, bs, causal), bs, causal, configs.fwd_config(d, bs),
                       configs.bwd_config(d, bs), seqlens=True)[0]
    assert launch.prepare_on(*ragged, kernels, 90, 0).path == "jit"
