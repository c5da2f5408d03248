"""The incremental contract, proven by running real scons in temporary copies.

Each test starts from a fully built copy (stand-in GPU executor, real nvcc), makes one edit
and asserts the exact set of actions the next build executes.
"""
import os
import time

import pytest

pytestmark = pytest.mark.nvcc

K = "rmsnorm_v2"
SPEC = f"specs/{K}.yaml"
BODY = f"kernels/{K}/{K}.cuh.j2"
GPU = "fake-gpu-sm90"
DOWNSTREAM_OF_COMPILE = [f"compile {K} sm_100a", f"compile {K} sm_90a", f"validate {K} {GPU}",
                         f"perf {K} {GPU}", f"review {K}", "review summary"]


def test_first_build_runs_every_stage_once(built_project):
    # built_project ran the first build; a no-op afterwards proves it left a consistent state
    assert (built_project.root / "build" / K / "review.md").is_file()
    assert (built_project.root / "build" / "review.md").is_file()


def test_noop_executes_nothing(built):
    run = built.scons("stage=review")
    assert run.actions == []


def test_moved_tree_rebuilds_nothing(built):
    # `built` is a copy of the originally built tree at another path
    assert built.scons("-j2", "stage=review").actions == []


def test_validate_tolerance_reruns_validate_wire_and_review_only(built):
    # wire renders the test-mode test, which holds the kernel's tolerances
    built.edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    run = built.scons("stage=review")
    assert sorted(run.actions) == sorted([f"spec {K}", f"validate {K} {GPU}", f"wire {K}",
                                          f"review {K}", "review summary"])
    assert built.runs_file.read_text().splitlines()[-1] == f"validate {K}"


def test_perf_setting_reruns_perf_and_review_only(built):
    built.edit(SPEC, "repeats: 7", "repeats: 9")
    run = built.scons("stage=review")
    assert sorted(run.actions) == sorted([f"spec {K}", f"perf {K} {GPU}", f"review {K}",
                                          "review summary"])


def test_codegen_param_regenerates_changed_files_then_everything_below(built):
    built.edit(SPEC, "eps: 1.0e-6", "eps: 1.0e-5")
    run = built.scons("stage=review")
    # eps lives in the spec header only: the body and harness renders are unchanged
    # wire reads the codegen section too (tensors, template params): it re-renders
    assert sorted(run.actions) == sorted([f"spec {K}", f"generate {K} {K}_spec.h", f"generate {K} {K}.cuh",
                                          f"generate {K} harness.cu", f"wire {K}"] + DOWNSTREAM_OF_COMPILE)
    header = (built.root / "build" / K / "gen" / f"{K}_spec.h").read_text()
    assert "constexpr float EPS = 1e-05f;" in header


def test_variant_edit_regenerates_and_rebuilds(built):
    built.edit(SPEC, "decode_r8_h4096:    {rows: 8,", "decode_r8_h4096:    {rows: 4,")
    run = built.scons("stage=review")
    assert f"compile {K} sm_90a" in run.actions and f"validate {K} {GPU}" in run.actions
    assert f"perf {K} {GPU}" in run.actions


def test_body_edit_reruns_compile_and_gpu_gates_not_spec(built):
    # wire installs the rendered body into a checkout, so its fragments change too
    built.edit(BODY, "// One task = RPT consecutive rows", "// One task = RPT consecutive rows (edited)")
    run = built.scons("stage=review")
    assert sorted(run.actions) == sorted([f"generate {K} {K}.cuh", f"wire {K}"] + DOWNSTREAM_OF_COMPILE)


def test_touch_without_change_runs_nothing(built):
    future = time.time() + 100
    for rel in (SPEC, BODY, f"kernels/{K}/reference.py"):
        os.utime(built.root / rel, (future, future))
    assert built.scons("stage=review").actions == []


def test_description_and_comment_edits_run_nothing(built):
    # the spec node depends on the normalised spec, which drops descriptions and comments
    built.edit(SPEC, "description: RMSNorm", "description: Root-mean-square norm,")
    built.edit(SPEC, "# one fp32 partial per warp", "# a reworded comment")
    run = built.scons("stage=review")
    assert run.actions == []


def test_reference_edit_reruns_gpu_gates_only(built):
    built.edit(f"kernels/{K}/reference.py", '"""Called with float64', '"""(edited) Called with float64')
    run = built.scons("stage=review")
    assert sorted(run.actions) == sorted([f"validate {K} {GPU}", f"perf {K} {GPU}", f"review {K}",
                                          "review summary"])


def test_stage_validate_builds_only_what_validate_needs(project):
    run = project.scons("stage=validate")
    assert sorted(run.actions) == sorted([f"spec {K}", f"generate {K} {K}_spec.h", f"generate {K} {K}.cuh",
                                          f"generate {K} harness.cu", f"compile {K} sm_90a",
                                          f"validate {K} {GPU}"])
    assert not (project.root / "build" / "gpu" / GPU / "bandwidth.json").exists()
    assert not (project.root / "build" / K / "review.md").exists()


def test_other_gpu_makes_only_gpu_gates_run_and_keeps_both(built):
    run = built.scons("stage=review", env={"FAKE_GPU_NAME": "Fake GPU Two"})
    other = "fake-gpu-two-sm90"
    assert sorted(run.actions) == sorted([f"bandwidth {other}", f"validate {K} {other}", f"perf {K} {other}",
                                          f"review {K}", "review summary"])
    assert (built.root / "build" / K / "gpu" / GPU / "validate.json").is_file()
    assert (built.root / "build" / K / "gpu" / other / "validate.json").is_file()


def test_dry_run_executes_nothing(built):
    built.edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    before = built.runs_file.read_text()
    run = built.scons("-n", "stage=review")
    assert f"spec {K}" in run.actions
    assert built.runs_file.read_text() == before
    assert '"rel_max": 0.03' in (built.root / "build" / K / "spec" / "validate.json").read_text()


def test_wiring_edit_reruns_wire_and_review_only(built):
    built.edit(SPEC, "test_variant: decode_r8_h4096", "test_variant: decode_r16_h4096")
    run = built.scons("stage=review")
    assert sorted(run.actions) == sorted([f"spec {K}", f"wire {K}", f"review {K}", "review summary"])
