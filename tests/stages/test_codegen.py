"""Code generation: the spec header, both body kinds, the harness, template errors."""

import pytest

from mpkbuild.stages import generate as codegen
from mpkbuild.model.kernel import Kernel
from mpkbuild.stages import load_kernel

K = "rmsnorm_v2"


def render(kernel, role):
    return codegen.render_file(role, kernel.spec.sections["codegen"], kernel.spec.file,
                               kernel.body_source, kernel.root)


def test_spec_header_pins_constants(root):
    k = load_kernel(root, K)
    header = render(k, "spec_header")
    assert "constexpr int THREADS = 128;" in header
    assert "constexpr float EPS = 1e-06f;" in header
    assert "static_assert(SMEM_TOTAL <= SMEM_BUDGET" in header
    assert "static_assert(SMEM_WARP_SUMS_OFFSET % SMEM_WARP_SUMS_ALIGN == 0" in header
    assert "static_assert(HIDDEN % (THREADS * VEC_ELEMS) == 0" in header
    assert header.count("\nnamespace decode_") == 6


def test_harness_has_one_launcher_per_variant_and_task_slices(root):
    k = load_kernel(root, K)
    harness = render(k, "harness")
    for v in k.variants:
        assert f'extern "C" int {K}_launch_{v}(' in harness
    # input and output are split by rows: task t starts at t * hidden; weight is replicated
    assert "input + static_cast<size_t>(task) * 7168ull" in harness
    assert "weight + static_cast<size_t>(task)" not in harness
    assert "blockIdx" not in render(k, "body")


def test_plain_cuh_body_is_used_verbatim(root):
    body = root / "kernels" / K / "plain.cuh"
    body.write_text("#pragma once\n// plain body {{ not a template }}\n__device__ void f() {}\n")
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace(f"body: kernels/{K}/{K}.cuh.j2", f"body: kernels/{K}/plain.cuh"))
    k = load_kernel(root, K)
    assert not k.body_is_template
    # not rendered by jinja; its code in the body's namespace, its pragma outside
    assert render(k, "body") == (f"#pragma once\nnamespace kernel::mpkbuild_{K} {{\n"
                                 "// plain body {{ not a template }}\n__device__ void f() {}\n"
                                 f"}}  // namespace kernel::mpkbuild_{K}\n")


def test_undefined_name_in_body_template_names_file_and_line(root):
    tpl = root / "kernels" / K / f"{K}.cuh.j2"
    lines = tpl.read_text().splitlines()
    lines.insert(4, "// {{ params.no_such_param }}")
    tpl.write_text("\n".join(lines) + "\n")
    with pytest.raises(codegen.TemplateError) as info:
        render(load_kernel(root, K), "body")
    assert str(info.value).startswith(f"kernels/{K}/{K}.cuh.j2:5: ")
    assert "no_such_param" in str(info.value)


def test_template_syntax_error_names_file_and_line(root):
    tpl = root / "kernels" / K / f"{K}.cuh.j2"
    tpl.write_text("line one\n{% if %}\n")
    with pytest.raises(codegen.TemplateError) as info:
        render(load_kernel(root, K), "body")
    assert str(info.value).startswith(f"kernels/{K}/{K}.cuh.j2:2: template syntax error")


def test_unchanged_render_does_not_rewrite(root, tmp_path):
    k = load_kernel(root, K)
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


NS = "kernel::mpkbuild_x"


def test_an_include_guarded_body_closes_its_namespace_inside_the_guard(tmp_path):
    """The namespace opens after the includes and closes before the guard's #endif, so a
    second include skips both; a trailing #endif of the code's own stays inside."""
    import shutil
    import subprocess
    body = ("// doc\n#ifndef X_CUH\n#define X_CUH\n#include <cstdint>\n\n"
            "inline int twice(int a) { return 2 * a; }\n#if 1\ninline int one() { return 1; }\n#endif\n"
            "\n#endif  // X_CUH\n")
    text = codegen.in_namespace(body, NS, "x.cuh")
    assert text.splitlines()[4] == f"namespace {NS} {{"     # the blank line's place: lines kept
    assert text.splitlines()[5] == "inline int twice(int a) { return 2 * a; }"
    assert text.endswith(f"#endif\n\n}}  // namespace {NS}\n#endif  // X_CUH\n")
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    (tmp_path / "x.cuh").write_text(text)
    (tmp_path / "tu.cc").write_text('#include "x.cuh"\n#include "x.cuh"\n'
                                    "int twice = 0;  // the global name is free\n"
                                    "int main() { return kernel::mpkbuild_x::twice(twice) + kernel::mpkbuild_x::one(); }\n")
    proc = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "tu.cc"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_an_include_after_the_bodys_code_is_refused_with_its_line():
    with pytest.raises(codegen.TemplateError) as exc:
        codegen.in_namespace("#pragma once\nint a;\n/* x */\n#include <cstdint>\n", NS, "kernels/x/x.cuh")
    assert "kernels/x/x.cuh: line 4 of the rendered body: #include after the body's first code" in str(exc.value)
    # block comments and continued directives at the top are still the top
    text = codegen.in_namespace("/* a\n#include <not code>\n*/\n#define M(a) \\\n  (a)\nint b;\n", NS, "x")
    assert text.splitlines()[5] == f"namespace {NS} {{" and text.splitlines()[6] == "int b;"


def test_every_catalog_body_and_header_leaves_the_global_scope_to_others(tmp_path):
    """Every name of a catalog kernel's generated header and body is in its namespace: a
    translation unit that declares the same names at global scope (as upstream's tasks and
    other kernels could) compiles beside them."""
    import re
    import shutil
    import subprocess
    from conftest import REPO
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    names = sorted(p.stem for p in (REPO / "specs").glob("*.yaml"))
    tu = []
    for name in names:
        k = load_kernel(REPO, name, write_cache=False)
        (tmp_path / f"{name}_spec.h").write_text(render(k, "spec_header"))
        (tmp_path / f"{name}.cuh").write_text(render(k, "body"))
        assert re.search(rf"^namespace kernel::mpkbuild_{name} {{$", render(k, "body"), re.M)
        tu += [f'#include "{name}_spec.h"', f'#include "{name}.cuh"',
               f"int {name}_task, {name}_detail, {name}_spec;"]
    (tmp_path / "tu.cu").write_text("\n".join(tu) + "\n")
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-c", "tu.cu", "-o", "tu.o"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_launch_bounds_follow_min_blocks_per_sm(root):
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace("  grid: [rows // rpt]", "  min_blocks_per_sm: 1 + rows // 4096\n  grid: [rows // rpt]"))
    harness = render(load_kernel(root, K), "harness")
    assert "__launch_bounds__(kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_spec::THREADS, 1)\nrmsnorm_v2__decode_r16_h7168(" in harness
    assert "__launch_bounds__(kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_spec::THREADS, 5)\nrmsnorm_v2__large_r16384_h7168(" in harness


def test_partition_override_moves_the_task_slice(root):
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace(
        "  grid: [rows // rpt]", '  grid: [rows // rpt]\n  overrides:\n    - {variants: "large_r16384_*", partition: {input: [-1, -1]}}'))
    harness = render(load_kernel(root, K), "harness")
    large = harness[harness.index("rmsnorm_v2__large_r16384_h7168("):]
    assert "input + static_cast<size_t>(task)" not in large.split("task, kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_spec::task_smem()")[0]
    assert "input + static_cast<size_t>(task) * 7168ull" in harness      # the other variants


def test_smem_sized_by_variant_symbols_is_planned_per_variant(root):
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace("bytes: 64, align: 16", "bytes: \"max(64, rows // 4)\", align: 16"))
    k = load_kernel(root, K)
    header, harness = render(k, "spec_header"), render(k, "harness")
    assert "constexpr size_t SMEM_TOTAL_MAX = 4096;" in header            # 16384 // 4
    block = header[header.index("namespace large_r4096_h7168 {"):]
    assert "constexpr size_t SMEM_WARP_SUMS_BYTES = 1024;" in block.split("}")[0]
    assert "rmsnorm_v2_spec::large_r4096_h7168::SMEM_TOTAL" in harness
    plan = codegen.smem_plan(k.spec.data["codegen"])
    assert plan["total"] == 4096 and not plan["uniform"]


def test_task_metadata_reaches_the_body_as_the_tasks_index(root):
    """In the harness a metadata field is the task's index on grid x, as the wired builder
    sets it in MPK (bid.x); after the tensors, before the task index, in TASK_METADATA's order."""
    spec = root / "specs" / f"{K}.yaml"
    spec.write_text(spec.read_text().replace("  inputs:\n", "  task_metadata: [kv_idx, request_id]\n  inputs:\n", 1)
                    .replace("tile_indexed: true", "tile_indexed: false"))
    harness = render(load_kernel(root, K), "harness")
    start = harness.index("::rmsnorm_v2_task<")
    call = harness[start:harness.index("task_smem()", start)]
    assert call.split("\n")[4:7] == ["      task,  // request_id: the task's index on grid x, as MPK's builder sets it",
                                     "      task,  // kv_idx: the task's index on grid x, as MPK's builder sets it",
                                     "      task, kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_spec::"]
