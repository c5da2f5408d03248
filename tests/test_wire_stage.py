"""The wire stage through scons: build/ only by default, apply/unwire on a checkout copy."""
import shutil
from pathlib import Path

import pytest

K = "rmsnorm_v2"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mpk_tree"


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
