"""The fused attention kernels compile for real GPUs without one: Triton compiles them for sm_90
(tensor descriptors) and sm_80 (pointer loads) in a subprocess with the interpreter off, so a kernel
that the interpreter runs but the GPU compiler rejects fails here."""
import json

import pytest

from blocksparse.ops.attention import aot
from blocksparse.ops.attention.configs import BwdConfig, FwdConfig, bwd_config, fwd_config

COMPILE = """
import json, sys
from dataclasses import replace
from blocksparse.ops.attention import aot
from blocksparse.ops.attention.configs import bwd_config, fwd_config
out = []
for kernel, arch, d, tma, atomic, flags in json.loads(sys.argv[1]):
    cfg = (fwd_config if kernel == "attn_fwd_kernel" else bwd_config)(d, 128)
    cfg = replace(cfg, tma=tma, prefetch=flags.pop("prefetch", False), heads_first=flags.pop("heads_first", False),
                  **({"atomic_dq": atomic} if hasattr(cfg, "atomic_dq") else {}))
    k = aot.compile_kernel(kernel, arch, dtype="bf16", head_dim=d, block_size=128, cfg=cfg, **flags)
    md = k.metadata
    out.append(dict(kernel=kernel, arch=arch, shared=md.shared, scratch=md.global_scratch_size,
                    cubin=len(k.asm["cubin"])))
print(json.dumps(out))
"""

SPECS = [
    ("attn_fwd_kernel", 90, 64, True, False, dict(causal=True, seqlens=True, masks=True)),
    ("attn_bwd_kernel", 90, 64, True, False, dict(causal=True, dkdv=False)),             # dq programs alone
    ("attn_bwd_kernel", 90, 64, True, True, dict(causal=False, seqlens=True, dq=False)),  # dk/dv, atomic dq
    ("attn_bwd_delta_kernel", 90, 64, True, True, dict()),
    ("attn_fwd_kernel", 80, 64, False, False, dict(causal=False, masks=True)),
    # the full blocks' walks one step ahead (deeper pipelines: the most shared memory)
    ("attn_fwd_kernel", 90, 128, True, False, dict(causal=True, prefetch=True)),
    ("attn_bwd_kernel", 90, 128, True, False, dict(causal=True, seqlens=True, prefetch=True, dkdv=False)),
    ("attn_bwd_kernel", 90, 128, True, False, dict(causal=True, masks=True, prefetch=True, heads_first=True,
                                                   dq=False)),
    # both kinds of program in one launch
    ("attn_bwd_kernel", 90, 128, True, False, dict(causal=True, seqlens=True, prefetch=True, heads_first=True)),
    ("attn_bwd_kernel", 80, 64, False, False, dict(causal=True, masks=True)),
    ("attn_fwd_kernel", 80, 64, False, False, dict(causal=True, prefetch=True)),
]


@pytest.mark.slow
def test_kernels_compile_for_sm90_and_sm80():
    from kernel_build import compiled_in_subprocess

    built = compiled_in_subprocess(COMPILE, json.dumps(SPECS))
    assert [(b["kernel"], b["arch"]) for b in built] == [(s[0], s[1]) for s in SPECS]
    for b in built:
        assert b["cubin"] > 0 and b["scratch"] == 0, b
        assert b["shared"] <= 227 * 1024, b       # fits one SM's shared memory


@pytest.mark.parametrize("kernel,atomic", [(k, False) for k in aot.KERNELS] + [("attn_bwd_kernel", True)])
def test_compile_args_name_every_parameter(kernel, atomic):
    cfg = FwdConfig() if kernel == "attn_fwd_kernel" else BwdConfig(atomic_dq=atomic)
    signature, consts = aot.triton_args(kernel, dtype="fp16", head_dim=128, block_size=128, cfg=cfg, causal=True)
    fn = aot._function(kernel)
    assert list(signature) == list(fn.arg_names)
    assert {n for n, t in signature.items() if t == "constexpr"} == set(consts)
    for name, rows in aot.KERNELS[kernel].items():
        want = (f"tensordesc<fp32[1, 1, {cfg.BM1}, 128]>" if atomic and name == "DQ"
                else f"tensordesc<fp16[1, 1, {getattr(cfg, rows)}, 128]>")
        assert signature[name] == want, name
    assert all(t in ("constexpr", "i32", "fp32") or t.startswith(("*", "tensordesc")) for t in signature.values())


def test_default_tables_fit_every_block_size():
    for d in (16, 32, 64, 128):
        for bs in (16, 32, 64, 128):
            f, b = fwd_config(d, bs), bwd_config(d, bs)
            for tile in (f.BM, f.BN, b.BM1, b.BN1, b.BM2, b.BN2):
                assert 16 <= tile <= bs and bs % tile == 0
