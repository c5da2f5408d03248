"""Bad input to the wire stage: each is a clear WireError naming the file and what to fix,
and nothing in the checkout changes."""
from __future__ import annotations

import shutil

import pytest

from mpkbuild import wire
from test_wire_helpers import coherence, FIXTURE, WIRING, fresh_tree, rmsnorm_spec, silu_spec, snapshot

HEADER = "include/mirage/persistent_kernel/tasks/hopper/task_header.cuh"


@pytest.fixture
def tree(tmp_path):
    return fresh_tree(tmp_path)


def plan_rms(root):
    return wire.plan(root, [rmsnorm_spec()], WIRING, ["rmsnorm_v2"])


def test_missing_anchor_names_file_and_anchor(tree):
    p = tree / HEADER
    p.write_text(p.read_text().replace("// Hopper task impls\n", ""))
    with pytest.raises(wire.AnchorNotFound) as err:
        plan_rms(tree)
    assert HEADER in str(err.value) and "Hopper task impls" in str(err.value)
    g = tree / "src" / "kernel" / "graph.cc"
    shutil.copy(FIXTURE / HEADER, p)                 # anchor back; break graph.cc's instead
    g.write_text(g.read_text().replace("  else {\n", "  else{ // fallback\n"))
    with pytest.raises(wire.AnchorNotFound, match=r"src/kernel/graph.cc: site graph_branch is not supported on this checkout"):
        plan_rms(tree)


def test_missing_range_placeholder(tree):
    h = tree / "include" / "mirage" / "persistent_kernel" / "runtime_header.h"
    h.write_text(h.read_text().replace("  TASK_SM100_TASK_END = 298, // SM100 range closes (placeholder)\n", ""))
    with pytest.raises(wire.AnchorNotFound, match="TASK_SM100_TASK_END"):
        plan_rms(tree)


def test_missing_target_file(tree):
    (tree / "include" / "mirage" / "persistent_kernel" / "tma.cuh").unlink()
    with pytest.raises(wire.TargetMissing, match=r"include/mirage/persistent_kernel/tma.cuh: file missing"):
        plan_rms(tree)


def test_not_a_checkout(tmp_path):
    with pytest.raises(wire.NotACheckout, match="not a folder"):
        plan_rms(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(wire.NotACheckout, match="runtime_header.h"):
        plan_rms(tmp_path / "empty")
    with pytest.raises(wire.NotACheckout):
        wire.unwire(tmp_path / "empty", ["rmsnorm_v2"], WIRING)
    with pytest.raises(wire.NotACheckout):
        coherence(tmp_path / "empty")


@pytest.mark.parametrize("which", [">>>", "<<<"])
def test_half_deleted_block_is_refused(tree, which):
    wire.apply(plan_rms(tree))
    rt = tree / "src" / "kernel" / "runtime.cc"
    lines = rt.read_text().splitlines(keepends=True)
    lines = [ln for ln in lines if not (which in ln and "rmsnorm_v2/sm_90a/name_map" in ln)]
    rt.write_text("".join(lines))
    before = snapshot(tree)
    with pytest.raises(wire.MarkerError, match=r"src/kernel/runtime.cc:\d+: .*rmsnorm_v2/sm_90a/name_map"):
        plan_rms(tree)
    with pytest.raises(wire.MarkerError):
        wire.unwire(tree, ["rmsnorm_v2"], WIRING)
    assert snapshot(tree) == before


@pytest.mark.parametrize("field,value,path", [
    ("task_name", {"sm_90a": "rms-norm"}, "wiring.task_name.sm_90a"),
    ("task_name", {"sm_90a": "9rms"}, "wiring.task_name.sm_90a"),
    ("task_type", {"sm_100a": "task_lower"}, "wiring.task_type.sm_100a"),
    ("layer", "rms norm", "wiring.layer"),
    ("layer", "lambda", "wiring.layer"),
])
def test_names_must_be_identifiers(tree, field, value, path):
    spec = rmsnorm_spec()
    spec["wiring"][field] = value if not isinstance(value, dict) else {**spec["wiring"].get(field, {}), **value}
    problems = wire.check_section(spec)
    assert [p for p, _ in problems] == [path], problems
    with pytest.raises(wire.SectionError, match=path.replace(".", r"\.")):
        plan_rms_spec(tree, spec)


def test_kernel_name_must_be_identifier():
    spec = rmsnorm_spec()
    spec["kernel"] = "rms-norm v2"
    assert ("kernel", "'rms-norm v2' is not a C identifier") in wire.check_section(spec)


def plan_rms_spec(root, spec):
    return wire.plan(root, [spec], WIRING, [spec["kernel"]])


def test_too_many_inputs_or_outputs(tree):
    spec = silu_spec()
    t = spec["codegen"]["inputs"][0]
    spec["codegen"]["inputs"] = [{**t, "name": f"in{i}"} for i in range(8)]
    problems = dict(wire.check_section(spec))
    assert "at most 7" in problems["codegen.inputs"]
    spec = silu_spec()
    o = spec["codegen"]["outputs"][0]
    spec["codegen"]["outputs"] = [{**o, "name": f"out{i}"} for i in range(4)]
    problems = dict(wire.check_section(spec))
    assert "at most 3" in problems["codegen.outputs"]
    with pytest.raises(wire.SectionError, match="at most 3"):
        plan_rms_spec(tree, spec)
    spec = silu_spec()
    spec["codegen"]["inputs"] = [{**t, "name": f"in{i}"} for i in range(7)]
    assert wire.check_section(spec) == []             # 7 is the limit, not over it


def test_nothing_written_on_any_refusal(tree):
    before = snapshot(tree)
    spec = silu_spec()
    spec["wiring"]["number"]["sm_90a"] = 151
    for bad in ([spec], [rmsnorm_spec(), {**rmsnorm_spec()}]):
        with pytest.raises(wire.WireError):
            wire.plan(tree, bad, WIRING, ["silu_mul_v1" if bad[0] is spec else "rmsnorm_v2"])
    assert snapshot(tree) == before
