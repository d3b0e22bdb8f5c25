"""Newer GPUs without a GPU: which compiled image serves a GPU of a given compute capability.

A toy library with arch-specific cubins for sm_90, sm_100 and sm_120 and the PTX of its pointer
kernel (compute_80) is built here; the runtime's selection (``bsk_arch_rank``, ``bsk_spec_rank``
through :meth:`KernelLibrary.find`) is checked against a table written out by hand for simulated
GPUs (8.0, 8.6, 8.9, 9.0, 10.0, 10.3, 12.0, a future 13.0), the Python mirror
(:mod:`blocksparse.aot.targets`) against the C function on every combination, and
``build_info(arch=...)`` against the same table.  Also the targets' parsing and its refusals.
"""
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import blocksparse
from blocksparse import _manifest
from blocksparse.aot import targets
from blocksparse.aot.targets import CUBIN_EXACT, PTX, image_of, parse_gpu, parse_targets, rank, serving

#: Simulated GPUs: compute capability -> (target serving the toy's pointer kernel "scale", target
#: serving its TMA kernel "rows"), as the rule says: a cubin of the arch (sm_80 also serves 8.6 and
#: 8.9; arch-specific sm_XYa only X.Y), else the compute_80 PTX, else nothing.
GPUS = {
    75: (None, None),                                                    # older than any target
    80: ("compute_80", None), 86: ("compute_80", None), 89: ("compute_80", None),  # no sm_80 cubin here
    90: ("sm_90a", "sm_90a"), 100: ("sm_100a", "sm_100a"), 120: ("sm_120a", "sm_120a"),
    103: ("compute_80", None), 121: ("compute_80", None), 130: ("compute_80", None),
}


def _build(out, archs):
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "toy_build.py"), str(out), archs],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    from blocksparse.aot.abi import KernelLibrary

    return KernelLibrary(out / "_kernels.so")


@pytest.fixture(scope="module")
def newer(tmp_path_factory):
    """The toy family for sm_90, sm_100, sm_120 and compute_80."""
    from kernel_build import can_build

    if not can_build():
        pytest.skip("needs the source tree, Triton and a C compiler")
    return _build(tmp_path_factory.mktemp("toy-newer"), "sm_90,sm_100,sm_120,compute_80")


# ------------------------------------------------------------------ what the build holds


def test_the_build_holds_arch_specific_cubins_and_the_pointer_kernel_s_ptx(newer):
    assert newer.archs == (90, 100, 120) and newer.ptx == (80,)
    assert newer.manifest["archs"] == ["sm_90", "sm_100", "sm_120"] and newer.manifest["ptx"] == ["compute_80"]
    by_target = {(s["op"], s["target"]): s for s in newer.specs}
    assert sorted(by_target) == sorted([(op, t) for op in ("scale", "rows") for t in ("sm_90a", "sm_100a", "sm_120a")]
                                       + [("scale", "compute_80")])  # the TMA kernel has no PTX
    ptx = by_target[("scale", "compute_80")]
    assert ptx["image"] == "ptx" and ptx["arch"] == 80 and re.fullmatch(r"\d+\.\d+", ptx["ptx_isa"])
    assert all(s["image"] == "cubin" and "ptx_isa" not in s for s in newer.specs if s is not ptx)


def test_the_ptx_is_embedded_as_text_the_driver_can_jit(newer):
    out = Path(newer.path).parent
    text = (out / "cubins" / "toy_scale_b128_sm80_ptx.ptx").read_bytes()
    assert text.endswith(b"\0") and b"\0" not in text[:-1]  # cuModuleLoadData reads PTX up to its NUL
    assert re.search(rb"^\.target sm_80\s*$", text, re.M) and b"sm_80a" not in text
    assert b".entry scale_kernel" in text
    index = next(i for i, s in enumerate(newer.specs) if s["target"] == "compute_80")
    assert newer._lib.bsk_spec_image(index) == PTX
    assert [newer._lib.bsk_spec_image(i) for i, s in enumerate(newer.specs) if s["image"] == "cubin"] == \
        [CUBIN_EXACT] * 6
    assert newer._lib.bsk_spec_image(len(newer.specs)) == -1


# ------------------------------------------------------------------ selection on simulated GPUs


@pytest.mark.parametrize("gpu", sorted(GPUS), ids=lambda a: f"sm_{a}")
def test_the_runtime_takes_the_cubin_of_the_gpu_else_the_ptx_else_nothing(newer, gpu):
    for op, want in zip(("scale", "rows"), GPUS[gpu]):
        index = newer.find("toy", gpu, op=op)
        assert (newer.specs[index]["target"] if index is not None else None) == want, op


@pytest.mark.parametrize("gpu", sorted(GPUS), ids=lambda a: f"sm_{a}")
def test_build_info_says_which_image_serves_a_gpu(newer, gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("BLOCKSPARSE_KERNELS", newer.path)
    monkeypatch.setattr(_manifest, "MANIFEST", tmp_path / "absent.json")  # no TF op library here
    want = GPUS[gpu][0]
    for arch in (gpu, f"sm_{gpu}", f"{gpu // 10}.{gpu % 10}", (gpu // 10, gpu % 10)):
        info = blocksparse.build_info(arch=arch)
        kernels = info["kernels"]
        assert kernels["launch"] == "aot" and kernels["archs"] == ["sm_90", "sm_100", "sm_120"]
        assert kernels["ptx"] == ["compute_80"]
        expected = {"arch": f"sm_{gpu}", "image": "ptx" if want == "compute_80" else "cubin" if want else None,
                    "target": want}
        assert kernels["serving"] == (expected if want else {**expected, "fallback": "jit"})
        assert info["serving"] == {"arch": f"sm_{gpu}", "image": None, "target": None, "fallback": "reference"}


def test_build_info_without_arch_names_no_gpu(newer, monkeypatch):
    monkeypatch.setenv("BLOCKSPARSE_KERNELS", newer.path)
    info = blocksparse.build_info()
    assert "serving" not in info and "serving" not in info["kernels"]
    monkeypatch.setenv("BLOCKSPARSE_KERNELS", "jit")
    jit = blocksparse.build_info(arch=100)["kernels"]
    assert jit["launch"] == "jit" and jit["serving"]["fallback"] == "jit" and "archs" not in jit


def test_build_info_says_jit_for_a_file_that_is_no_kernel_library(monkeypatch, tmp_path):
    bad = tmp_path / "_kernels.so"
    bad.write_bytes(b"\x7fELF, truncated")
    monkeypatch.setenv("BLOCKSPARSE_KERNELS", str(bad))
    kernels = blocksparse.build_info()["kernels"]
    assert kernels["launch"] == "jit" and kernels["library"] is None and "no build manifest" in kernels["reason"]


def test_the_tensorflow_op_library_s_manifest_is_read_the_same_way(newer, monkeypatch, tmp_path):
    """``build_info()``'s TensorFlow part reads ``_build_info.json`` (what scripts/build_ops.py writes)."""
    manifest = tmp_path / "_build_info.json"
    manifest.write_text(json.dumps({"compiled": True, "archs": newer.manifest["archs"], "ptx": ["compute_80"],
                                    "specializations": newer.specs}))
    monkeypatch.setattr(_manifest, "MANIFEST", manifest)
    for gpu, (want, _) in GPUS.items():
        serving_ = blocksparse.build_info(arch=gpu)["serving"]
        assert serving_["target"] == want and (want is not None or serving_["fallback"] == "reference")


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_100", "sm_90a", "sm_100a", "sm_103a", "sm_120a",
                                    "compute_80", "compute_86", "compute_89"])
def test_the_python_mirror_is_the_runtime_s_rule(newer, target):
    compiled, image = image_of(target)
    for gpu in (75, 80, 86, 89, 90, 100, 103, 110, 120, 121, 130, 200):
        assert rank(target, gpu) == newer.arch_rank(compiled, image, gpu), (target, gpu)
    assert newer.arch_rank(compiled, 7, 90) == 0  # an unknown image serves nothing


def test_the_shared_memory_table_is_the_runtime_s(newer):
    for gpu in (75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121, 130):
        assert targets.shared_limit(gpu) == newer.shared_limit(gpu), gpu
    assert newer.shared_limit(80) == 163 * 1024 and newer.shared_limit(86) == newer.shared_limit(120) == 99 * 1024
    assert newer.shared_limit(90) == newer.shared_limit(100) == 227 * 1024 and newer.shared_limit(130) == 99 * 1024
    # every spec of the build: the C rank (shared memory included) is the mirror's
    for index, spec in enumerate(newer.specs):
        for gpu in GPUS:
            assert newer.rank(index, gpu) == targets.spec_rank(spec, gpu), (spec["name"], spec["target"], gpu)


def test_a_spec_needing_more_shared_memory_than_the_gpu_offers_does_not_serve_it():
    """A float32 sm_80 kernel of 128 KiB: the sm_80 cubin runs on 8.0 (163 KiB) but not on 8.6 /
    8.9 (99 KiB); its PTX serves 9.0 and 10.0 (227 KiB), not 12.0 or an unknown GPU."""
    big = [{"arch": 80, "image": "cubin", "target": "sm_80", "shared": 128 * 1024},
           {"arch": 80, "image": "ptx", "target": "compute_80", "shared": 128 * 1024}]
    want = {80: "sm_80", 86: None, 89: None, 90: "compute_80", 100: "compute_80", 120: None, 130: None}
    assert {gpu: serving(big, gpu, "jit")["target"] for gpu in want} == want
    small = [{**s, "shared": 99 * 1024} for s in big]
    assert serving(small, 86, "jit")["target"] == "sm_80" and serving(small, 130, "jit")["target"] == "compute_80"


def test_the_rule_prefers_any_cubin_then_the_newest_arch():
    assert rank("sm_80", 86) > rank("compute_86", 86) > rank("compute_80", 86) > 0
    assert rank("sm_86", 89) > rank("sm_80", 89) > 0 and rank("sm_86", 80) == 0
    assert rank("sm_90a", 90) > 0 and rank("sm_90a", 100) == rank("sm_100a", 103) == 0
    assert rank("sm_100", 103) > 0  # a family-portable sm_100 cubin (not what Triton emits) would serve 10.3
    assert rank("compute_80", 79) == 0 and rank("compute_80", 130) > 0


def test_a_ptx_only_library_serves_every_newer_gpu():
    specs = [{"arch": 80, "image": "ptx", "target": "compute_80"}]
    for gpu in (80, 86, 89, 90, 100, 120, 130):
        assert serving(specs, gpu, "jit") == {"arch": f"sm_{gpu}", "image": "ptx", "target": "compute_80"}
    assert serving(specs, 75, "jit")["fallback"] == "jit" and serving((), 90, "x")["image"] is None


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize("text, want", [
    ("sm_80,sm_90,sm_100,sm_120,compute_80", ((80, 90, 100, 120), (80,))),
    ("compute_86 sm_90a 90", ((90,), (86,))),
    (["sm_120", "compute_80", "compute_80"], ((120,), (80,))),
], ids=["matrix-default", "mixed", "list"])
def test_parse_targets(text, want):
    assert parse_targets(text) == want
    assert str(parse_targets(text)) == ",".join([*(f"sm_{a}" for a in want[0]), *(f"compute_{a}" for a in want[1])])


@pytest.mark.parametrize("text, message", [
    ("compute_90", "compute_80 to compute_89"), ("compute_100", "compute_80 to compute_89"),
    ("compute_70", "sm_80 or newer"), ("sm_100f", "like sm_80, 90 or compute_80"), (" ", "at least one"),
], ids=["ptx-sm90", "ptx-sm100", "ptx-sm70", "family-suffix", "empty"])
def test_parse_targets_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_targets(text)


@pytest.mark.parametrize("arch, want", [(100, 100), ("sm_120", 120), ("sm_90a", 90), ("10.3", 103), ((13, 0), 130)],
                         ids=["int", "sm", "sm-a", "dotted", "tuple"])
def test_parse_gpu(arch, want):
    assert parse_gpu(arch) == want


@pytest.mark.parametrize("arch", [0, -90, 1000, 5, "ten", "compute_80", "sm_1000", (10,), (10.0, 0), (10, 10),
                                  (True, 0)],
                         ids=["zero", "negative", "four-digits", "one-digit", "word", "ptx", "sm-four-digits",
                              "short-tuple", "float-tuple", "minor-10", "bool-tuple"])
def test_parse_gpu_refuses(arch):
    with pytest.raises(ValueError, match="arch must be a compute capability like 100"):
        parse_gpu(arch)


@pytest.mark.parametrize("arch", [True, 9.0, None, [9, 0]], ids=["bool", "float", "none", "list"])
def test_parse_gpu_refuses_other_types(arch):
    with pytest.raises(ValueError, match="arch must be a compute capability like 100"):
        parse_gpu(arch)


def test_build_info_refuses_a_bad_arch():
    with pytest.raises(ValueError, match="arch must be a compute capability"):
        blocksparse.build_info(arch="sm_x")


def test_image_of_refuses_unknown_targets():
    assert image_of("sm_90a") == (90, CUBIN_EXACT) and image_of("compute_80") == (80, PTX)
    with pytest.raises(ValueError, match="target must be like sm_80"):
        targets.image_of("compute_90a")


def test_the_build_leaves_out_cubins_their_own_gpu_cannot_launch(monkeypatch, tmp_path):
    """A cubin needing more shared memory than its GPU offers is dropped (and named); PTX is kept:
    it serves the GPUs that have enough."""
    import blocksparse.aot as aot
    from blocksparse.aot.compile import CompiledKernel, Param

    def kernel(name, arch, shared, ptx=False):
        spec = SimpleNamespace(name=name, arch=arch)
        return CompiledKernel("toy", spec, {"op": name}, "scale_kernel", b"\0" * 8, "scale_kernel", 4, 1, shared,
                              (Param("X", "ptr", True, 0, "*fp32"),), (), {},
                              f"compute_{arch}" if ptx else f"sm_{arch}{'a' if arch >= 90 else ''}", "8.7")

    compiled = [kernel("fits", 120, 99 * 1024), kernel("big", 120, 99 * 1024 + 1), kernel("big", 90, 200_000),
                kernel("big", 80, 200_000, ptx=True)]
    toy = SimpleNamespace(name="toy", leaner=lambda spec: None)  # no leaner tile: the PTX stays as it is
    monkeypatch.setattr(aot, "compile_specs", lambda work, jobs=None: compiled)
    monkeypatch.setattr(aot, "collect", lambda archs, families=None, **fields: [(toy, None)])
    source, manifest = aot.build_sources(parse_targets("sm_90,sm_120,compute_80"), tmp_path)
    assert [(s["name"], s["target"]) for s in manifest["specializations"]] == [
        ("fits", "sm_120a"), ("big", "sm_90a"), ("big", "compute_80")]
    assert manifest["dropped"] == [f"toy/big: {99 * 1024 + 1} bytes of shared memory"]
    assert manifest["ptx_oversized"] == ["toy/big: 200000 bytes of shared memory"]
    text = source.read_text()
    assert "bsk_cubin_toy_big_ptx" in text and "launch_toy_fits(" in text and text.count("launch_toy_big(") == 1
    assert sorted(p.name for p in (tmp_path / "cubins").iterdir()) == ["toy_big.cubin", "toy_big_ptx.ptx",
                                                                       "toy_fits.cubin"]


@pytest.mark.parametrize("stages, fitted", [(4, 2), (2, 2)], ids=["refitted", "already-fits"])
def test_ptx_is_refitted_to_the_shared_memory_of_an_unknown_gpu(monkeypatch, tmp_path, stages, fitted):
    """A PTX kernel over what an unknown GPU offers is recompiled with its family's leaner tiles until
    it fits; cubins are left alone."""
    import blocksparse.aot as aot
    from blocksparse.aot.compile import CompiledKernel, Param

    def compile_one(family, spec, ptx):
        shared = spec.stages * 40 * 1024  # 40 KiB per stage: 99 KiB holds two, sm_80 four
        target = f"compute_{spec.arch}" if ptx else f"sm_{spec.arch}"
        return CompiledKernel("toy", spec, {"op": spec.name}, "scale_kernel", b"\0" * 8, "scale_kernel", 4,
                              spec.stages, shared, (Param("X", "ptr", True, 0, "*fp32"),), (), {}, target, "8.7")

    calls = []

    def compile_specs(work, jobs=None):
        calls.append(len(work))
        return [compile_one(*job) for job in work]

    toy = SimpleNamespace(name="toy", leaner=lambda spec: (SimpleNamespace(name=spec.name, arch=spec.arch,
                                                                             stages=spec.stages - 1)
                                                           if spec.stages > 1 else None))
    spec = SimpleNamespace(name="k", arch=80, stages=stages)
    monkeypatch.setattr(aot, "compile_specs", compile_specs)
    monkeypatch.setattr(aot, "collect", lambda archs, families=None, **fields: [(toy, spec)])
    _, manifest = aot.build_sources(parse_targets("sm_80,compute_80"), tmp_path)
    images = {s["target"]: s for s in manifest["specializations"]}
    assert images["compute_80"]["num_stages"] == fitted and images["compute_80"]["shared"] <= 99 * 1024
    assert images["sm_80"]["num_stages"] == stages  # a cubin's GPU is known: its tile stays
    assert manifest["ptx_oversized"] == [] and calls == [2] + [1] * (stages - fitted)


def test_matmul_leaner_tiles_shrink_and_end():
    """The matmul family's leaner tiles: fewer stages, then fewer tokens per step, the tables' G kept."""
    from blocksparse.ops.matmul import aot as matmul_aot
    from blocksparse.ops.matmul.configs import aot_specializations

    for spec in aot_specializations((80,), dtypes=("fp32",), block_sizes=(128,)):
        seen, step = [], spec
        while step is not None:
            seen.append(step.config)
            step = matmul_aot.leaner(step)
        tokens = "BK" if spec.product == "updat" else "BM"
        sizes = [(c.num_stages, getattr(c, tokens)) for c in seen]
        assert sizes[-1] == (1, 16) and len(set(sizes)) == len(sizes), spec.name
        assert {c.G for c in seen} == {spec.config.G}, spec.name
