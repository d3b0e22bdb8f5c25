"""The implicit-GEMM convolution kernel compiled for sm_90 without a GPU (a subprocess with the
interpreter off): with the JIT's divisibility hints both its tiles are copied asynchronously, in 2
shared-memory buffers each on the plain walk and ``num_stages`` with ``PREFETCH`` -- the pipelines
that the module docstring describes and the autotuner's configs rely on."""
import json

import pytest

COMPILE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from blocksparse.ops.conv.implicit_gemm import conv_implicit_kernel

fn = conv_implicit_kernel.fn  # under the autotuner
names = list(fn.arg_names)
out = []
for bm, bs, stages, prefetch, transposed in json.loads(sys.argv[1]):
    consts = dict(BM=bm, BN=bs, BK=bs, ALIGN=8, PRECISION="ieee", TRANSPOSED=transposed, PREFETCH=prefetch)
    pointers = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "STEPS": "*i32", "TILES": "*i32"}
    signature = {n: "constexpr" if n in consts else pointers.get(n, "i32") for n in names}
    # as the JIT specialises a call on channels-last tensors of 16k channels: aligned pointers and strides
    hinted = [n for n in names if n in pointers or n.startswith("stride_")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in hinted}
    k = triton.compile(ASTSource(fn, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_stages": stages})
    buffers = re.findall(r"ttg.local_alloc[^\n]*-> !ttg.memdesc<(\d+)x(\d+)x(\d+)xbf16", k.asm["ttgir"])
    out.append(dict(shared=k.metadata.shared, buffers=sorted([int(n), int(r), int(c)] for n, r, c in buffers),
                    cubin=len(k.asm["cubin"])))
print(json.dumps(out))
"""

# (BM, block size, num_stages, PREFETCH, TRANSPOSED): the two autotuner configs that prefetch, and
# their plain twins
SPECS = [(128, 64, 3, False, False), (128, 64, 3, True, False), (64, 32, 4, True, True), (64, 32, 4, False, True)]


@pytest.mark.slow
def test_both_tiles_are_pipelined_and_prefetch_deepens_them():
    from kernel_build import compiled_in_subprocess

    built = compiled_in_subprocess(COMPILE, json.dumps(SPECS))
    assert len(built) == len(SPECS)
    for (bm, bs, stages, prefetch, _), b in zip(SPECS, built):
        depth = stages if prefetch else 2
        # the pixels' [BM, BK] tile and the filter's [BK, BN] tile, each in `depth` buffers
        assert b["buffers"] == sorted([[depth, bm, bs], [depth, bs, bs]]), b
        assert b["cubin"] > 0 and b["shared"] <= 227 * 1024, b

