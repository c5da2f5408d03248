"""Spec loading: normalisation, section signatures, and one precise error per bad spec."""
import json
from pathlib import Path

import jsonschema
import pytest

from mpkbuild import stages
from mpkbuild.model.spec import SpecError
from mpkbuild.stages import load_spec

from conftest import REPO
from mpkbuild.util import config
from mpkbuild.stages import load_kernel
K = "rmsnorm_v2"


def spec_path(root):
    return root / "specs" / f"{K}.yaml"


def edit(root, old, new):
    p = spec_path(root)
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def line_of(root, needle):
    for i, line in enumerate(spec_path(root).read_text().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


def expect_error(root, needle, path, fragment):
    with pytest.raises(SpecError) as info:
        load_spec(spec_path(root), root)
    err = info.value
    assert err.file == f"specs/{K}.yaml"
    assert err.line == line_of(root, needle), str(err)
    assert ".".join(map(str, err.path)) == path, str(err)
    assert fragment in err.message, str(err)
    assert str(err).startswith(f"specs/{K}.yaml:{err.line}: {path.split('.')[0]}")
    return err


def test_loads_and_normalises(root):
    spec = load_spec(spec_path(root), root)
    assert spec.name == K
    assert set(spec.sections) >= {"codegen", "generators", "validate", "perf"}
    assert spec.data["validate"]["cos_min"] == 0.999          # default filled in
    assert "description" not in spec.data                       # cosmetic, dropped
    assert all(len(sig) == 64 for sig in spec.signatures.values())


def test_comment_and_description_edits_keep_every_signature(root):
    before = load_spec(spec_path(root), root).signatures
    edit(root, "description: RMSNorm", "description: Totally different words.")
    edit(root, "# one fp32 partial per warp", "# a changed comment")
    assert load_spec(spec_path(root), root).signatures == before


def test_each_section_edit_changes_only_its_signature(root):
    before = load_spec(spec_path(root), root).signatures
    edit(root, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    after = load_spec(spec_path(root), root).signatures
    assert {k for k in before if before[k] != after[k]} == {"validate"}


def test_unknown_field(root):
    edit(root, "  threads: 128", "  threads: 128\n  thread_count: 3")
    expect_error(root, "thread_count: 3", "codegen.thread_count", "unknown field 'thread_count'")


def test_missing_field(root):
    edit(root, "  threads: 128\n", "")
    expect_error(root, "codegen:", "codegen.threads", "missing required field 'threads'")


def test_wrong_type(root):
    edit(root, "  threads: 128", "  threads: lots")
    expect_error(root, "threads: lots", "codegen.threads", "expected integer")


def test_kernel_name_not_c_identifier(root):
    edit(root, "op: rmsnorm", "op: rms-norm")
    expect_error(root, "op: rms-norm", "op", "not a C identifier")


def test_variant_name_not_c_identifier(root):
    edit(root, "decode_r1_h4096:    {rows", "1decode:   {rows")
    expect_error(root, "1decode:", "codegen.variants.1decode", "not a C identifier")


def test_body_escaping_the_repository(root):
    edit(root, "body: kernels/rmsnorm_v2/rmsnorm_v2.cuh.j2", "body: kernels/../../outside.cuh")
    expect_error(root, "body: kernels/../../outside.cuh", "codegen.body", "escapes the repository")


def test_reference_escaping_the_repository(root):
    edit(root, "reference: kernels/rmsnorm_v2/reference.py:rmsnorm_reference",
         "reference: kernels/../../x.py:f")
    expect_error(root, "reference: kernels/../../x.py:f", "validate.reference", "escapes the repository")


def test_variant_that_does_not_tile_the_thread_count(root):
    edit(root, "decode_r8_h4096:    {rows: 8, hidden: 4096, rpt: 1}", "decode_r8_h4096:    {rows: 8, hidden: 4000, rpt: 1}")
    err = expect_error(root, "hidden: 4000", "codegen.variants.decode_r8_h4096.hidden", "does not tile")
    assert "threads * vec_elems = 1024" in err.message


def test_smem_over_budget(root):
    edit(root, "{name: warp_sums, bytes: 64, align: 16}", "{name: warp_sums, bytes: 300000, align: 16}")
    expect_error(root, "name: warp_sums", "codegen.smem.regions.0", "SMEM over budget")


def test_reference_file_missing(root):
    edit(root, "reference: kernels/rmsnorm_v2/reference.py:", "reference: kernels/rmsnorm_v2/nope.py:")
    expect_error(root, "nope.py", "validate.reference", "does not exist")


def test_reference_function_missing(root):
    edit(root, "reference.py:rmsnorm_reference", "reference.py:no_such_function")
    expect_error(root, "no_such_function", "validate.reference", "no top-level function 'no_such_function'")


def test_duplicate_key(root):
    edit(root, "  threads: 128", "  threads: 128\n  threads: 256")
    expect_error(root, "threads: 256", "codegen.threads", "duplicate key")


def test_kernel_name_must_match_file(root):
    edit(root, "kernel: rmsnorm_v2", "kernel: rmsnorm_v3")
    expect_error(root, "kernel: rmsnorm_v3", "kernel", "must equal the spec file's stem")


def test_split_dim_not_divisible_by_grid(root):
    edit(root, "grid: [rows // rpt]", 'grid: ["max(1, rows // 3)"]')
    expect_error(root, "{name: input,", "codegen.inputs.0.shape.0", "not a multiple")


def test_more_tasks_than_a_split_dim_is_the_grids_error(root):
    """The grid is what is wrong (issue 43: it was reported at the input)."""
    edit(root, "grid: [rows // rpt]", "grid: [rows * 3]")
    expect_error(root, "grid: [rows * 3]", "codegen.grid.0", "has only 1 elements")


def test_threshold_glob_matching_nothing(root):
    edit(root, '{variants: "large_r16384_*"', '{variants: "huge_*"')
    expect_error(root, "huge_*", "perf.thresholds.0.variants", "matches no variant")


def test_yaml_syntax_error(root):
    edit(root, "  threads: 128", "  threads: [128")
    with pytest.raises(SpecError) as info:
        load_spec(spec_path(root), root)
    assert "YAML syntax error" in info.value.message


def test_exported_schema_is_current_and_accepts_the_spec():
    exported = json.loads(config.SPEC_SCHEMA_FILE.read_text())
    assert exported == stages.spec_loader().schema, \
        "run: (cd site_scons && python -m mpkbuild schema --json) > site_scons/mpkbuild/data/spec.schema.json"
    import yaml
    data = yaml.safe_load((REPO / "specs" / f"{K}.yaml").read_text())
    jsonschema.Draft202012Validator(exported).validate(data)


# ---------------------------------------------------------------- per-variant overrides
OVERRIDE = "  grid: [rows // rpt]"


def test_partition_override_applies_to_matching_variants_only(root):
    from mpkbuild.stages.generate.plan import variant_tensors
    edit(root, OVERRIDE, OVERRIDE + '\n  overrides:\n    - {variants: "large_*", partition: {input: [-1, -1]}}')
    cg = load_spec(spec_path(root), root).data["codegen"]
    assert variant_tensors(cg, "large_r4096_h7168")["inputs"][0]["partition"] == [-1, -1]
    assert variant_tensors(cg, "decode_r1_h4096")["inputs"][0]["partition"] == [0, -1]
    assert "overrides" not in load_spec(REPO / "specs" / f"{K}.yaml", REPO).data["codegen"]


def test_override_glob_matching_nothing(root):
    edit(root, OVERRIDE, OVERRIDE + '\n  overrides:\n    - {variants: "huge_*", partition: {input: [0, -1]}}')
    expect_error(root, "huge_*", "codegen.overrides.0.variants", "matches no variant")


def test_override_of_an_unknown_tensor(root):
    edit(root, OVERRIDE, OVERRIDE + '\n  overrides:\n    - {variants: "large_*", partition: {nope: [0, -1]}}')
    expect_error(root, "nope: [0, -1]", "codegen.overrides.0.partition.nope", "no tensor named 'nope'")


def test_override_with_the_wrong_rank(root):
    edit(root, OVERRIDE, OVERRIDE + '\n  overrides:\n    - {variants: "large_*", partition: {input: [0]}}')
    expect_error(root, "input: [0]}", "codegen.overrides.0.partition.input", "shape has 2 dims")


def test_two_overrides_for_one_tensor_of_one_variant(root):
    edit(root, OVERRIDE, OVERRIDE + '\n  overrides:\n    - {variants: "large_*", partition: {input: [0, -1]}}'
         '\n    - {variants: "large_r4096_*", partition: {input: [-1, 0]}}')
    expect_error(root, '"large_r4096_*"', "codegen.overrides.1.partition.input", "already takes input's partition")


def test_overridden_split_must_divide_by_the_grid(root):
    # 7168 weight elements over large_r16384's 2048 tasks
    edit(root, OVERRIDE, OVERRIDE + '\n  overrides:\n    - {variants: "large_r16384_*", partition: {weight: [0]}}')
    err = expect_error(root, "{name: weight,", "codegen.inputs.1.shape.0", "not a multiple")
    assert "codegen.overrides[0]" in err.message


def test_min_and_max_in_expressions(root):
    edit(root, "grid: [rows // rpt]", "grid: [\"max(rows, 1) * min(1, rows, 2)\"]")
    load_spec(spec_path(root), root)
    edit(root, "grid: [\"max(rows, 1) * min(1, rows, 2)\"]", "grid: [\"min(rows)\"]")
    expect_error(root, "grid: [\"min(rows)\"]", "codegen.grid.0", "takes two or more plain arguments")


def test_smem_region_sized_by_variant_symbols(root):
    edit(root, "{name: warp_sums, bytes: 64, align: 16}", "{name: warp_sums, bytes: rows * 8, align: 16}")
    load_spec(spec_path(root), root)
    edit(root, "bytes: rows * 8,", "bytes: rows * 64,")    # 16384 rows * 64 > the budget
    err = expect_error(root, "name: warp_sums", "codegen.smem.regions.0", "SMEM over budget")
    assert err.message.startswith("variant large_r4096_h7168: ")    # the first variant over it


# ---------------------------------------------------------------- perf-only generators
PERF_COLD = "  cold: true"


def test_perf_generators_change_only_the_perf_signature(root):
    before = load_spec(spec_path(root), root).signatures
    edit(root, PERF_COLD, PERF_COLD + "\n  generators:\n    input: {dist: uniform, low: -1.0, high: 1.0}")
    after = load_spec(spec_path(root), root).signatures
    assert {k for k in before if before[k] != after[k]} == {"perf"}


def test_perf_generator_for_an_unknown_input(root):
    edit(root, PERF_COLD, PERF_COLD + "\n  generators:\n    nope: {dist: normal, mean: 0, std: 1}")
    expect_error(root, "nope: {dist", "perf.generators.nope", "no input named 'nope'")


def test_perf_generator_randint_on_a_float_input(root):
    edit(root, PERF_COLD, PERF_COLD + "\n  generators:\n    input: {dist: randint, low: 0, high: 4}")
    expect_error(root, "input: {dist: randint", "perf.generators.input.dist", "randint is for integer inputs")


def test_generator_step_is_for_float_draws_only(root):
    edit(root, "input:  {dist: normal, mean: 0.0, std: 1.0}",
         "input:  {dist: normal, mean: 0.0, std: 1.0, step: 0.25}")
    before = load_spec(spec_path(root), root)
    assert before.data["generators"]["input"]["step"] == 0.25
    edit(root, PERF_COLD, PERF_COLD + "\n  generators:\n    input: {dist: randint, low: 0, high: 4, step: 2}")
    expect_error(root, "input: {dist: randint", "perf.generators.input.step", "randint is already whole")


def test_inside_repo_follows_symlinks_exactly_as_realpath(tmp_path):
    """The loader's symlink check walks only the path's components below the resolved
    root; it must give os.path.realpath's answer for every shape of path."""
    import os
    from mpkbuild.model.section import realpath_under as _realpath_under
    base = tmp_path / "repo"
    (base / "kernels" / "k").mkdir(parents=True)
    (base / "kernels" / "k" / "ref.py").write_text("")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "ref.py").write_text("")
    (base / "kernels" / "out").symlink_to(tmp_path / "outside")
    (base / "kernels" / "k" / "link.py").symlink_to(base / "kernels" / "k" / "ref.py")
    (base / "kernels" / "k" / "away.py").symlink_to(tmp_path / "outside" / "ref.py")
    (base / "kernels" / "k" / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    base = str(base.resolve())
    for rel in ("kernels/k/ref.py", "kernels//k/./ref.py", "kernels/k/link.py", "kernels/k/away.py",
                "kernels/out/ref.py", "kernels/k/../k/ref.py", "kernels/../../outside/ref.py",
                "kernels/k/missing.py", "kernels/missing/dir/x.py", "kernels/k/dangling.py",
                "kernels/k/", ".", ""):
        assert _realpath_under(base, rel) == os.path.realpath(os.path.join(base, rel)), rel


def test_runtime_state_of_another_dtype_is_refused(root):
    edit(root, "{name: weight, dtype: bf16, shape: [hidden],       partition: [-1]}",
         "{name: weight, dtype: bf16, shape: [hidden],       partition: [-1], runtime: tokens}")
    expect_error(root, "runtime: tokens", "codegen.inputs.1.dtype", "its dtype is int64, not bf16")


def test_runtime_state_split_over_tasks_is_refused(root):
    edit(root, "{name: weight, dtype: bf16, shape: [hidden],       partition: [-1]}",
         "{name: ids, dtype: int64, shape: [rows], partition: [0], runtime: tokens}")
    expect_error(root, "runtime: tokens", "codegen.inputs.1.partition", "its partition is all -1")


def test_runtime_state_as_an_output_is_refused(root):
    edit(root, "{name: output, dtype: bf16, shape: [rows, hidden], partition: [0, -1]}",
         "{name: output, dtype: bf16, shape: [rows, hidden], partition: [0, -1], runtime: tokens}")
    expect_error(root, "runtime: tokens", "codegen.outputs.0.runtime", "only an input")


def test_task_metadata_sharing_bytes_is_refused(root):
    edit(root, "  inputs:\n", "  task_metadata: [request_id, expert_offset]\n  inputs:\n")
    expect_error(root, "task_metadata:", "codegen.task_metadata.1",
                 "expert_offset and request_id share TaskMetadata's bytes")


def test_more_tasks_than_a_metadata_field_holds_is_the_grids_error(root):
    edit(root, "  inputs:\n", "  task_metadata: [request_id]\n  inputs:\n")
    edit(root, "tile_indexed: true", "tile_indexed: false")
    # 8 rows a task: 32769 tasks
    edit(root, "large_r16384_h7168: {rows: 16384,", "large_r16384_h7168: {rows: 262152,")
    expect_error(root, "grid: [rows // rpt]", "codegen.grid.0", "task_metadata request_id holds task indices up to 32767")


def _fifteen_regions(can_pack: str = "") -> str:
    return "\n".join(f"      - {{name: r{i}, bytes: 1024, align: 1024{can_pack}}}" for i in range(15))


def test_a_plan_of_fifteen_pages_is_refused_with_its_page_table(root):
    """Runtime-V2 plans SMEM in 16 KB pages, at most 14: fifteen 1 KiB regions of their own
    take fifteen, though their 15 KiB fit the budget many times over."""
    edit(root, "      - {name: warp_sums, bytes: 64, align: 16}   # one fp32 partial per warp and row of a batch (up to 4)",
         _fifteen_regions())
    err = expect_error(root, "name: r14,", "codegen.smem.regions.14", "SMEM needs 15 pages of 16 KB")
    assert "at most 14: pages by region: r0 1, r1 1," in err.message and "r14 1 (" in err.message


def test_packable_regions_share_pages(root):
    edit(root, "      - {name: warp_sums, bytes: 64, align: 16}   # one fp32 partial per warp and row of a batch (up to 4)",
         _fifteen_regions(", can_pack: true"))
    load_spec(spec_path(root), root)                 # 15 KiB packed: one page


def test_the_budget_cannot_exceed_what_the_runtime_gives_a_task(root):
    edit(root, "    budget: 224256", "    budget: 232448")
    expect_error(root, "budget: 232448", "codegen.smem.budget", "224256")


def test_a_cached_load_is_not_reused_once_the_wiring_surface_changed(root):
    """The wiring section is checked against the project's surface over the shipped one: a
    spec cached before the surface changed is loaded (and checked) again."""
    from mpkbuild.stages import load_kernel
    load_kernel(root, K)
    assert load_kernel(root, K).spec.from_cache
    (root / "wiring").mkdir()
    (root / "wiring" / "surface.yaml").write_text("# the project's additions: none yet\n{}\n")
    assert not load_kernel(root, K).spec.from_cache
    assert load_kernel(root, K).spec.from_cache
