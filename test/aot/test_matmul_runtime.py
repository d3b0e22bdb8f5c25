"""The matmul family's C (src/ops/matmul.c) in a kernel library, through ctypes, without a GPU
or TensorFlow: spec selection (as the manifest says it should be), the updat split (the Python
formula), the checks of a call before it touches the GPU, and a clean error without a driver."""
import importlib.util

import pytest

from blocksparse.aot.abi import KernelError
from blocksparse.ops.matmul import configs
from blocksparse.ops.matmul.capi import DTYPES, PRODUCTS, MatmulCall, MatmulRuntime
from blocksparse.ops.matmul.configs import UpdatConfig


@pytest.fixture(scope="module")
def kernels(kernel_library_path):
    """The matmul entry points of the session's kernel library."""
    return MatmulRuntime(kernel_library_path)


def _call(product="fprop", dtype="bf16", bs=32, axis=1, n=64, group=None, split=0, **fields):
    group = group if group is not None else (8 if product == "updat" else 1)
    call = MatmulCall(product=PRODUCTS[product], dtype=DTYPES[dtype], block_size=bs, axis=axis,
                   group=group, split=split, n_tokens=n, c_blocks=4, k_blocks=3, blocks=6, table_rows=4)
    for name, value in {"x": 1 << 20, "dy": 2 << 20, "w": 3 << 20, "y": 4 << 20, "dx": 5 << 20,
                        "dw": 6 << 20, "headers": 7 << 20, "entries": 8 << 20, "groups": 9 << 20,
                        **fields}.items():
        setattr(call, name, value)
    return call


def _serves(target, arch):
    """Whether ``target`` runs on ``sm_{arch}``, written out: sm_XY cubins on later minors of X,
    arch-specific sm_XYa ones on X.Y only, compute_XY PTX on any GPU from X.Y on."""
    kind, number = target.split("_")
    compiled = int(number.rstrip("a"))
    if kind == "compute":
        return compiled <= arch
    return compiled == arch if number.endswith("a") else (compiled // 10 == arch // 10 and compiled <= arch)


#: Shared memory per block (opt-in, KiB) of the GPUs the selection is simulated on.
SHARED_KIB = {75: 64, 80: 163, 86: 99, 89: 99, 90: 227, 100: 227, 120: 99, 130: 99}


def _expected(specs, product, dtype, bs, axis, arch, atomic, n, group):
    """``(name, target)`` of the spec a GPU of ``arch`` should run, from the manifest alone: among
    the specs that run there (within the GPU's shared memory, TMA ones only where rows allow,
    few-token ones only for their token counts, ``n16`` ones only for multiples of 16 tokens, never
    a ``dw16`` updat: these ops take float32 dW), the newest cubin, else the newest PTX; then the
    few-token tile; then TMA; then ``n16``."""
    aligned = axis == 1 or n * (4 if dtype == "fp32" else 2) % 16 == 0
    served = [s for s in specs if _serves(s["target"], arch) and s["shared"] <= SHARED_KIB[arch] * 1024
              and (s["product"], s["dtype"], s["block_size"], s["axis"], s["atomic"], s["group"])
              == (product, dtype, bs, axis, atomic, group)
              and (aligned or "_tma" not in s["kernel"]) and (not s["max_tokens"] or n <= s["max_tokens"])
              and (not s.get("n16") or n % 16 == 0) and not s.get("dw16")]
    served = [s for s in served if s["image"] == "cubin"] or served
    if not served:
        return None
    newest = max(s["arch"] for s in served)
    ranked = sorted((s for s in served if s["arch"] == newest),
                    key=lambda s: (not s["max_tokens"], "_tma" not in s["kernel"], not s.get("n16")))
    return ranked[0]["name"], ranked[0]["target"]


def _many_token_group(specs, product, dtype, bs, axis):
    """``G`` of the TensorFlow ops' tables: the many-token specs'."""
    return next(s["group"] for s in specs if (s["product"], s["dtype"], s["block_size"], s["axis"])
                == (product, dtype, bs, axis) and not s["max_tokens"])


@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90, 100, 120, 130])
@pytest.mark.parametrize("axis, n", [(1, 13), (0, 13), (0, 16), (0, 1), (1, 64), (1, 513), (0, 520), (0, 515)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("product, atomic", [("fprop", False), ("bprop", False), ("fprop", True),
                                             ("updat", False), ("updat", True)])
def test_runtime_selects_the_specialisation(kernels, arch, axis, n, product, atomic):
    spec = kernels.specs[-1]
    dtype, bs = spec["dtype"], spec["block_size"]
    groups = {s["group"] for s in kernels.specs if (s["product"], s["dtype"], s["block_size"], s["axis"])
              == (product, dtype, bs, axis)}
    for group in groups:
        index = kernels.select(_call(product, dtype, bs, axis, n, group), arch, atomic)
        want = _expected(kernels.specs, product, dtype, bs, axis, arch, atomic, n, group)
        got = (kernels.specs[index]["name"], kernels.specs[index]["target"]) if index >= 0 else None
        assert got == want, group


@pytest.mark.parametrize("product", ["fprop", "bprop", "updat"])
def test_few_tokens_get_the_few_token_tile_with_the_tf_tables(kernels, product):
    """The TensorFlow ops' tables (the many-token ``G``): 64 tokens run a few-token spec where one
    reads those tables, 513 the many-token one."""
    spec = kernels.specs[-1]
    dtype, bs = spec["dtype"], spec["block_size"]
    group = _many_token_group(kernels.specs, product, dtype, bs, 1)
    few = [s for s in kernels.specs if (s["product"], s["dtype"], s["block_size"], s["axis"], s["group"],
                                        s["arch"], s["atomic"]) == (product, dtype, bs, 1, group, 90, False)
           and s["max_tokens"]]
    assert any(s["max_tokens"] for s in kernels.specs if s["product"] == product)
    chosen = kernels.specs[kernels.select(_call(product, dtype, bs, 1, 64, group), 90)]
    assert bool(chosen["max_tokens"]) == bool(few) and chosen["group"] == group
    chosen = kernels.specs[kernels.select(_call(product, dtype, bs, 1, configs.SMALL_N + 1, group), 90)]
    assert chosen["max_tokens"] == 0


@pytest.mark.parametrize("axis, n", [(1, 64), (1, 8192), (0, 64), (0, 8192)], ids=lambda v: str(v))
def test_the_tf_ops_never_get_an_updat_writing_16_bit_dw(kernels, axis, n):
    """The library holds updat specs that write 16-bit dW (for the PyTorch plans); the TensorFlow
    ops' selection, whose dW buffer is float32, passes them over for their float32 twins."""
    spec = kernels.specs[-1]
    dtype, bs = spec["dtype"], spec["block_size"]
    twins = [s for s in kernels.specs if s.get("dw16") and (s["product"], s["dtype"], s["axis"]) == ("updat", dtype, axis)]
    assert twins and all(not s["atomic"] for s in twins)
    for group in {s["group"] for s in twins if not s["max_tokens"] or n <= s["max_tokens"]}:
        index = kernels.select(_call("updat", dtype, bs, axis, n, group), 90, False)
        assert index >= 0 and not kernels.specs[index]["dw16"]


def test_runtime_refuses_calls_it_has_no_kernel_for(kernels):
    spec = next(s for s in kernels.specs if s["product"] == "fprop" and s["arch"] == 90)
    call = _call("fprop", spec["dtype"], spec["block_size"], spec["axis"], group=spec["group"])
    assert kernels.select(call, 90) >= 0
    call.group = spec["group"] + 2  # tables built for another G
    assert kernels.select(call, 90) == -1
    call.group, call.block_size = spec["group"], 8
    assert kernels.select(call, 90) == -1
    call.block_size, call.dtype = spec["block_size"], 7
    assert kernels.select(call, 90) == -1


def test_runtime_updat_split_is_the_python_formula(kernels):
    for index, spec in enumerate(kernels.specs):
        if spec["product"] != "updat":
            continue
        cfg = UpdatConfig(**spec["config"])
        for n in (0, 1, 255, 4096, 100_000):
            for rows in (1, 7, 500):
                for sms in (1, 108, 132):
                    assert kernels.updat_split(index, n, rows, sms) == configs.updat_split(cfg, n, rows, sms)


def _index(kernels, **match):
    return next(i for i, s in enumerate(kernels.specs) if all(s[k] == v for k, v in match.items()))


@pytest.mark.parametrize("case, fields, message", [
    ("misaligned", {"x": (1 << 20) + 8}, "x must be a device address aligned to 16 bytes"),
    ("null-weight", {"w": 0}, "w must be a device address"),
    ("wrong-spec", {"axis": 0}, r"serves fprop \w+ bs=\d+ axis=1 G=1; the call is fprop .* axis=0"),
    ("too-many-blocks", {"blocks": 13}, r"blocks must be in \[1, 12\]"),
    ("negative-tokens", {"n_tokens": -1}, "n_tokens must be in"),
])
def test_runtime_checks_a_call_before_touching_the_gpu(kernels, case, fields, message):
    index = _index(kernels, product="fprop", axis=1, arch=90)
    spec = kernels.specs[index]
    call = _call(dtype=spec["dtype"], bs=spec["block_size"], group=spec["group"])
    for name, value in fields.items():
        setattr(call, name, value)
    with pytest.raises(KernelError, match=message) as info:
        kernels.run_spec(index, call)
    assert info.value.status == 1


def test_runtime_refuses_descriptors_on_unaligned_rows(kernels):
    index = _index(kernels, product="bprop", axis=0, arch=90, kernel="xprop_tma_kernel")
    spec = kernels.specs[index]
    with pytest.raises(KernelError, match="not a multiple of 16 bytes"):
        kernels.run_spec(index, _call("bprop", spec["dtype"], spec["block_size"], 0, n=13,
                                      group=spec["group"]))


def test_runtime_updat_split_must_match_the_variant(kernels):
    index = _index(kernels, product="updat", axis=1, arch=90, atomic=False)
    spec = kernels.specs[index]
    with pytest.raises(KernelError, match="needs split == 1; got 3"):
        kernels.run_spec(index, _call("updat", spec["dtype"], spec["block_size"], 1, split=3,
                                      group=spec["group"]))


def test_runtime_without_a_driver_says_so(kernels):
    """On this CPU-only machine a valid call gets as far as opening libcuda."""
    spec = kernels.specs[0]
    call = _call(spec["product"], spec["dtype"], spec["block_size"], spec["axis"], group=spec["group"],
                 split=1)
    if importlib.util.find_spec("torch") and __import__("torch").cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(KernelError, match="libcuda.so.1|cuInit") as info:
        kernels.run(call)
    assert info.value.status == 3
