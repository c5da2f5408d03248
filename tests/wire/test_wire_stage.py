"""The wire stage through scons: build/ only by default, apply/unwire on a checkout copy."""
import shutil
from pathlib import Path

import pytest

K = "rmsnorm_v2"
from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "mpk_tree"


def snapshot(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def checkout(tmp_path):
    dest = tmp_path / "mpk"
    shutil.copytree(FIXTURE, dest)
    return dest


def test_wire_without_checkout_writes_fragments_only(project, checkout):
    before = snapshot(checkout)
    run = project.scons("stage=wire")
    assert run.actions == [f"spec {K}", f"wire {K}"]
    frags = project.root / "build" / K / "wiring" / "fragments"
    assert (frags / "enum.sm_90a.h").is_file() and (frags / "layer.py").is_file()
    assert snapshot(checkout) == before


def test_diff_then_apply_twice_then_unwire_restores_bytes(project, checkout):
    before = snapshot(checkout)
    run = project.scons("stage=wire", f"mpk_root={checkout}")
    assert "would change" in run.stdout and snapshot(checkout) == before
    diff = (project.root / "build" / K / "wiring" / "mpk.diff").read_text()
    assert "+  TASK_RMSNORM_V2_HOPPER = 153," in diff
    project.scons("stage=wire", f"mpk_root={checkout}", "apply=1")
    once = snapshot(checkout)
    assert once != before
    project.scons("stage=wire", f"mpk_root={checkout}", "apply=1")
    assert snapshot(checkout) == once
    project.scons("stage=wire", f"mpk_root={checkout}", "apply=1", "unwire=1")
    assert snapshot(checkout) == before


def test_a_kernel_renamed_after_wiring_is_named_and_unwired_with_the_rest(project, checkout):
    """A checkout wired under a kernel's old name keeps those blocks when its spec is renamed:
    a later run says so (and leaves them), and an unwire of every kernel takes them too, so
    the checkout returns to its unwired bytes though no spec names them any more."""
    before = snapshot(checkout)
    project.scons("stage=wire", f"mpk_root={checkout}", "apply=1")
    old = project.path(f"specs/{K}.yaml")
    text = old.read_text().replace(f"kernel: {K}", "kernel: rmsnorm_v3").replace(f"layer: {K}", "layer: rmsnorm_v3")
    project.path("specs/rmsnorm_v3.yaml").write_text(text.replace("RMSNORM_V2", "RMSNORM_V3"))
    old.unlink()
    run = project.scons("stage=wire", f"mpk_root={checkout}", "apply=1")
    assert f"the checkout holds blocks of {K} (no spec of this project names it" in run.stdout, run.stdout
    both = snapshot(checkout)
    assert any(b"TASK_RMSNORM_V2_HOPPER" in t for t in both.values())
    assert any(b"TASK_RMSNORM_V3_HOPPER" in t for t in both.values())
    run = project.scons("stage=wire", f"mpk_root={checkout}", "unwire=1")
    assert f"would unwire too: the blocks of {K}" in run.stdout and snapshot(checkout) == both
    run = project.scons("stage=wire", f"mpk_root={checkout}", "apply=1", "unwire=1")
    assert f"unwired too: the blocks of {K}" in run.stdout
    assert snapshot(checkout) == before


def test_hand_edit_inside_a_block_is_refused_with_a_diff(project, checkout):
    project.scons("stage=wire", f"mpk_root={checkout}", "apply=1")
    header = checkout / "include/mirage/persistent_kernel/runtime_header.h"
    header.write_text(header.read_text().replace("TASK_RMSNORM_V2_HOPPER = 153,", "TASK_RMSNORM_V2_HOPPER = 160,"))
    edited = snapshot(checkout)
    project.edit(f"specs/{K}.yaml", "test_variant: decode_r8_h4096", "test_variant: decode_r16_h4096")
    run = project.scons("stage=wire", f"mpk_root={checkout}", "apply=1", check=False)
    assert run.returncode != 0
    assert "TASK_RMSNORM_V2_HOPPER = 160" in run.stderr
    assert snapshot(checkout) == edited


def test_apply_needs_a_checkout(project):
    run = project.scons("stage=wire", "apply=1", check=False)
    assert run.returncode != 0 and "need mpk_root=PATH" in run.stderr


def test_not_a_checkout_is_a_clear_error(project, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = project.scons("stage=wire", f"mpk_root={empty}", check=False)
    assert run.returncode != 0 and "mpk: error:" in run.stderr
    assert not (project.root / "build" / K / "wiring" / "wire.json").exists()


def test_review_shows_the_wire_stage(built):
    review = (built.root / "build" / K / "review.md").read_text()
    assert "## wire: pass" in review and "fragments rendered" in review


@pytest.fixture
def two(tmp_path):
    """A project with two wired kernels (their numbers are "auto")."""
    from conftest import copy_project, stop_warm_servers
    proj = copy_project(tmp_path / "proj2", kernels=("rmsnorm_v2", "silu_mul_v2"))
    yield proj
    stop_warm_servers(proj.root)


def wire_json(project, name: str) -> dict:
    import json
    return json.loads((project.root / "build" / name / "wiring" / "wire.json").read_text())


def test_the_preview_shows_the_numbers_apply_writes(two, checkout):
    two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}")
    preview = {n: wire_json(two, n)["numbers"] for n in ("rmsnorm_v2", "silu_mul_v2")}
    assert preview["rmsnorm_v2"] != preview["silu_mul_v2"]
    # each kernel's manifest lists the files holding its blocks, and the message counts them
    files = wire_json(two, "silu_mul_v2")["files"]
    assert "include/mirage/persistent_kernel/runtime_header.h" in files
    assert any(f.endswith("mpkbuild_silu_mul_v2.cuh") for f in files)
    assert not any("rmsnorm" in f for f in files)
    assert f"would change {len(files)} files in" in wire_json(two, "silu_mul_v2")["message"]
    two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}", "apply=1")
    assert {n: wire_json(two, n)["numbers"] for n in preview} == preview
    assert f"applied to {len(files)} files in" in wire_json(two, "silu_mul_v2")["message"]
    header = (checkout / "include/mirage/persistent_kernel/runtime_header.h").read_text()
    assert f"TASK_SILU_MUL_V2_HOPPER = {preview['silu_mul_v2']['sm_90a']}," in header


def test_a_refusal_in_one_kernel_writes_nothing_for_any(two, checkout):
    """All or nothing per run: a number clash in the second kernel is found before the
    first is written."""
    before = snapshot(checkout)
    two.edit("specs/silu_mul_v2.yaml", "wiring:\n", "wiring:\n  number: {sm_90a: 152, sm_100a: auto}\n")
    run = two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}", "apply=1", "-k", check=False)
    assert run.returncode != 0
    assert "152" in run.stderr and "Nothing was written" in run.stderr
    assert "wire (rmsnorm_v2, silu_mul_v2): " in run.stderr and "for any kernel of this run" in run.stderr
    assert snapshot(checkout) == before


def test_a_read_only_file_during_unwire_changes_nothing(two, checkout):
    two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}", "apply=1")
    wired = snapshot(checkout)
    body = checkout / "include/mirage/persistent_kernel/tasks/hopper/mpkbuild_silu_mul_v2.cuh"
    body.chmod(0o444)
    try:
        run = two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}", "apply=1", "unwire=1",
                        check=False)
    finally:
        body.chmod(0o644)
    assert run.returncode != 0 and "silu_mul_v2.cuh" in run.stderr
    assert snapshot(checkout) == wired


def test_a_clash_after_wiring_fails_unless_renumber_is_asked(two, checkout):
    two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}", "apply=1")
    n = wire_json(two, "rmsnorm_v2")["numbers"]["sm_90a"]
    header = checkout / "include/mirage/persistent_kernel/runtime_header.h"
    header.write_text(header.read_text().replace("  TASK_HOPPER_TASK_END", f"  TASK_OWNERS_OWN = {n},\n  TASK_HOPPER_TASK_END", 1))
    owned = snapshot(checkout)
    run = two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}", "apply=1", check=False)
    assert run.returncode != 0 and "TASK_OWNERS_OWN" in run.stderr and "renumber=1" in run.stderr
    assert snapshot(checkout) == owned
    two.scons("kernel=all", "stage=wire", f"mpk_root={checkout}", "apply=1", "renumber=1")
    assert wire_json(two, "rmsnorm_v2")["numbers"]["sm_90a"] != n


def test_the_checkout_a_build_was_given_is_remembered_for_status_and_forgotten_on_request(project, checkout):
    """After `scons stage=wire mpk_root=X`, a plain `scons status` judges the graph that build
    made (it called every wire node stale: "mpk_root=X -> render"); `mpk_root=` forgets."""
    import json
    project.scons("stage=wire", f"mpk_root={checkout}")
    assert f"mpk_root = '{checkout}'" in (project.root / "build" / "options.py").read_text()
    run = project.scons("status", "--json", "stage=wire")
    nodes = {n["label"]: n for n in json.loads(run.stdout)["nodes"]}
    assert "remembered in build/options.py" in run.stderr
    assert not any("render" in r for r in nodes[f"wire {K}"]["reasons"]), nodes[f"wire {K}"]
    forgot = project.scons("stage=wire", "mpk_root=")
    assert "22 fragments rendered" in forgot.stdout or "fragments rendered" in forgot.stdout
    assert "mpk_root" not in (project.root / "build" / "options.py").read_text().split("\n", 2)[-1]
