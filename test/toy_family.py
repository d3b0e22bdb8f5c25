"""A toy op family, registered with the generic AOT path exactly as a real one is (the four
functions of ``blocksparse/ops/<family>/aot.py``): it proves that compiler, code generator, C
runtime and launch layer need no change for a new family, and covers every argument kind the
runtime passes (pointers, i32, i64, f32, a tensor descriptor)."""
from dataclasses import dataclass

import triton
import triton.language as tl

from blocksparse.aot.family import CompileArgs


@triton.jit
def scale_kernel(X, Y, N, offset, alpha, BLOCK: tl.constexpr):
    # y[offset + i] = alpha * x[i] for i < N
    o_n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_n = o_n < N
    tl.store(Y + offset + o_n, tl.load(X + o_n, mask=m_n) * alpha, mask=m_n)


@triton.jit
def rows_kernel(x_desc, Y, stride_y, n_rows, BM: tl.constexpr, BN: tl.constexpr):
    # copies [BM, BN] tiles of x (through its descriptor) into y, one per program
    i_m = tl.program_id(0)
    b_x = x_desc.load([i_m * BM, 0])
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = tl.arange(0, BN)
    tl.store(Y + o_m[:, None] * stride_y + o_n[None, :], b_x, mask=o_m[:, None] < n_rows)


@dataclass(frozen=True)
class ToySpec:
    arch: int
    op: str            # "scale" or "rows"
    block: int

    @property
    def name(self):
        return f"{self.op}_b{self.block}_sm{self.arch}"


KERNELS = {"scale": scale_kernel, "rows": rows_kernel}


def specializations(archs):
    specs = []
    for arch in archs:
        specs.append(ToySpec(arch, "scale", 128))
        if arch >= 90:  # tensor descriptors need the TMA
            specs.append(ToySpec(arch, "rows", 64))
    return specs


def kernel(spec):
    return KERNELS[spec.op]


def compile_args(spec):
    if spec.op == "scale":
        return CompileArgs({"X": "*fp32", "Y": "*fp32", "N": "i32", "offset": "i64", "alpha": "fp32",
                            "BLOCK": "constexpr"}, {"BLOCK": spec.block},
                           frozenset({"X", "Y", "offset"}), num_warps=4, num_stages=1)
    return CompileArgs({"x_desc": f"tensordesc<fp16[{spec.block}, 32]>", "Y": "*fp16", "stride_y": "i32",
                        "n_rows": "i64", "BM": "constexpr", "BN": "constexpr"},
                       {"BM": spec.block, "BN": 32}, frozenset({"Y"}), num_warps=4, num_stages=1)


def fields(spec):
    return {"op": spec.op, "block": spec.block, "dtype": "fp32" if spec.op == "scale" else "fp16",
            "tile": {"block": spec.block}}
