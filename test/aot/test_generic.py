"""The generic AOT path with a family it has never seen (``toy_family``): registration, spec
collection and filters, what compilation records (arguments, kinds, hints, descriptor maps), the
generated C (launchers, argument tables, keys) and the manifest; codegen's refusals."""
import re
from types import SimpleNamespace

import pytest

import toy_family  # after conftest's torch_setup: see test/aot/conftest.py
from blocksparse.aot import ABI_VERSION, collect, parse_filters
from blocksparse.aot.codegen import c_keys, generate
from blocksparse.aot.compile import CompiledKernel, Param, TensorMap, launch_param_bytes
from blocksparse.aot.family import CompileArgs, Family, registered

TOY = Family("toy", toy_family)


# ------------------------------------------------------------------ registration


def test_the_registered_families_are_ops_aot_families():
    from blocksparse.ops import AOT_FAMILIES

    families = registered()
    assert [f.name for f in families] == list(AOT_FAMILIES)
    assert all(f.module.__name__ == f"blocksparse.ops.{f.name}.aot" for f in families)


def test_a_family_module_must_define_the_four_functions():
    partial = SimpleNamespace(__name__="half_done", specializations=lambda archs: [], kernel=lambda s: None)
    with pytest.raises(TypeError, match="half_done must define specializations, kernel, compile_args, "
                                        "fields; it lacks compile_args, fields"):
        Family("half", partial)
    with pytest.raises(ValueError, match="identifiers; got 'two words'"):
        Family("two words", toy_family)


def test_collect_takes_every_spec_of_the_families_for_the_archs():
    work = collect((80, 90), [TOY])
    assert [(f.name, s.name) for f, s in work] == [("toy", "scale_b128_sm80"), ("toy", "scale_b128_sm90"),
                                                   ("toy", "rows_b64_sm90")]


def test_filters_apply_to_the_fields_a_spec_has():
    assert [s.name for _, s in collect((90,), [TOY], dtype=("fp16",))] == ["rows_b64_sm90"]
    assert [s.name for _, s in collect((90,), [TOY], op=("scale",))] == ["scale_b128_sm90"]
    # a field the family's specs lack filters nothing out
    assert len(collect((90,), [TOY], block_size=(32,))) == 2
    assert parse_filters("bf16,fp32", "32,64", "matmul") == {"dtype": ("bf16", "fp32"), "block_size": (32, 64),
                                                             "families": ("matmul",)}


def test_matmul_registers_through_the_same_interface():
    matmul = registered(["matmul"])[0]
    specs = matmul.specializations((90,))
    # 248 for many tokens, 376 for few (106 n16, 52 dw16, 168 ticket twins and 72 packed twins of the
    # (N, F) specs without atomics at blocks of 16 and 128, in all; the few-token (F, N) updat for
    # unaligned token counts differs from the many-token one only at blocks of 32 and 64)
    assert len(specs) == 624
    assert sum(s.pack > 1 for s in specs) == 72
    fields = matmul.fields(specs[0])
    assert {"product", "dtype", "block_size", "axis", "group", "atomic", "tma", "max_tokens", "config"} <= set(fields)
    args = matmul.compile_args(specs[0])
    assert isinstance(args, CompileArgs) and args.num_warps == specs[0].config.num_warps


# ------------------------------------------------------------------ what a build records


@pytest.fixture(scope="module")
def manifest(toy_library):
    """The manifest embedded in the toy library (``bsk_manifest``)."""
    return toy_library.manifest


def test_the_manifest_records_arguments_constexprs_and_fields(manifest):
    assert manifest["abi"] == ABI_VERSION and manifest["families"] == ["toy"]
    assert manifest["archs"] == ["sm_80", "sm_90"] and manifest["ptx"] == []
    scale, rows = manifest["specializations"][1:]
    assert [(p["name"], p["kind"], p["type"], p["divisible"]) for p in scale["params"]] == [
        ("X", "ptr", "*fp32", True), ("Y", "ptr", "*fp32", True), ("N", "i32", "i32", False),
        ("offset", "i64", "i64", True), ("alpha", "f32", "fp32", False)]
    assert scale["constexprs"] == {"BLOCK": 128} and scale["kernel"] == "scale_kernel"
    assert (scale["family"], scale["op"], scale["block"], scale["tile"]) == ("toy", "scale", 128, {"block": 128})
    assert [(p["name"], p["kind"], p["rank"]) for p in rows["params"]] == [
        ("x_desc", "tensor", 2), ("Y", "ptr", 0), ("stride_y", "i32", 0), ("n_rows", "i64", 0)]
    assert rows["tensormaps"] == [{"param": "x_desc", "box": [64, 32]}]
    assert all(s["cubin_bytes"] > 0 and s["num_warps"] == 4 for s in manifest["specializations"])


def test_the_generated_launchers_pass_triton_s_parameter_list(toy_build):
    text = (toy_build / "bsk_specs.c").read_text()
    scale = text[text.index("launch_toy_scale_b128_sm90("):]
    params = re.search(r"void \*params\[\] = \{(.*?)\};", scale, re.S).group(1).split(",")
    assert [p.strip() for p in params] == ["(void *)&a[0].value.ptr", "(void *)&a[1].value.ptr",
                                           "(void *)&a[2].value.i32", "(void *)&a[3].value.i64",
                                           "(void *)&a[4].value.f32", "&scratch", "&scratch"]
    rows = text[text.index("launch_toy_rows_b64_sm90("):]
    assert "static const unsigned box0[] = {64, 32};" in rows
    assert "bsk_encode_tensormap(&map0, &a[0], 6, 2, box0, " in rows  # float16 maps, 2-byte elements
    params = re.search(r"void \*params\[\] = \{(.*?)\};", rows, re.S).group(1).split(",")
    assert [p.strip() for p in params][:5] == ["&map0", "&shape0[0]", "&shape0[1]", "(void *)&a[0].strides[0]",
                                               "(void *)&a[0].strides[1]"]
    assert '{"x_desc", BSK_ARG_TENSOR, 2, 0}' in text and '{"offset", BSK_ARG_I64, 0, 1}' in text
    assert '{"op", 0, "rows"}, {"block", 64, NULL}, {"dtype", 0, "fp16"}' in text
    assert (toy_build / "cubins" / "toy_rows_b64_sm90.cubin").is_file()


def test_launch_parameter_bytes_follow_triton_s_convention():
    params = (Param("x_desc", "tensor", rank=3), Param("Y", "ptr"), Param("n", "i32"), Param("a", "f32"))
    assert launch_param_bytes(params) == [128, 4, 4, 4, 8, 8, 8, 8, 4, 4, 8, 8]


# ------------------------------------------------------------------ codegen refusals


def _kernel(name="k", family="toy", fields=None):
    spec = SimpleNamespace(name=name, arch=90)
    return CompiledKernel(family, spec, fields or {}, "scale_kernel", b"\0" * 8, "scale_kernel", 4, 1, 0,
                          (Param("X", "ptr", True, 0, "*fp32"),), (), {})


def test_codegen_refuses_repeated_names_and_bad_ones(tmp_path):
    manifest = {"specializations": []}
    paths = [tmp_path / "a.cubin", tmp_path / "b.cubin"]
    with pytest.raises(ValueError, match=r"unique within a family; repeated: \['toy_k'\]"):
        generate([_kernel(), _kernel()], paths, manifest)
    with pytest.raises(ValueError, match="C identifiers"):
        generate([_kernel("no-dash")], paths[:1], manifest)
    with pytest.raises(ValueError, match="must not be empty"):
        generate([], [], manifest)
    # the same name in two families is fine: symbols carry the family
    text = generate([_kernel(), _kernel(family="other")], paths, manifest)
    assert "launch_toy_k(" in text and "launch_other_k(" in text


def test_codegen_writes_scalar_fields_as_keys_and_leaves_nested_ones_to_the_manifest():
    keys = c_keys({"product": "fprop", "group": 4, "atomic": True, "config": {"BM": 64}, "archs": [80]})
    assert keys == [("product", 0, "fprop"), ("group", 4, None), ("atomic", 1, None)]
    with pytest.raises(ValueError, match="plain ASCII"):
        generate([_kernel(fields={"op": 'quo"te'})], ["x.cubin"], {})


def test_tensor_maps_in_the_launcher_follow_the_compiled_box():
    kernel = CompiledKernel("toy", SimpleNamespace(name="d", arch=90), {}, "rows_kernel", b"\0", "rows_kernel", 8,
                            1, 1024, (Param("x_desc", "tensor", False, 3, "tensordesc<bf16[2, 64, 64]>"),),
                            (TensorMap("x_desc", 10, 2, (2, 64, 64), 3),), {})
    text = generate([kernel], ["d.cubin"], {})
    assert "static const unsigned box0[] = {2, 64, 64};" in text
    assert "int32_t shape0[3];" in text and "(void *)&a[0].strides[2]" in text
    assert "bsk_launch_kernel(function, stream, grid, 8, 1024, params)" in text
