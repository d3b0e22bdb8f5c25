"""The conv family's ahead-of-time registration (see :mod:`blocksparse.aot.family`): the implicit-GEMM
kernel of :mod:`.implicit_gemm`, the convolution and its input gradient, for the PyTorch frontend's
eager launches (one ``bsk_launch`` a call instead of Triton's launcher and autotuner).

A spec fixes the 16-bit dtype, the direction (``transposed``: the input gradient), the channel
tiles ``BN`` / ``BK`` of the plan, one of :data:`TILES` and a :data:`WINDOWS` class.  What holds for
the calls it serves is compiled in, as the JIT specialises it: 2-D (and 1-D) convolutions -- the
depth axis is the neutral one of :func:`blocksparse.torch._conv.implicit._launch` (``ID = OD = 1``,
unit step and dilation, no padding) --, tables whose channels, counts and offsets are multiples of
16 (``ALIGN = 16``), 16-byte aligned buffers and strides, a written channel count that is a
multiple of 16, and the window's constants (unit steps and dilations: the input gradient then
divides by no step; without them the compiled input gradient took up to 2x the JIT's time on an
H200).

What the library does not compile takes the JIT and its autotuner, which
:func:`blocksparse.torch._conv.implicit.launch_path` reports: 3-D convolutions, narrower channel
runs, and float32, whose compiled kernels ran 1.03-1.3x the JIT's time on the H200 (where the
kernel is GPU-bound anyway: its launch cost matters little).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...aot.family import CompileArgs
from ..common.aot import signature

__all__ = ["ImplicitSpec", "TILES", "DTYPES", "BLOCK_N", "BLOCK_K", "DEPTH", "WINDOWS", "window_of",
           "specializations", "kernel", "compile_args", "fields", "tile_for"]

#: Triton dtype names compiled.
DTYPES = ("bf16", "fp16")
#: Channel tiles compiled: output channels ``BN`` and input channels a step ``BK`` (the plan's,
#: :func:`blocksparse.ops.conv.implicit.implicit_plan`: blocks of 32 channels and wider).
BLOCK_N, BLOCK_K = (32, 64, 128), (32, 64)
#: Pixel tiles (``BM`` output pixels, warps, stages), each walking its steps one table row ahead
#: (``PREFETCH``): the two that the JIT's autotuner picked for most layers of ``bench/conv_implicit.py``
#: on an H200 (:func:`tile_for` chooses between them).
TILES = {"m128": (128, 4, 3), "m64": (64, 4, 4)}
#: The depth axis of 2-D and 1-D convolutions, compiled in.
DEPTH = {"ID": 1, "OD": 1, "step_d": 1, "dil_d": 1, "pad_d": 0}
#: Window classes -> what their specs compile in besides: ``1x1`` (one tap, no padding, unit steps),
#: ``unit`` (unit steps and dilations), ``any``.
WINDOWS = {"1x1": {"step_h": 1, "step_w": 1, "dil_h": 1, "dil_w": 1, "taps_h": 1, "taps_w": 1, "pad_h": 0, "pad_w": 0},
           "unit": {"step_h": 1, "step_w": 1, "dil_h": 1, "dil_w": 1}, "any": {}}


@dataclass(frozen=True)
class ImplicitSpec:
    """One compiled variant of ``conv_implicit_kernel``."""

    arch: int
    dtype: str
    transposed: bool
    block_n: int
    block_k: int
    tile: str
    window: str

    @property
    def name(self):
        return (f"conv_implicit_{'dx' if self.transposed else 'fwd'}_{self.dtype}_n{self.block_n}_k{self.block_k}"
                f"_{self.tile}_{self.window}_sm{self.arch}")


def specializations(archs):
    """Every spec for ``archs``: dtype x direction x channel tiles x pixel tile x window class."""
    return [ImplicitSpec(arch, dtype, transposed, bn, bk, tile, window)
            for arch in archs for dtype in DTYPES for transposed in (False, True) for bn in BLOCK_N
            for bk in BLOCK_K for tile in TILES for window in WINDOWS]


def kernel(spec):
    from .implicit_gemm import conv_implicit_kernel

    return conv_implicit_kernel.fn  # under the autotuner


def fields(spec):
    """What selects a spec at run time: dtype, direction, ``bn``, ``bk``, the pixel tile's name and
    ``bm``, the window class."""
    return {"dtype": spec.dtype, "transposed": spec.transposed, "bn": spec.block_n, "bk": spec.block_k,
            "tile": spec.tile, "bm": TILES[spec.tile][0], "window": spec.window}


def window_of(scalars):
    """The narrowest window class whose constants the kernel's integer arguments ``scalars`` (by
    name) all take."""
    return next(name for name, fixed in WINDOWS.items() if all(scalars[k] == v for k, v in fixed.items()))


def tile_for(block_n, programs_128, sms):
    """The pixel tile of a launch with ``programs_128`` programs of ``BM = 128`` on ``sms`` SMs:
    ``m64`` for output-channel tiles of 128 (a ``[128, 128]`` float32 accumulator holds 128 registers
    a thread) unless the programs of 128 fill the SMs four times over, else ``m128`` -- what the
    JIT's autotuner chose on an H200 for the layers of ``bench/conv_implicit.py``."""
    return "m64" if block_n >= 128 and programs_128 < 4 * sms else "m128"


def compile_args(spec) -> CompileArgs:
    """The :class:`CompileArgs` of ``spec``, in the kernel's parameter order."""
    t = spec.dtype
    fixed = WINDOWS[spec.window]
    ints = ("tiles", "pixels", "K", "IH", "IW", "OH", "OW", "stride_n", "stride_d", "stride_h", "stride_w",
            "step_h", "step_w", "dil_h", "dil_w", "pad_h", "pad_w", "taps_h", "taps_w")
    types = {"X": f"*{t}", "W": f"*{t}", "Y": f"*{t}", "STEPS": "*i32", "TILES": "*i32"}
    types |= {name: "i32" for name in ints if name not in fixed}
    bm, num_warps, num_stages = TILES[spec.tile]
    consts = dict(DEPTH) | fixed | {"BM": bm, "BN": spec.block_n, "BK": spec.block_k, "ALIGN": 16,
                                    "PRECISION": "ieee", "TRANSPOSED": spec.transposed, "PREFETCH": True}
    divisible = frozenset({"X", "W", "Y", "STEPS", "TILES", "K", "stride_n", "stride_d", "stride_h", "stride_w"})
    return CompileArgs(signature(kernel(spec), types, consts), consts, divisible, num_warps, num_stages)
