"""Code generation: the spec header, both body kinds, the harness, template errors."""

import pytest

from mpkbuild.stages import generate as codegen
from mpkbuild.model.kernel import Kernel

K = "rmsnorm_v2"


def render(kernel, role):
    return codegen.render_file(role, kernel.spec.sections["codegen"], kernel.spec.file,
                               kernel.body_source, kernel.root)


def test_spec_header_pins_constants(root):
    k = Kernel.load(root, K)
    header = render(k, "spec_header")
    assert "constexpr int THREADS = 128;" in header
    assert "constexpr float EPS = 1e-06f;" in header
    assert "static_assert(SMEM_TOTAL <= SMEM_BUDGET" in header
    assert "static_assert(SMEM_WARP_SUMS_OFFSET % SMEM_WARP_SUMS_ALIGN == 0" in header
    assert "static_assert(HIDDEN % (THREADS * VEC_ELEMS) == 0" in header
    assert header.count("\nnamespace decode_") == 6


def test_harness_has_one_launcher_per_variant_and_task_slices(root):
    k = Kernel.load(root, K)
    harness = render(k, "harness")
    for v in k.variants:
        assert f'extern "C" int {K}_launch_{v}(' in harness
    # input and output are split by rows: task t starts at t * hidden; weight is replicated
    assert "input + static_cast<size_t>(task) * 7168ull" in harness
    assert "weight + static_cast<size_t>(task)" not in harness
    assert "blockIdx" not in render(k, "body")


def test_plain_cuh_body_is_used_verbatim(root):
    body = root / "kernels" / K / "plain.cuh"
    body.write_text("// plain body {{ not a template }}\n")
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace(f"body: kernels/{K}/{K}.cuh.j2", f"body: kernels/{K}/plain.cuh"))
    k = Kernel.load(root, K)
    assert not k.body_is_template
    assert render(k, "body") == "// plain body {{ not a template }}\n"


def test_undefined_name_in_body_template_names_file_and_line(root):
    tpl = root / "kernels" / K / f"{K}.cuh.j2"
    lines = tpl.read_text().splitlines()
    lines.insert(4, "// {{ params.no_such_param }}")
    tpl.write_text("\n".join(lines) + "\n")
    with pytest.raises(codegen.TemplateError) as info:
        render(Kernel.load(root, K), "body")
    assert str(info.value).startswith(f"kernels/{K}/{K}.cuh.j2:5: ")
    assert "no_such_param" in str(info.value)


def test_template_syntax_error_names_file_and_line(root):
    tpl = root / "kernels" / K / f"{K}.cuh.j2"
    tpl.write_text("line one\n{% if %}\n")
    with pytest.raises(codegen.TemplateError) as info:
        render(Kernel.load(root, K), "body")
    assert str(info.value).startswith(f"kernels/{K}/{K}.cuh.j2:2: template syntax error")


def test_unchanged_render_does_not_rewrite(root, tmp_path):
    k = Kernel.load(root, K)
    target = tmp_path / "out.h"
    args = ("spec_header", k.spec.sections["codegen"], k.spec.file, k.body_source, k.root, target)
    assert codegen.generate_file(*args) is True
    assert codegen.generate_file(*args) is False


def test_smem_plan_respects_alignment():
    cg = {"threads": 128, "params": {}, "smem": {"budget": 4096, "regions": [
        {"name": "a", "bytes": 10, "align": 16}, {"name": "b", "bytes": 64, "align": 128}]}}
    plan = codegen.smem_plan(cg)
    assert [(r["offset"], r["bytes"]) for r in plan["regions"]] == [(0, 10), (128, 64)]
    assert plan["total"] == 192


def test_launch_bounds_follow_min_blocks_per_sm(root):
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace("  grid: [rows]", "  min_blocks_per_sm: 1 + rows // 4096\n  grid: [rows]"))
    harness = render(Kernel.load(root, K), "harness")
    assert "__launch_bounds__(rmsnorm_v2_spec::THREADS, 1)\nrmsnorm_v2__decode_r16_h7168(" in harness
    assert "__launch_bounds__(rmsnorm_v2_spec::THREADS, 5)\nrmsnorm_v2__large_r16384_h7168(" in harness


def test_partition_override_moves_the_task_slice(root):
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace(
        "  grid: [rows]", '  grid: [rows]\n  overrides:\n    - {variants: "large_r16384_*", partition: {input: [-1, -1]}}'))
    harness = render(Kernel.load(root, K), "harness")
    large = harness[harness.index("rmsnorm_v2__large_r16384_h7168("):]
    assert "input + static_cast<size_t>(task)" not in large.split("task, rmsnorm_v2_spec::task_smem()")[0]
    assert "input + static_cast<size_t>(task) * 7168ull" in harness      # the other variants


def test_smem_sized_by_variant_symbols_is_planned_per_variant(root):
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace("bytes: 16, align: 16", "bytes: \"max(16, rows // 4)\", align: 16"))
    k = Kernel.load(root, K)
    header, harness = render(k, "spec_header"), render(k, "harness")
    assert "constexpr size_t SMEM_TOTAL_MAX = 4096;" in header            # 16384 // 4
    block = header[header.index("namespace large_r4096_h7168 {"):]
    assert "constexpr size_t SMEM_WARP_SUMS_BYTES = 1024;" in block.split("}")[0]
    assert "rmsnorm_v2_spec::large_r4096_h7168::SMEM_TOTAL" in harness
    plan = codegen.smem_plan(k.spec.data["codegen"])
    assert plan["total"] == 4096 and not plan["uniform"]
