"""The ahead-of-time side of the TensorFlow GPU path, without a GPU: the matmul spec list, the
compile arguments, the arch resolution, the op library's kernel library, the wheel's platform
tag, and scripts/verify_aot.py --dry-run.  The runtime's choices and checks: test/aot/."""
import importlib.util
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from blocksparse.ops.matmul import configs
from blocksparse.aot import DEFAULT_ARCHS, parse_archs, resolve_archs
from blocksparse.ops.matmul.aot import compile_args, kernel_function
from blocksparse.ops.matmul.configs import KERNEL_BLOCK_SIZES, UpdatConfig, aot_specializations

from tf_op_build import BUILD_SCRIPT, ROOT, can_build

ALL = aot_specializations((80, 90))


# ------------------------------------------------------------------- the list


def test_every_product_has_kernels_on_every_arch():
    for arch in (80, 90):
        for dtype in configs.AOT_DTYPES:
            for bs in KERNEL_BLOCK_SIZES:
                for axis in (1, 0):
                    mine = [s for s in ALL if (s.arch, s.dtype, s.block_size, s.axis) == (arch, dtype, bs, axis)]
                    for product in ("fprop", "bprop"):
                        assert [s.atomic for s in mine if s.product == product][:1] == [False]
                    assert {s.atomic for s in mine if s.product == "updat"} == {False, True}


def test_names_are_unique_c_identifiers():
    names = [s.name for s in ALL]
    # 496 for many tokens, 694 for few (298 n16, 86 dw16, 326 ticket twins in all, 142 packed twins; the
    # few-token (F, N) updat for unaligned token counts is the many-token one except on sm_90 at blocks of 32 and 64)
    assert len(set(names)) == len(names) == 1190
    assert sum(s.pack > 1 for s in ALL) == 142
    assert all(n.isidentifier() for n in names)


def test_no_tma_kernel_before_sm90_and_split_xprop_only_for_few_tokens():
    assert not [s for s in ALL if s.arch < 90 and s.tma]
    split = [s for s in ALL if s.product != "updat" and s.atomic]
    assert split and all(s.max_tokens == configs.SMALL_N and s.config.WAVES for s in split)


def test_pointer_kernels_stand_in_for_tma_ones_with_the_same_group():
    """(F, N) activations whose rows descriptors cannot address run on pointer kernels that read
    the same tables: every product has one G per arch and token class."""
    by_key = {}
    for s in ALL:
        by_key.setdefault((s.arch, s.product, s.dtype, s.block_size, s.axis, s.max_tokens), []).append(s)
    for key, specs in by_key.items():
        assert len({s.group for s in specs}) == 1, key
        if key[0] == 90 and key[4] == 0 and any(s.tma for s in specs):
            # a few-token stand-in equal to the many-token one is that one (it serves every count)
            either = specs + by_key.get((*key[:5], 0), [])
            assert any(not s.tma and s.group == specs[0].group for s in either), key


@pytest.mark.parametrize("max_tokens, n", [(0, configs.SMALL_N + 16), (configs.SMALL_N, 64)], ids=["many", "few"])
def test_the_list_uses_the_tiles_of_the_jit_path(max_tokens, n):
    """Many-token specs have the JIT's tiles for many tokens, few-token specs those for N = 64; the
    (F, N) pointer updat specs that serve token counts not a multiple of 16, those for N - 1."""
    for s in ALL:
        if s.max_tokens != max_tokens:
            continue
        float32 = s.dtype == "fp32"
        if s.product == "updat":
            odd = s.axis == 0 and not (s.n16 or s.tma)
            opts = dict(float32=float32, axis=s.axis)
            tiles = configs.updat_config(s.block_size, n - odd, tma=s.arch >= 90, **opts)
            if not s.tma and tiles.TMA:  # the pointer stand-in
                tiles = replace(configs.updat_config(s.block_size, n - odd, tma=False, **opts), G=s.group)
        else:
            tiles = configs.xprop_config(s.block_size, n, float32=float32, tma=s.arch >= 90, axis=s.axis)
            if not s.tma and tiles.TMA:  # the pointer stand-in (a TMA table's pointer tile serves as is)
                tiles = configs.xprop_config(s.block_size, n, float32=float32, tma=False, axis=s.axis)
            tiles = replace(tiles, G=s.group)
        assert s.config == tiles, s.name


def test_few_token_tiles_are_compiled_for_every_product():
    """Every (arch, dtype, block size, axis, product) whose JIT tile for 64 tokens is not the one
    for many has few-token specs, none a copy of a many-token one (which serves every count)."""
    for arch in (80, 90):
        for dtype in configs.AOT_DTYPES:
            for bs in KERNEL_BLOCK_SIZES:
                for axis in (1, 0):
                    for product in ("fprop", "bprop", "updat"):
                        mine = [s for s in ALL if (s.arch, s.dtype, s.block_size, s.axis, s.product)
                                == (arch, dtype, bs, axis, product)]
                        few = {(s.kernel, s.atomic, s.config) for s in mine if s.max_tokens}
                        many = {(s.kernel, s.atomic, s.config) for s in mine if not s.max_tokens}
                        key = (arch, dtype, bs, axis, product)
                        tiles = configs.updat_config if product == "updat" else configs.xprop_config
                        opts = dict(float32=dtype == "fp32", tma=arch >= 90)
                        if tiles(bs, 64, **opts) != tiles(bs, configs.SMALL_N + 1, **opts):
                            assert few, key
                        assert not few & many, key
                        if product == "updat":
                            assert {a for _, a, _ in few} in (set(), {False, True}), key


def test_few_token_names_say_so():
    few = [s for s in ALL if s.max_tokens]
    assert few and all("_few_" in s.name for s in few)
    assert not [s for s in ALL if not s.max_tokens and "_few_" in s.name]


def test_filters():
    specs = aot_specializations((90,), dtypes=("fp32",), block_sizes=(128,))
    assert {(s.dtype, s.block_size) for s in specs} == {("fp32", 128)}


def test_updat_split_formula():
    cfg = UpdatConfig(G=1, BK=64, num_warps=4, num_stages=3, WAVES=2)
    assert configs.updat_split(cfg, 10_000, 10, 132) == 26      # by waves: 2 * 132 // 10
    assert configs.updat_split(cfg, 1_000, 10, 132) == 4        # by tokens: ceil(1000 / 256)
    assert configs.updat_split(cfg, 0, 10, 132) == 1
    assert configs.updat_split(cfg, 10_000, 1_000, 132) == 1


# ------------------------------------------------------------ compile arguments


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.name)
def test_compile_args_name_every_kernel_parameter(spec):
    pytest.importorskip("triton")
    args = compile_args(spec)
    fn = kernel_function(spec.kernel)
    assert list(args.signature) == list(fn.arg_names)
    assert set(args.constexprs) == {n for n, t in args.signature.items() if t == "constexpr"}
    assert args.divisible <= {n for n, t in args.signature.items() if t != "constexpr"}
    unit = [n for n, v in args.constexprs.items() if n.startswith("stride_")]
    assert all(args.constexprs[n] == 1 for n in unit)
    assert all(n.endswith("f" if spec.axis == 1 else "n") for n in unit)
    descs = [t for t in args.signature.values() if t.startswith("tensordesc")]
    assert bool(descs) == spec.tma
    if spec.product != "updat":
        assert args.constexprs["TRANS_W"] == spec.trans_w


def test_bprop_reads_pretransposed_weight_in_float32_only():
    """As the JIT launcher: float32 bprop multiplies by blocks transposed beforehand."""
    for s in ALL:
        assert s.trans_w == (s.product == "bprop" and s.dtype != "fp32"), s.name


# ---------------------------------------------------------------------- archs


@pytest.mark.parametrize("text, archs, ptx", [("sm_80,sm_90", (80, 90), ()), ("90 80 90", (80, 90), ()),
                                              (["sm_90a"], (90,), ()), ("sm_100", (100,), ()),
                                              ("sm_100,sm_120,compute_80", (100, 120), (80,)),
                                              ("compute_86", (), (86,))])
def test_parse_archs(text, archs, ptx):
    assert parse_archs(text) == (archs, ptx)


@pytest.mark.parametrize("text, message", [("sm_75", "sm_80 or newer"), ("compute_90", "compute_80 to compute_89"),
                                           ("compute_75", "sm_80 or newer"), ("compute_80a", "like sm_80"),
                                           ("", "at least one")])
def test_parse_archs_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_archs(text)


def test_resolve_archs(monkeypatch, tmp_path):
    pytest.importorskip("yaml")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("defaults:\n  archs: [sm_80]\nbuilds:\n  - tensorflow: '2.21'\n    archs: [sm_90]\n"
                      "  - tensorflow: '2.20'\n")
    monkeypatch.delenv("BLOCKSPARSE_CUDA_ARCHS", raising=False)
    assert resolve_archs(None, "2.21.0", matrix) == ((90,), ())
    assert resolve_archs(None, "2.20.1", matrix) == ((80,), ())
    assert resolve_archs(None, "2.19.0", matrix) == ((80,), ())
    assert resolve_archs(None, "2.21.0", tmp_path / "absent.yaml") == DEFAULT_ARCHS == ((80, 90), ())
    monkeypatch.setenv("BLOCKSPARSE_CUDA_ARCHS", "sm_80,sm_90,compute_80")
    assert resolve_archs(None, "2.21.0", matrix) == ((80, 90), (80,))
    assert resolve_archs("sm_90", "2.21.0", matrix) == ((90,), ())


def _mm(target, group, shared=0, product="fprop", axis=1, tma=False):
    arch = int(target.split("_")[1].rstrip("a"))
    return {"family": "matmul", "arch": arch, "target": target, "image": "ptx" if "compute" in target else "cubin",
            "product": product, "dtype": "bf16", "block_size": 32, "axis": axis, "group": group, "shared": shared,
            "tma": tma}


@pytest.mark.parametrize("arch, group", [(80, 1), (86, None), (90, 4), (100, 2), (103, 2), (120, None), (130, None)],
                         ids=lambda v: str(v))
def test_the_tf_tables_follow_the_runtime_s_choice(arch, group):
    """``OpLibrary.group``: the G of the kernels the runtime would pick -- a cubin of the GPU, else
    the PTX, within the GPU's shared memory (here 128 KiB kernels: too much for 8.6 and 12.x)."""
    from blocksparse._tf.loader import OpLibrary

    big = 128 * 1024
    lib = OpLibrary("lib.so", None, (_mm("sm_80", 1, big), _mm("sm_90a", 4), _mm("compute_80", 2, big),
                                     _mm("sm_90a", 4, product="bprop"), _mm("compute_80", 3, product="bprop")))
    assert lib.archs == (80, 90) and lib.ptx == (80,)
    assert lib.group(arch, "fprop", "bf16", 32, 1) == group
    assert lib.group(arch, "fprop", "bf16", 32, 0) is None  # no kernels for that axis
    assert lib.group(arch, "bprop", "bf16", 32, 1) == {90: 4}.get(arch, 3 if arch >= 80 else None)


@pytest.mark.parametrize("arch, group", [(90, 4), (100, 2), (120, None)], ids=lambda v: str(v))
def test_on_axis_0_the_tf_tables_are_those_of_a_pointer_kernel(arch, group):
    """(F, N) activations: whether descriptors can address the rows is known only when the op runs,
    so a pointer kernel must serve -- its G, which the runtime's TMA kernel shares where it exists."""
    from blocksparse._tf.loader import OpLibrary

    big = 128 * 1024
    lib = OpLibrary("lib.so", None, (
        _mm("sm_90a", 4, axis=0, tma=True), _mm("sm_90a", 4, axis=0),     # TMA + its stand-in, one G
        _mm("sm_100a", 4, axis=0, tma=True), _mm("sm_120a", 4, axis=0, tma=True),
        _mm("compute_80", 2, big, axis=0)))                                  # 128 KiB: not on 12.x
    assert lib.group(arch, "fprop", "bf16", 32, 0) == group


def test_the_tf_tables_refuse_kernels_of_one_rank_with_different_groups():
    from blocksparse._tf.loader import OpLibrary

    lib = OpLibrary("lib.so", None, (_mm("sm_90a", 4), _mm("sm_90a", 2)))
    with pytest.raises(RuntimeError, match=r"on sm_90 read tables of different G"):
        lib.group(90, "fprop", "bf16", 32, 1)


# ------------------------------------------------------- the op library's kernels


def test_the_op_library_reaches_its_kernel_library(op_library_path):
    """The ops call the kernel library linked beside them: its runtime and manifest are reachable
    through the op library (loaded by TensorFlow first: it needs libtensorflow_framework)."""
    pytest.importorskip("tensorflow")
    from blocksparse._tf import loader as ops
    from blocksparse.aot.abi import KernelLibrary

    lib, why = ops.load(str(op_library_path))
    assert lib is not None, why
    direct = KernelLibrary(op_library_path.with_name("_kernels.so"))
    assert [s["name"] for s in lib.specs] == [s["name"] for s in direct.specs]
    assert {s["family"] for s in lib.specs} == {"matmul"}


def test_another_kernel_library_in_the_process_is_not_the_op_library_s(toy_library, op_library_path):
    """Kernel libraries carry no soname: one loaded by path before (the toy family's, or one
    BLOCKSPARSE_KERNELS names) is not taken for the file beside the op library."""
    pytest.importorskip("tensorflow")
    from blocksparse._tf import loader as ops
    from blocksparse.aot.abi import KernelLibrary

    assert {s["family"] for s in toy_library.specs} == {"toy"}
    lib, why = ops.load(str(op_library_path))
    assert lib is not None, why
    assert {s["family"] for s in KernelLibrary(op_library_path).specs} == {"matmul"}


# ------------------------------------------------------------------ platform tag


@pytest.fixture(scope="module")
def build_ops():
    spec = importlib.util.spec_from_file_location("build_ops", BUILD_SCRIPT)
    if not BUILD_SCRIPT.is_file():
        pytest.skip("needs the source tree")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("versions, tag", [
    ({"GLIBC": "2.14", "GLIBCXX": "3.4.19", "CXXABI": "1.3.7"}, "manylinux_2_17_x86_64"),
    ({"GLIBC": "2.14", "GLIBCXX": "3.4.21", "CXXABI": "1.3.9"}, "manylinux_2_24_x86_64"),
    ({"GLIBC": "2.27", "GLIBCXX": "3.4.22"}, "manylinux_2_27_x86_64"),
    ({"GLIBC": "2.34", "GLIBCXX": "3.4.29", "GCC": "3.0"}, "manylinux_2_34_x86_64"),
    ({"GLIBC": "2.36", "GLIBCXX": "3.4.30"}, "manylinux_2_36_x86_64"),
    ({"GLIBC": "2.17", "GLIBCXX": "3.4.32"}, "manylinux_2_39_x86_64"),
])
def test_platform_tag_follows_symbol_versions(build_ops, versions, tag):
    assert build_ops.platform_tag(versions, machine="x86_64") == tag


def test_platform_tag_elsewhere_is_plain_linux(build_ops):
    assert build_ops.platform_tag({"GLIBC": "2.17"}, machine="aarch64") == "linux_aarch64"


def test_platform_tag_refuses_what_no_policy_allows(build_ops):
    with pytest.raises(build_ops.BuildError, match="newer than every manylinux policy"):
        build_ops.platform_tag({"GLIBCXX": "3.4.99"}, machine="x86_64")


# ------------------------------------------------------------- verify_aot --dry-run


@pytest.mark.skipif(not can_build(), reason="needs the source tree, Triton and a C compiler")
def test_verify_script_dry_run(tmp_path):
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "verify_aot.py"), "--dry-run",
                           "--archs", "sm_90,compute_80", "--dtypes", "fp16", "--block-sizes", "16",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "aot-verify.json").read_text())
    assert result["dry_run"] is True and result["gpu"] is None and result["archs"] == ["sm_90", "compute_80"]
    # blocks of 16: their specs include the packed ones (weights stored as blocks of 48)
    cubins, ptx = (aot_specializations((arch,), dtypes=("fp16",), block_sizes=(16,)) for arch in (90, 80))
    assert any(s.pack == 3 for s in cubins)
    assert [k["target"] for k in result["kernels"]] == ["sm_90a"] * len(cubins) + ["compute_80"] * len(ptx)
    assert all(k["status"] == "compiled" for k in result["kernels"])
    # selection: each sm_90 kernel on sm_90, each PTX kernel on a GPU no cubin serves
    assert result["selection_mismatches"] == [] and result["packing_mismatches"] == []
    assert "dry run" in (tmp_path / "aot-verify.md").read_text()
